package pgfence

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/telemetry"
)

// InstrumentationName is the name of this package's OpenTelemetry meter and
// tracer. The package's helpers are functions without a configuration, so
// they use the global providers (otel.GetMeterProvider,
// otel.GetTracerProvider), which are no-ops until the application sets them.
const InstrumentationName = "github.com/pgfence/pgfence/pgfence"

// Operations (the pgfence.operation attribute and the span name suffix).
const (
	opWrite       = "write"
	opExec        = "exec"
	opWriteLeased = "write_leased"
	opExecLeased  = "exec_leased"
	opUpdateRow   = "update_row"
)

// Outcomes (the pgfence.outcome attribute).
const (
	outcomeAccepted     = "accepted"
	outcomeStaleToken   = "stale_token"
	outcomeLeaseNotHeld = "lease_not_held"
	outcomeUnfenced     = "unfenced"
	outcomeUnknown      = "unknown"
	outcomeError        = "error"
)

const (
	attrResource = attribute.Key("pgfence.fence.resource")
	attrToken    = attribute.Key("pgfence.fence.token")
	attrOp       = attribute.Key("pgfence.fence.op")
	attrAccepted = attribute.Key("pgfence.fence.accepted_token")
	attrLeaseKey = attribute.Key("pgfence.lease.key")
	attrHolder   = attribute.Key("pgfence.lease.holder")
	attrLeaseTok = attribute.Key("pgfence.lease.token")
	attrReason   = attribute.Key("pgfence.lease.reason")
)

// spanNames and outcomeSets are built once: every write would otherwise
// concatenate its span name and sort its metric attributes, even with the
// default no-op providers.
var (
	spanNames   = map[string]string{}
	outcomeSets = map[[2]string]attribute.Set{}
)

func init() {
	for _, op := range []string{opWrite, opExec, opWriteLeased, opExecLeased, opUpdateRow} {
		spanNames[op] = "pgfence.fence." + op
		for _, outcome := range []string{outcomeAccepted, outcomeStaleToken, outcomeLeaseNotHeld, outcomeUnfenced, outcomeUnknown, outcomeError} {
			outcomeSets[[2]string{op, outcome}] = attribute.NewSet(telemetry.Operation.String(op), telemetry.Outcome.String(outcome))
		}
	}
}

// instruments are the tracer and instruments of one pair of global providers.
type instruments struct {
	mp       metric.MeterProvider
	tp       trace.TracerProvider
	tracer   trace.Tracer
	writes   metric.Int64Counter
	duration metric.Float64Histogram
}

// current caches the instruments of the global providers they were made
// from; it is rebuilt when the application sets other providers.
var current atomic.Pointer[instruments]

func same(a, b any) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta != nil && ta.Comparable() && a == b
}

func tel() *instruments {
	mp, tp := otel.GetMeterProvider(), otel.GetTracerProvider()
	if t := current.Load(); t != nil && same(t.mp, mp) && same(t.tp, tp) {
		return t
	}
	m := mp.Meter(InstrumentationName)
	report := func(err error) { otel.Handle(err) }
	t := &instruments{
		mp: mp, tp: tp,
		tracer: tp.Tracer(InstrumentationName),
		writes: telemetry.Counter(m, "pgfence.fence.writes", "{write}",
			"Fenced and lease-checked writes by pgfence.operation and outcome: accepted, stale_token, lease_not_held, unfenced, unknown, error.", report),
		duration: telemetry.Seconds(m, "pgfence.fence.duration",
			"Duration of fenced and lease-checked writes, by pgfence.operation and outcome.", report),
	}
	current.Store(t)
	return t
}

// write identifies one fenced or lease-checked write for its span, log
// events and rejection record.
type write struct {
	op       string // opWrite, opExec, …
	resource string // the fence resource or lease key ("" for UpdateRow: the error names it)
	token    int64  // the presented token
	holder   string // the lease holder (lease-checked writes)
	id       OpID   // the write's operation id, once drawn
}

// logAttrs are the attributes of one write's log events.
type logAttrs []any

func (w *write) logAttrs(ctx context.Context) logAttrs {
	a := logAttrs{"pgfence.operation", w.op}
	if w.holder != "" {
		a = append(a, "pgfence.lease.key", w.resource, "pgfence.lease.holder", w.holder, "pgfence.lease.token", w.token)
	} else {
		if w.resource != "" {
			a = append(a, "pgfence.fence.resource", w.resource)
		}
		a = append(a, "pgfence.fence.token", w.token)
	}
	if w.id != (OpID{}) {
		a = append(a, "pgfence.fence.op", w.id.String())
	}
	if id := telemetry.TraceID(ctx); id != "" {
		a = append(a, "trace_id", id)
	}
	return a
}

// startWrite starts the span of one fenced or lease-checked write on db; the
// returned function ends it, records the outcome in the metrics and the log
// (the context's logger, [ContextWithLogger]) and, for a rejection outside a
// caller's transaction, in pgfence.fence_rejections. attrs identify the write
// on the span (resource and token, or lease key, holder and token).
func startWrite(ctx context.Context, db DB, w *write, attrs ...attribute.KeyValue) (context.Context, func(error)) {
	t := tel()
	start := time.Now()
	op := w.op
	ctx, span := t.tracer.Start(ctx, spanNames[op], trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(attrs, telemetry.DBSystem, telemetry.Operation.String(op))...))
	return ctx, func(err error) {
		outcome := outcomeAccepted
		if err != nil {
			outcome = writeOutcome(err, span)
		}
		set := metric.WithAttributeSet(outcomeSets[[2]string{op, outcome}])
		mctx := context.WithoutCancel(ctx)
		t.writes.Add(mctx, 1, set)
		t.duration.Record(mctx, time.Since(start).Seconds(), set)
		span.SetAttributes(telemetry.Outcome.String(outcome))
		// The span is the write: it ends before the rejection is recorded
		// (the record keeps the trace id, which the context still carries).
		telemetry.End(span, err)

		log := loggerFrom(ctx)
		switch outcome {
		case outcomeAccepted:
			// The common case: no attributes are built for a disabled level.
			if log.Enabled(ctx, slog.LevelDebug) {
				log.DebugContext(ctx, "pgfence: write accepted", w.logAttrs(ctx)...)
			}
		case outcomeStaleToken, outcomeLeaseNotHeld, outcomeUnfenced:
			la := append(w.logAttrs(ctx), "pgfence.outcome", outcome)
			r, ok := rejectionOf(err, w)
			if ok {
				la = append(la, "pgfence.fence.accepted_token", r.AcceptedToken)
				if r.LeaseReason != "" {
					la = append(la, "pgfence.lease.reason", r.LeaseReason)
				}
				if w.resource == "" {
					la = append(la, "pgfence.fence.resource", r.Resource)
				}
			}
			log.InfoContext(ctx, "pgfence: write rejected", la...)
			if ok {
				recordRejection(ctx, db, r, la)
			}
		case outcomeUnknown:
			log.WarnContext(ctx, "pgfence: write outcome unknown", append(w.logAttrs(ctx), "error.type", telemetry.ErrorTypeOf(err))...)
		default:
			if log.Enabled(ctx, slog.LevelDebug) {
				log.DebugContext(ctx, "pgfence: write failed", append(w.logAttrs(ctx), "error.type", telemetry.ErrorTypeOf(err))...)
			}
		}
	}
}

// writeOutcome classifies a failed write for its span, metrics and log, and
// adds the rejection event to span. (Apart from the accepted path, so that
// the accepted path allocates no error targets.)
func writeOutcome(err error, span trace.Span) string {
	var (
		stale *StaleTokenError
		lost  *LeaseNotHeldError
	)
	switch {
	case errors.As(err, &stale):
		span.AddEvent("pgfence.rejected", trace.WithAttributes(attrAccepted.Int64(stale.Accepted)))
		return outcomeStaleToken
	case errors.As(err, &lost):
		span.AddEvent("pgfence.rejected", trace.WithAttributes(attrReason.String(lost.Reason), attrLeaseTok.Int64(lost.Current)))
		return outcomeLeaseNotHeld
	case errors.Is(err, ErrStaleToken):
		return outcomeStaleToken
	case errors.Is(err, ErrLeaseNotHeld):
		return outcomeLeaseNotHeld
	case errors.Is(err, ErrUnfencedWrite):
		return outcomeUnfenced
	case errors.Is(err, ErrOutcomeUnknown):
		return outcomeUnknown
	}
	return outcomeError
}

func fenceAttrs(resource string, token int64) []attribute.KeyValue {
	return []attribute.KeyValue{attrResource.String(resource), attrToken.Int64(token)}
}

func leaseAttrs(l Lease) []attribute.KeyValue {
	return []attribute.KeyValue{attrLeaseKey.String(l.Key), attrHolder.String(l.Holder), attrLeaseTok.Int64(l.Token)}
}

// fenceTx presents token for resource in tx. When ctx carries a trace id, it
// is set for the transaction in the same pipeline (pgfence.fences stores it
// with the accepted token), so tracing adds no round trip.
func fenceTx(ctx context.Context, tx pgx.Tx, resource string, token int64, op OpID) error {
	setOpAttr(ctx, op)
	b := &pgx.Batch{}
	if !telemetry.QueueTraceID(ctx, b) {
		_, err := tx.Exec(ctx, sqlFence, resource, token, op)
		return err
	}
	b.Queue(sqlFence, resource, token, op)
	_, err := execBatch(ctx, tx, b)
	return err
}

// queueFence queues the fence of an [Exec] on b, preceded by setting the
// trace id when ctx carries one.
func queueFence(ctx context.Context, b *pgx.Batch, resource string, token int64, op OpID) {
	setOpAttr(ctx, op)
	telemetry.QueueTraceID(ctx, b)
	b.Queue(sqlFence, resource, token, op)
}

// setOpAttr puts the write's operation id on its span, formatting it only for
// a span that records.
func setOpAttr(ctx context.Context, op OpID) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attrOp.String(op.String()))
	}
}
