package idempotency

import (
	"context"
	"errors"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/telemetry"
)

// instrumentationName is the OpenTelemetry scope of this package's spans and
// of its instruments pgfence.idempotency.operations and
// pgfence.idempotency.duration.
const instrumentationName = "github.com/pgfence/pgfence/idempotency"

// Operations (pgfence.operation, and the span name after
// "pgfence.idempotency."), and the outcomes besides those of a claim (new,
// replayed, in_progress, mismatch).
const (
	modeAtomic = "atomic" // Do, DoSQL, Begin
	modeLeased = "leased" // Claim

	outcomeTakenOver = "taken_over" // a leased claim that took the key over
	outcomeUnknown   = "unknown"
	outcomeError     = "error"
	outcomeOK        = "ok"
	outcomeNotOwner  = "not_owner" // a replaced owner's late write
)

var (
	attrScope = attribute.Key("pgfence.idempotency.scope")
	attrKey   = attribute.Key("pgfence.idempotency.key")
	attrOwner = attribute.Key("pgfence.idempotency.owner")
	attrEpoch = attribute.Key("pgfence.idempotency.epoch")
)

// instruments are a Store's recorder and logger.
type instruments struct {
	*telemetry.Recorder
	log *slog.Logger
}

func newInstruments(mp metric.MeterProvider, tp trace.TracerProvider, log *slog.Logger) *instruments {
	return &instruments{telemetry.New(instrumentationName, "pgfence.idempotency", mp, tp), log}
}

// start records a claim (Do, Begin, Claim) in mode.
func (t *instruments) start(ctx context.Context, mode string, req Request) (context.Context, func(*Outcome, error)) {
	ctx, done := t.Start(ctx, mode, attrScope.String(req.Scope), attrKey.String(req.Key))
	return ctx, func(out *Outcome, err error) {
		outcome := outcomeError
		switch {
		case out != nil && out.Replayed:
			outcome = "replayed"
		case out != nil:
			outcome = "new"
		case errors.Is(err, ErrInProgress):
			outcome, err = "in_progress", nil // an answer, not a failed operation
		case errors.Is(err, ErrMismatch):
			outcome, err = "mismatch", nil
		case errors.Is(err, ErrOutcomeUnknown):
			outcome = outcomeUnknown
		}
		if out != nil && out.Attempt != nil && out.Attempt.epoch > 0 {
			a := out.Attempt
			trace.SpanFromContext(ctx).SetAttributes(attrOwner.String(a.owner), attrEpoch.Int64(a.epoch))
			if a.epoch > 1 {
				outcome = outcomeTakenOver
				t.log.InfoContext(ctx, "idempotency: leased key taken over", "scope", req.Scope, "key", req.Key,
					"epoch", a.epoch, "recovery_point", a.RecoveryPoint())
			}
		}
		if outcome != "new" && outcome != outcomeTakenOver && outcome != outcomeError && outcome != outcomeUnknown {
			t.log.DebugContext(ctx, "idempotency: duplicate answered", "scope", req.Scope, "key", req.Key,
				"mode", mode, "outcome", outcome)
		}
		done(outcome, err)
	}
}

// owned records op (heartbeat, advance, complete, fail, release) of a
// leased attempt.
func (t *instruments) owned(ctx context.Context, op string, a *Attempt) (context.Context, func(error)) {
	ctx, done := t.Start(ctx, op, attrScope.String(a.scope), attrKey.String(a.key),
		attrOwner.String(a.owner), attrEpoch.Int64(a.epoch))
	return ctx, func(err error) {
		outcome := outcomeOK
		switch {
		case err == nil:
			t.log.DebugContext(ctx, "idempotency: leased key "+op, "scope", a.scope, "key", a.key, "epoch", a.epoch)
		case errors.Is(err, ErrLeaseLost):
			outcome = outcomeNotOwner
			t.log.InfoContext(ctx, "idempotency: late "+op+" by a replaced owner refused", "scope", a.scope, "key", a.key, "epoch", a.epoch)
		case errors.Is(err, ErrOutcomeUnknown):
			outcome = outcomeUnknown
		default:
			outcome = outcomeError
		}
		done(outcome, err)
	}
}

// recovered records one Store.Recover, and the keys it handled by outcome
// (operation recover_key: resumed, failed, released, skipped).
func (t *instruments) recovered(ctx context.Context) (context.Context, func(*RecoverResult, error)) {
	ctx, done := t.Start(ctx, "recover")
	return ctx, func(res *RecoverResult, err error) {
		for outcome, n := range map[string]int{"resumed": res.Resumed, "failed": res.Failed, "released": res.Released, "skipped": res.Skipped} {
			if n > 0 {
				t.Count(ctx, "recover_key", outcome, int64(n))
			}
		}
		t.log.DebugContext(ctx, "idempotency: recover", "found", res.Found, "resumed", res.Resumed, "failed", res.Failed,
			"released", res.Released, "skipped", res.Skipped, "error", err)
		done(outcomeOf(err), err)
	}
}

// outcomeOf is ok or error.
func outcomeOf(err error) string {
	if err != nil {
		return outcomeError
	}
	return outcomeOK
}
