package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/telemetry"
)

// InstrumentationName is the name of this package's OpenTelemetry meter and
// tracer.
const InstrumentationName = "github.com/pgfence/pgfence/idempotency"

const (
	modeAtomic = "atomic"
	modeLeased = "leased"

	outcomeUnknown  = "unknown"
	outcomeError    = "error"
	outcomeOK       = "ok"
	outcomeNotOwner = "not_owner"

	attrMode  = attribute.Key("pgfence.idempotency.mode")
	attrScope = attribute.Key("pgfence.idempotency.scope")
	attrKey   = attribute.Key("pgfence.idempotency.key")
	attrOwner = attribute.Key("pgfence.idempotency.owner")
	attrEpoch = attribute.Key("pgfence.idempotency.epoch")

	attrGCDeleted = attribute.Key("pgfence.idempotency.gc.deleted")
	attrGCBatches = attribute.Key("pgfence.idempotency.gc.batches")

	attrRecoverFound = attribute.Key("pgfence.idempotency.recover.found")
)

// instruments are a store's tracer and instruments; with the default
// (global, unset) providers they are no-ops.
type instruments struct {
	tracer      trace.Tracer
	log         *slog.Logger
	requests    metric.Int64Counter
	duration    metric.Float64Histogram
	takeovers   metric.Int64Counter
	settlements metric.Int64Counter
	extensions  metric.Int64Counter
	recoveries  metric.Int64Counter
}

func newInstruments(mp metric.MeterProvider, tp trace.TracerProvider, log *slog.Logger) *instruments {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(InstrumentationName)
	report := func(err error) { log.Warn("idempotency: creating an instrument failed", "error", err) }
	return &instruments{
		tracer: tp.Tracer(InstrumentationName),
		log:    log,
		requests: telemetry.Counter(m, "pgfence.idempotency.requests", "{request}",
			"Claims of a key (Do, Claim) by pgfence.idempotency.mode and outcome: new, replayed, in_progress, mismatch, unknown, error.", report),
		duration: telemetry.Seconds(m, "pgfence.idempotency.duration",
			"Duration of Do (the claim, the work and the commit) and Claim, by mode and outcome.", report),
		takeovers: telemetry.Counter(m, "pgfence.idempotency.takeovers", "{takeover}",
			"Leased claims that took a key over from an attempt whose lease expired or that released it.", report),
		settlements: telemetry.Counter(m, "pgfence.idempotency.settlements", "{settlement}",
			"Ends of leased attempts by pgfence.operation (complete, fail, release) and outcome: ok, not_owner (a replaced owner's late write), unknown, error.", report),
		extensions: telemetry.Counter(m, "pgfence.idempotency.lease_extensions", "{extension}",
			"Lease extensions of leased attempts by pgfence.operation (heartbeat, advance) and outcome: ok, not_owner (the key was taken over), unknown, error.", report),
		recoveries: telemetry.Counter(m, "pgfence.idempotency.recoveries", "{key}",
			"Abandoned keys handled by Store.Recover, by outcome: resumed, failed (marked abandoned), released, skipped (taken by somebody else first).", report),
	}
}

// start starts the span of a Do or Claim; the returned function ends it,
// records the outcome and logs duplicates and takeovers.
func (t *instruments) start(ctx context.Context, mode string, req Request) (context.Context, func(*Outcome, error)) {
	begin := time.Now()
	ctx, span := t.tracer.Start(ctx, "pgfence.idempotency."+mode, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(telemetry.DBSystem, attrMode.String(mode), attrScope.String(req.Scope), attrKey.String(req.Key)))
	return ctx, func(out *Outcome, err error) {
		var outcome string
		switch {
		case out != nil:
			outcome = out.Status.String()
		case errors.Is(err, ErrOutcomeUnknown):
			outcome = outcomeUnknown
		default:
			outcome = outcomeError
		}
		mctx := context.WithoutCancel(ctx)
		set := metric.WithAttributeSet(attribute.NewSet(attrMode.String(mode), telemetry.Outcome.String(outcome)))
		t.requests.Add(mctx, 1, set)
		t.duration.Record(mctx, time.Since(begin).Seconds(), set)
		span.SetAttributes(telemetry.Outcome.String(outcome))
		if out != nil && out.Attempt != nil {
			a := out.Attempt
			span.SetAttributes(attrOwner.String(a.owner), attrEpoch.Int64(a.epoch))
			if a.TakenOver() {
				t.takeovers.Add(mctx, 1)
				t.log.InfoContext(ctx, "idempotency: leased key taken over", "scope", req.Scope, "key", req.Key,
					"epoch", a.epoch, "recovery_point", a.RecoveryPoint())
			}
		}
		if out != nil && out.Status != New {
			t.log.DebugContext(ctx, "idempotency: duplicate answered", "scope", req.Scope, "key", req.Key,
				"mode", mode, "outcome", outcome)
			if out.Status == InProgress || out.Status == Mismatch {
				err = nil // an answer, not a failed operation
			}
		}
		telemetry.End(span, err)
	}
}

// settle starts the span of an attempt's Complete, Fail or Release; the
// returned function ends it and counts the outcome.
func (t *instruments) settle(ctx context.Context, op string, a *Attempt) (context.Context, func(error)) {
	return t.owned(ctx, op, a, t.settlements)
}

// extend starts the span of an attempt's Heartbeat or Advance; the returned
// function ends it and counts the outcome.
func (t *instruments) extend(ctx context.Context, op string, a *Attempt) (context.Context, func(error)) {
	return t.owned(ctx, op, a, t.extensions)
}

// owned starts the span of an owner-only call op; the returned function ends
// it, counts the outcome on counter and logs it.
func (t *instruments) owned(ctx context.Context, op string, a *Attempt, counter metric.Int64Counter) (context.Context, func(error)) {
	ctx, span := t.tracer.Start(ctx, "pgfence.idempotency."+op, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(telemetry.DBSystem, attrScope.String(a.scope), attrKey.String(a.key),
			attrOwner.String(a.owner), attrEpoch.Int64(a.epoch)))
	return ctx, func(err error) {
		outcome := outcomeOK
		switch {
		case err == nil:
			t.log.DebugContext(ctx, "idempotency: leased key "+op, "scope", a.scope, "key", a.key, "epoch", a.epoch)
		case errors.Is(err, ErrNotOwner):
			outcome = outcomeNotOwner
			t.log.InfoContext(ctx, "idempotency: late "+op+" by a replaced owner refused", "scope", a.scope, "key", a.key, "epoch", a.epoch)
		case errors.Is(err, ErrOutcomeUnknown):
			outcome = outcomeUnknown
		default:
			outcome = outcomeError
		}
		counter.Add(context.WithoutCancel(ctx), 1, metric.WithAttributeSet(attribute.NewSet(
			telemetry.Operation.String(op), telemetry.Outcome.String(outcome))))
		span.SetAttributes(telemetry.Outcome.String(outcome))
		telemetry.End(span, err)
	}
}

// recoverSpan starts the span of a Store.Recover call; the returned
// function ends it, counts the keys by outcome and logs the run.
func (t *instruments) recoverSpan(ctx context.Context) (context.Context, func(*RecoverResult, error)) {
	ctx, span := t.tracer.Start(ctx, "pgfence.idempotency.recover", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(telemetry.DBSystem))
	return ctx, func(res *RecoverResult, err error) {
		mctx := context.WithoutCancel(ctx)
		for outcome, n := range map[string]int{"resumed": res.Resumed, "failed": res.Failed, "released": res.Released, "skipped": res.Skipped} {
			if n > 0 {
				t.recoveries.Add(mctx, int64(n), metric.WithAttributeSet(attribute.NewSet(telemetry.Outcome.String(outcome))))
			}
		}
		span.SetAttributes(attrRecoverFound.Int(res.Found))
		attrs := []any{"found", res.Found, "resumed", res.Resumed, "failed", res.Failed, "released", res.Released, "skipped", res.Skipped}
		if err != nil {
			attrs = append(attrs, "error.type", telemetry.ErrorTypeOf(err))
		}
		t.log.DebugContext(ctx, "idempotency: recover", attrs...)
		telemetry.End(span, err)
	}
}

// gcTelemetry is GC's tracer, counter and logger, from its options.
type gcTelemetry struct {
	tracer  trace.Tracer
	deleted metric.Int64Counter
	log     *slog.Logger
}

func newGCTelemetry(o *GCOptions) gcTelemetry {
	mp, tp, log := o.MeterProvider, o.TracerProvider, o.Logger
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	report := func(err error) { log.Warn("idempotency: creating an instrument failed", "error", err) }
	return gcTelemetry{
		tracer: tp.Tracer(InstrumentationName),
		deleted: telemetry.Counter(mp.Meter(InstrumentationName), "pgfence.idempotency.gc.deleted", "{key}",
			"Expired completed keys deleted by GC.", report),
		log: log,
	}
}

// start starts GC's span; the returned function ends it, counts the deleted
// keys and logs the run.
func (g gcTelemetry) start(ctx context.Context) (context.Context, func(*GCResult, error)) {
	ctx, span := g.tracer.Start(ctx, "pgfence.idempotency.gc", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(telemetry.DBSystem))
	return ctx, func(res *GCResult, err error) {
		g.deleted.Add(context.WithoutCancel(ctx), res.Deleted)
		span.SetAttributes(attrGCDeleted.Int64(res.Deleted), attrGCBatches.Int(res.Batches))
		attrs := []any{"deleted", res.Deleted, "batches", res.Batches}
		if err != nil {
			attrs = append(attrs, "error.type", telemetry.ErrorTypeOf(err))
		}
		g.log.DebugContext(ctx, "idempotency: gc", attrs...)
		telemetry.End(span, err)
	}
}
