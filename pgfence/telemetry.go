package pgfence

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/internal/telemetry"
)

// instrumentationName names this package's OpenTelemetry meter and tracer.
// The writes report to the global providers (otel.SetMeterProvider,
// otel.SetTracerProvider), which are no-ops until the application sets them.
const instrumentationName = "github.com/pgfence/pgfence/pgfence"

// Operations (the pgfence.operation attribute and the span name suffix; a
// lease-checked write adds "_leased").
const (
	opWrite = "write"
	opExec  = "exec"
)

// Outcomes (the pgfence.outcome attribute).
const (
	outcomeAccepted     = "accepted"
	outcomeStaleToken   = "stale_token"
	outcomeLeaseNotHeld = "lease_not_held"
	outcomeNotIssued    = "token_not_issued"
	outcomeUnfenced     = "unfenced"
	outcomeUnknown      = "unknown"
	outcomeError        = "error"
)

// recorder is made once, from the global providers, which delegate to the
// providers the application sets later.
var recorder = sync.OnceValue(func() *telemetry.Recorder {
	return telemetry.New(instrumentationName, "pgfence.fence", nil, nil)
})

// observe runs body as the write w on h: a span and the metrics around it
// (observation only), then, for a rejection on h's own transaction, its
// audit record in pgfence.fence_rejections ([Rejections]).
func observe[T any](ctx context.Context, h driver.Handle[T], w *aWrite, body func(ctx context.Context) error) (err error) {
	attrs := []attribute.KeyValue{attribute.String("pgfence.fence.resource", w.resource), attribute.Int64("pgfence.fence.token", w.token)}
	if w.holder != "" {
		attrs = append(attrs, attribute.String("pgfence.lease.holder", w.holder))
	} else {
		attrs = append(attrs, attribute.String("pgfence.fence.op", w.id.String()))
	}
	ctx, end := recorder().Start(ctx, w.op, attrs...)
	returned := false
	defer func() {
		if !returned {
			err = errors.New("pgfence: fn panicked") // recorded; the panic goes on
		}
		end(outcomeOf(err), err)
		if r, ok := rejectionOf(err, w); ok && returned {
			record(ctx, h, r)
		}
	}()
	err = body(ctx)
	returned = true
	return err
}

// outcomeOf names a write's outcome for its span and metrics.
func outcomeOf(err error) string {
	switch {
	case err == nil:
		return outcomeAccepted
	case errors.Is(err, ErrStaleToken):
		return outcomeStaleToken
	case errors.Is(err, ErrLeaseLost):
		return outcomeLeaseNotHeld
	case errors.Is(err, ErrTokenNotIssued):
		return outcomeNotIssued
	case errors.Is(err, ErrUnfencedWrite):
		return outcomeUnfenced
	case errors.Is(err, ErrOutcomeUnknown):
		return outcomeUnknown
	}
	return outcomeError
}
