package pgfence

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

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

// instrumentSet is the tracer and instruments of the writes.
type instrumentSet struct {
	tracer   trace.Tracer
	writes   metric.Int64Counter
	duration metric.Float64Histogram
}

// instruments are made once, from the global providers, which delegate to
// the providers the application sets later.
var instruments = sync.OnceValue(func() instrumentSet {
	m := otel.GetMeterProvider().Meter(instrumentationName)
	report := func(err error) { otel.Handle(err) }
	return instrumentSet{
		tracer: otel.GetTracerProvider().Tracer(instrumentationName),
		writes: telemetry.Counter(m, "pgfence.fence.writes", "{write}",
			"Fenced and lease-checked writes by pgfence.operation and outcome: accepted, stale_token, lease_not_held, token_not_issued, unfenced, unknown, error.", report),
		duration: telemetry.Seconds(m, "pgfence.fence.duration",
			"Duration of fenced and lease-checked writes, by pgfence.operation and outcome.", report),
	}
})

// observe runs body as the write w on h: a span and the metrics around it
// (observation only), then, for a rejection on h's own transaction, its
// audit record in pgfence.fence_rejections ([Rejections]).
func observe[T any](ctx context.Context, h driver.Handle[T], w *aWrite, body func(ctx context.Context) error) (err error) {
	tel := instruments()
	start := time.Now()
	attrs := []attribute.KeyValue{telemetry.DBSystem, telemetry.Operation.String(w.op),
		attribute.String("pgfence.fence.resource", w.resource), attribute.Int64("pgfence.fence.token", w.token)}
	if w.holder != "" {
		attrs = append(attrs, attribute.String("pgfence.lease.holder", w.holder))
	} else {
		attrs = append(attrs, attribute.String("pgfence.fence.op", w.id.String()))
	}
	ctx, span := tel.tracer.Start(ctx, "pgfence.fence."+w.op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	returned := false
	defer func() {
		if !returned {
			err = errors.New("pgfence: fn panicked") // recorded; the panic goes on
		}
		outcome := outcomeOf(err)
		set := metric.WithAttributeSet(attribute.NewSet(telemetry.Operation.String(w.op), telemetry.Outcome.String(outcome)))
		mctx := context.WithoutCancel(ctx)
		tel.writes.Add(mctx, 1, set)
		tel.duration.Record(mctx, time.Since(start).Seconds(), set)
		span.SetAttributes(telemetry.Outcome.String(outcome))
		telemetry.End(span, err)
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
