package leases

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/telemetry"
	"github.com/pgfence/pgfence/pgfence"
)

// instrumentationName is the OpenTelemetry scope of this package's spans and
// of its instruments pgfence.lease.operations and pgfence.lease.duration.
const instrumentationName = "github.com/pgfence/pgfence/leases"

// Span attributes; metrics carry only pgfence.operation and pgfence.outcome.
const (
	attrKey    = attribute.Key("pgfence.lease.key")
	attrHolder = attribute.Key("pgfence.lease.holder")
	attrToken  = attribute.Key("pgfence.lease.token")
)

// Outcomes (pgfence.outcome), besides the statuses of pgfence.release
// (released, expired, already_released, not_held).
const (
	outcomeAcquired    = "acquired"
	outcomeTakenOver   = "taken_over" // a grant that replaced one which expired unreleased
	outcomeHeld        = "held"
	outcomeSkipped     = "skipped" // an attempt not sent: another waiter's grant was announced
	outcomeTimeout     = "timeout"
	outcomeUnavailable = "unavailable"
	outcomeUnknown     = "unknown"
	outcomeError       = "error"
	outcomeRenewed     = "renewed"
	outcomeLost        = "lost"
	outcomeReleased    = "released"
	outcomeMaxHold     = "max_hold"
	outcomeCanceled    = "canceled" // a keep-alive stopped by Close; the lease stays held until it expires
	outcomeFailures    = "failures" // a keep-alive that gave up after MaxFailures failed renewals
)

// instruments are a client's recorder and logger. The operations
// (pgfence.operation) are acquire, renew and release (each with a span),
// attempt (one per grant statement, or skipped), hold (how long a lease was
// held, by how it ended), trust_left (the trust window left when a renewal
// was sent, by its outcome) and keepalive (why a keep-alive stopped).
type instruments struct {
	*telemetry.Recorder
	log *slog.Logger
}

func newTelemetry(cfg *Config) *instruments {
	return &instruments{telemetry.New(instrumentationName, "pgfence.lease", cfg.MeterProvider, cfg.TracerProvider), cfg.Logger}
}

// outcomeOf names the outcome of an operation that failed with err.
func outcomeOf(err error) string {
	switch {
	case errors.Is(err, pgfence.ErrOutcomeUnknown):
		return outcomeUnknown
	case errors.Is(err, pgfence.ErrUnavailable):
		return outcomeUnavailable
	}
	return outcomeError
}

// endOutcome names how a lease ended with cause: released, max_hold or lost.
func endOutcome(cause error) string {
	switch {
	case errors.Is(cause, ErrReleased):
		return outcomeReleased
	case errors.Is(cause, ErrMaxHold):
		return outcomeMaxHold
	}
	return outcomeLost
}

func leaseAttrs(l *Lease) []attribute.KeyValue {
	return []attribute.KeyValue{attrKey.String(l.key), attrHolder.String(l.holder), attrToken.Int64(l.token)}
}

// startAcquire starts the span of an Acquire (wait) or TryAcquire call; the
// returned function ends it and records the call's duration, waiting
// included.
func (t *instruments) startAcquire(ctx context.Context, key string, ttl time.Duration, wait bool) (context.Context, func(*Lease, error)) {
	ctx, done := t.Start(ctx, "acquire", attrKey.String(key),
		attribute.Float64("pgfence.lease.ttl", ttl.Seconds()), attribute.Bool("pgfence.lease.wait", wait))
	return ctx, func(l *Lease, err error) {
		outcome := outcomeAcquired
		switch {
		case err == nil:
			trace.SpanFromContext(ctx).SetAttributes(attrHolder.String(l.holder), attrToken.Int64(l.token))
		case wait && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
			outcome = outcomeTimeout
		case errors.Is(err, pgfence.ErrLeaseHeld):
			outcome = outcomeHeld
			if !wait {
				err = nil // a refused TryAcquire is an answer, not a failed operation
			}
		default:
			outcome = outcomeOf(err)
		}
		done(outcome, err)
	}
}

// attempted counts one grant attempt: err is the database's, takenOver says
// that the grant replaced one which expired unreleased.
func (t *instruments) attempted(ctx context.Context, err error, acquired, takenOver bool) {
	outcome := outcomeHeld
	switch {
	case err != nil:
		outcome = outcomeOf(classify(err))
	case takenOver:
		outcome = outcomeTakenOver
	case acquired:
		outcome = outcomeAcquired
	}
	t.attempt(ctx, outcome)
}

// attempt counts a grant attempt (or one skipped) by its outcome, as an event
// of the Acquire or TryAcquire span too.
func (t *instruments) attempt(ctx context.Context, outcome string) {
	t.Count(ctx, "attempt", outcome, 1)
	trace.SpanFromContext(ctx).AddEvent("attempt", trace.WithAttributes(telemetry.Outcome.String(outcome)))
}

// startRenew starts the span of a renewal of l; the returned function ends
// it, counts the outcome and records the trust window that was left.
func (t *instruments) startRenew(ctx context.Context, l *Lease) (context.Context, func(error)) {
	ctx, done := t.Start(ctx, "renew", leaseAttrs(l)...)
	left, held := l.c.until(l.trustDeadline()), l.Err() == nil
	return ctx, func(err error) {
		outcome := outcomeRenewed
		switch {
		case err == nil:
		case !held || errors.Is(err, pgfence.ErrLeaseLost) || errors.Is(err, ErrReleased) || errors.Is(err, ErrMaxHold):
			outcome = outcomeLost
		default:
			outcome = outcomeOf(err)
		}
		if held {
			t.Record(ctx, "trust_left", outcome, max(0, left))
		}
		done(outcome, err)
	}
}

// startRelease starts the span of a release of l; the returned function ends
// it and counts the outcome: the database's status, or the error's.
func (t *instruments) startRelease(ctx context.Context, l *Lease) (context.Context, func(status string, err error)) {
	ctx, done := t.Start(ctx, "release", leaseAttrs(l)...)
	return ctx, func(status string, err error) {
		switch {
		case status == "":
			status = outcomeOf(err)
		case errors.Is(err, pgfence.ErrLeaseLost):
			err = nil // the release answered; the lost lease is the outcome
		}
		done(status, err)
	}
}

// ended records how long l was held; cause is why it ended.
func (t *instruments) ended(l *Lease, cause error) {
	t.Record(context.Background(), "hold", endOutcome(cause), l.c.since(l.start))
}

// keepAliveStopped counts and logs why a keep-alive stopped (the lease's
// own end is logged by its event).
func (t *instruments) keepAliveStopped(l *Lease, reason string, err error) {
	t.Count(context.Background(), "keepalive", reason, 1)
	attrs := []slog.Attr{slog.String("key", l.key), slog.String("holder", l.holder), slog.Int64("token", l.token),
		slog.String("reason", reason)}
	if err != nil {
		attrs = append(attrs, slog.String("error.type", telemetry.ErrorTypeOf(err)))
	}
	t.log.LogAttrs(context.Background(), slog.LevelDebug, "pgfence lease keep-alive stopped", attrs...)
}

// eventKind names a lease transition or a client state change, logged to
// [Config.Logger].
type eventKind string

const (
	eventAcquired      eventKind = "acquired"       // a grant committed
	eventRenewed       eventKind = "renewed"        // a renewal committed
	eventRenewFailed   eventKind = "renew_failed"   // a renewal failed without losing the lease (yet)
	eventReleased      eventKind = "released"       // the holder released the lease (or found it already ended)
	eventLost          eventKind = "lost"           // the lease's context ended without a release; Err says why
	eventForceReleased eventKind = "force_released" // [Client.ForceRelease] ended a grant
	eventListenerUp    eventKind = "listener_up"    // the LISTEN connection is (re)connected
	eventListenerDown  eventKind = "listener_down"  // the LISTEN connection failed; waiters poll meanwhile
)

// event describes one transition: Key, Holder and Token name the grant
// (none for listener events), Err is the cause for lost, renew_failed and
// listener_down.
type event struct {
	Kind   eventKind
	Key    string
	Holder string
	Token  int64
	Err    error
}

func (c *Client) emit(e event) {
	level := slog.LevelDebug
	switch e.Kind {
	case eventLost, eventListenerDown:
		level = slog.LevelWarn
	case eventRenewFailed, eventForceReleased:
		level = slog.LevelInfo
	}
	if c.cfg.Logger.Enabled(context.Background(), level) {
		attrs := []slog.Attr{slog.String("event", string(e.Kind))}
		if e.Key != "" {
			attrs = append(attrs, slog.String("key", e.Key), slog.String("holder", e.Holder), slog.Int64("token", e.Token))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.Any("err", e.Err))
		}
		c.cfg.Logger.LogAttrs(context.Background(), level, "pgfence lease "+string(e.Kind), attrs...)
	}
	if c.onEvent != nil { // tests only
		c.onEvent(e)
	}
}
