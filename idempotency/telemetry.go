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

// The operations of a claim (pgfence.operation, and the span name after
// "pgfence.idempotency."); the others are named where they are recorded.
const (
	modeAtomic = "atomic" // Do, DoSQL, Begin
	modeLeased = "leased" // Claim
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

// start records a claim (Do, Begin, Claim) in mode: new, taken_over (a
// leased claim that took the key over), replayed, or as outcomeOf names
// its error.
func (t *instruments) start(ctx context.Context, mode string, req Request) (context.Context, func(*Outcome, error)) {
	ctx, done := t.Start(ctx, mode, attrScope.String(req.Scope), attrKey.String(req.Key))
	return ctx, func(out *Outcome, err error) {
		outcome, err := outcomeOf(err)
		switch {
		case out == nil:
		case out.Replayed:
			outcome = "replayed"
		case out.Attempt != nil && out.Attempt.epoch > 1:
			outcome = "taken_over"
			t.log.InfoContext(ctx, "idempotency: leased key taken over", "scope", req.Scope, "key", req.Key,
				"epoch", out.Attempt.epoch, "recovery_point", out.Attempt.RecoveryPoint())
		default:
			outcome = "new"
		}
		if out != nil && out.Attempt != nil && out.Attempt.epoch > 0 {
			trace.SpanFromContext(ctx).SetAttributes(attrOwner.String(out.Attempt.owner), attrEpoch.Int64(out.Attempt.epoch))
		}
		if outcome == "replayed" || outcome == "in_progress" || outcome == "mismatch" {
			t.log.DebugContext(ctx, "idempotency: duplicate answered", "scope", req.Scope, "key", req.Key,
				"mode", mode, "outcome", outcome)
		}
		done(outcome, err)
	}
}

// owned records op (heartbeat, advance, complete, fail, release) of a
// leased attempt; a replaced owner's late write is the outcome not_owner.
func (t *instruments) owned(ctx context.Context, op string, a *Attempt) (context.Context, func(error)) {
	ctx, done := t.Start(ctx, op, attrScope.String(a.scope), attrKey.String(a.key),
		attrOwner.String(a.owner), attrEpoch.Int64(a.epoch))
	return ctx, func(err error) {
		outcome, _ := outcomeOf(err)
		switch outcome {
		case "ok":
			t.log.DebugContext(ctx, "idempotency: leased key "+op, "scope", a.scope, "key", a.key, "epoch", a.epoch)
		case "not_owner":
			t.log.InfoContext(ctx, "idempotency: late "+op+" by a replaced owner refused", "scope", a.scope, "key", a.key, "epoch", a.epoch)
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
		done(outcomeOf(err))
	}
}

// outcomeOf names the outcome of an operation that returned err: ok,
// in_progress and mismatch (answers, so the error is dropped from the
// span), not_owner, unknown or error.
func outcomeOf(err error) (string, error) {
	switch {
	case err == nil:
		return "ok", nil
	case errors.Is(err, ErrInProgress):
		return "in_progress", nil
	case errors.Is(err, ErrMismatch):
		return "mismatch", nil
	case errors.Is(err, ErrLeaseLost):
		return "not_owner", err
	case errors.Is(err, ErrOutcomeUnknown):
		return "unknown", err
	}
	return "error", err
}
