package leases

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
	"github.com/pgfence/pgfence/pgfence"
)

// InstrumentationName is the name of this package's OpenTelemetry meter and
// tracer.
const InstrumentationName = "github.com/pgfence/pgfence/leases"

// Span and attribute names.
const (
	spanAcquire = "pgfence.lease.acquire"
	spanRenew   = "pgfence.lease.renew"
	spanRelease = "pgfence.lease.release"

	attrKey    = attribute.Key("pgfence.lease.key")
	attrHolder = attribute.Key("pgfence.lease.holder")
	attrToken  = attribute.Key("pgfence.lease.token")
	attrWait   = attribute.Key("pgfence.lease.wait")
	attrTTL    = attribute.Key("pgfence.lease.ttl")
)

// Outcomes (the pgfence.outcome attribute).
const (
	outcomeAcquired        = "acquired"
	outcomeHeld            = "held"
	outcomeTimeout         = "timeout"
	outcomeUnavailable     = "unavailable"
	outcomeUnknown         = "unknown"
	outcomeError           = "error"
	outcomeRenewed         = "renewed"
	outcomeLost            = "lost"
	outcomeFailed          = "failed"
	outcomeReleased        = "released"
	outcomeMaxHold         = "max_hold"
	outcomeExpired         = "expired"
	outcomeAlreadyReleased = "already_released"
	outcomeNotHeld         = "not_held"

	// Why a keep-alive stopped (besides released, max_hold and lost).
	stopCanceled = "canceled" // the client was closed; the lease stays held until it expires
	stopFailures = "failures" // MaxFailures renewals in a row failed
)

// instruments holds a client's tracer and instruments. With the default
// (global, unset) providers everything is a no-op.
type instruments struct {
	tracer trace.Tracer

	attempts        metric.Int64Counter
	skipped         metric.Int64Counter
	takeovers       metric.Int64Counter
	renewals        metric.Int64Counter
	releases        metric.Int64Counter
	unknown         metric.Int64Counter
	acquireDuration metric.Float64Histogram
	holdDuration    metric.Float64Histogram
	renewRemaining  metric.Float64Histogram
	keepAliveStops  metric.Int64Counter
	log             *slog.Logger
}

func newTelemetry(cfg *Config) *instruments {
	mp, tp := cfg.MeterProvider, cfg.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(InstrumentationName)
	report := func(err error) { cfg.Logger.Warn("pgfence lease: creating an instrument failed", "err", err) }
	return &instruments{
		tracer: tp.Tracer(InstrumentationName),
		attempts: telemetry.Counter(m, "pgfence.lease.acquire.attempts", "{attempt}",
			"Grant attempts (one statement each), by outcome: acquired, held, unavailable, unknown, error.", report),
		skipped: telemetry.Counter(m, "pgfence.lease.acquire.skipped", "{attempt}",
			"Attempts a waiting Acquire skipped after a release or a holder's expiry because another waiter's grant was announced meanwhile (no statement sent; grants are announced by clients with Config.AnnounceGrants).", report),
		takeovers: telemetry.Counter(m, "pgfence.lease.takeovers", "{takeover}",
			"Grants that replaced a grant which expired without a release.", report),
		renewals: telemetry.Counter(m, "pgfence.lease.renewals", "{renewal}",
			"Renewals by outcome: renewed, lost (refused by the database), failed (unavailable or unknown; the lease is kept).", report),
		releases: telemetry.Counter(m, "pgfence.lease.releases", "{release}",
			"Releases by outcome: released, expired, already_released, not_held (a release by a holder that no longer held the key), error.", report),
		unknown: telemetry.Counter(m, "pgfence.lease.unknown_outcomes", "{operation}",
			"Operations that returned pgfence.ErrOutcomeUnknown, by pgfence.operation: acquire, renew, release.", report),
		acquireDuration: telemetry.Seconds(m, "pgfence.lease.acquire.duration",
			"Time from an Acquire or TryAcquire call to its return, waiting included, by outcome.", report),
		holdDuration: telemetry.Seconds(m, "pgfence.lease.hold.duration",
			"Time a lease was held, from sending the grant to its end, by outcome: released, lost, max_hold.", report),
		renewRemaining: telemetry.Seconds(m, "pgfence.lease.renewal.remaining",
			"Time left in the lease's local trust window when a renewal was sent: near zero means renewals are late.", report),
		keepAliveStops: telemetry.Counter(m, "pgfence.lease.keepalive.stops", "{stop}",
			"Keep-alives that stopped, by outcome: canceled (the client was closed), released, lost, max_hold, failures (MaxFailures renewals in a row failed).", report),
		log: cfg.Logger,
	}
}

func outcomeAttr(outcome string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(telemetry.Outcome.String(outcome)))
}

// startAcquire starts the span of an Acquire (wait) or TryAcquire call; the
// returned function ends it and records the call's duration.
func (t *instruments) startAcquire(ctx context.Context, key string, ttl time.Duration, wait bool) (context.Context, func(*Lease, error)) {
	start := time.Now()
	ctx, span := t.tracer.Start(ctx, spanAcquire, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(telemetry.DBSystem, attrKey.String(key), attrTTL.Float64(ttl.Seconds()), attrWait.Bool(wait)))
	return ctx, func(l *Lease, err error) {
		outcome := outcomeAcquired
		switch {
		case err == nil:
			span.SetAttributes(attrHolder.String(l.holder), attrToken.Int64(l.token))
		case wait && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
			outcome = outcomeTimeout
		case errors.Is(err, pgfence.ErrLeaseHeld):
			outcome = outcomeHeld
		case errors.Is(err, pgfence.ErrOutcomeUnknown):
			outcome = outcomeUnknown
			t.unknown.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(telemetry.Operation.String("acquire")))
		case errors.Is(err, pgfence.ErrUnavailable):
			outcome = outcomeUnavailable
		default:
			outcome = outcomeError
		}
		span.SetAttributes(telemetry.Outcome.String(outcome))
		t.acquireDuration.Record(context.WithoutCancel(ctx), time.Since(start).Seconds(), outcomeAttr(outcome))
		if outcome == outcomeHeld && !wait {
			err = nil // a refused TryAcquire is an answer, not a failed operation
		}
		telemetry.End(span, err)
	}
}

// attempted counts one grant attempt by its outcome (and a takeover), and
// adds it to the span of the Acquire or TryAcquire call.
func (t *instruments) attempted(ctx context.Context, err error, acquired, takenOver bool) {
	outcome := outcomeAcquired
	switch classified := classify(err); {
	case err == nil && !acquired:
		outcome = outcomeHeld
	case err == nil:
	case errors.Is(classified, pgfence.ErrOutcomeUnknown):
		outcome = outcomeUnknown
	case errors.Is(classified, pgfence.ErrUnavailable):
		outcome = outcomeUnavailable
	default:
		outcome = outcomeError
	}
	mctx := context.WithoutCancel(ctx)
	t.attempts.Add(mctx, 1, outcomeAttr(outcome))
	if takenOver {
		t.takeovers.Add(mctx, 1)
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("attempt", trace.WithAttributes(telemetry.Outcome.String(outcome), attribute.Bool("pgfence.lease.taken_over", takenOver)))
	}
}

// skippedAttempt records an attempt a woken waiter did not send because
// another waiter's grant of the key was announced during its hold-back.
func (t *instruments) skippedAttempt(ctx context.Context) {
	t.skipped.Add(context.WithoutCancel(ctx), 1)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("attempt_skipped")
	}
}

// startRenew starts the span of a renewal and records the time left in the
// trust window; the returned function ends the span and counts the outcome.
func (t *instruments) startRenew(ctx context.Context, l *Lease) (context.Context, func(error)) {
	ctx, span := t.tracer.Start(ctx, spanRenew, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(telemetry.DBSystem, attrKey.String(l.key), attrHolder.String(l.holder), attrToken.Int64(l.token)))
	held := l.Err() == nil
	if held {
		remaining := max(0, l.c.until(l.trustDeadline()))
		t.renewRemaining.Record(context.WithoutCancel(ctx), remaining.Seconds())
		span.SetAttributes(attribute.Float64("pgfence.lease.remaining", remaining.Seconds()))
	}
	return ctx, func(err error) {
		outcome := outcomeRenewed
		switch {
		case err == nil:
		case errors.Is(err, pgfence.ErrLeaseLost) || errors.Is(err, ErrReleased) || errors.Is(err, ErrMaxHold) || !held:
			outcome = outcomeLost
		default:
			outcome = outcomeFailed
			if errors.Is(err, pgfence.ErrOutcomeUnknown) {
				t.unknown.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(telemetry.Operation.String("renew")))
			}
		}
		t.renewals.Add(context.WithoutCancel(ctx), 1, outcomeAttr(outcome))
		span.SetAttributes(telemetry.Outcome.String(outcome))
		telemetry.End(span, err)
	}
}

// startRelease starts the span of a release; the returned function ends it
// and counts the outcome (the database's status, or the error).
func (t *instruments) startRelease(ctx context.Context, l *Lease) (context.Context, func(status string, err error)) {
	ctx, span := t.tracer.Start(ctx, spanRelease, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(telemetry.DBSystem, attrKey.String(l.key), attrHolder.String(l.holder), attrToken.Int64(l.token)))
	return ctx, func(status string, err error) {
		outcome := status
		switch {
		case status == outcomeReleased || status == outcomeExpired || status == outcomeAlreadyReleased || status == outcomeNotHeld:
			if errors.Is(err, pgfence.ErrLeaseLost) {
				err = nil // the release answered; the lost lease is recorded as the outcome
			}
		case errors.Is(err, pgfence.ErrOutcomeUnknown):
			outcome = outcomeUnknown
			t.unknown.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(telemetry.Operation.String("release")))
		default:
			outcome = outcomeError
		}
		t.releases.Add(context.WithoutCancel(ctx), 1, outcomeAttr(outcome))
		span.SetAttributes(telemetry.Outcome.String(outcome))
		telemetry.End(span, err)
	}
}

// ended records how long l was held; cause is why it ended.
func (t *instruments) ended(l *Lease, cause error) {
	outcome := outcomeLost
	switch {
	case errors.Is(cause, ErrReleased):
		outcome = outcomeReleased
	case errors.Is(cause, ErrMaxHold):
		outcome = outcomeMaxHold
	}
	t.holdDuration.Record(context.Background(), l.c.since(l.start).Seconds(), outcomeAttr(outcome))
}

// stopEnded is why a keep-alive stopped when the lease ended under it.
func stopEnded(cause error) string {
	if errors.Is(cause, ErrMaxHold) {
		return outcomeMaxHold
	}
	return outcomeLost
}

// keepAliveStopped counts and logs the end of a keep-alive. The lease's
// own end (lost, max hold) is logged by its event; this says why the loop
// stopped.
func (t *instruments) keepAliveStopped(l *Lease, reason string, err error) {
	t.keepAliveStops.Add(context.Background(), 1, outcomeAttr(reason))
	attrs := []slog.Attr{slog.String("key", l.key), slog.String("holder", l.holder), slog.Int64("token", l.token),
		slog.String("reason", reason)}
	if err != nil {
		attrs = append(attrs, slog.String("error.type", telemetry.ErrorTypeOf(err)))
	}
	t.log.LogAttrs(context.Background(), slog.LevelDebug, "pgfence lease keep-alive stopped", attrs...)
}
