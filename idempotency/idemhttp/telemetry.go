package idemhttp

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/telemetry"
)

// InstrumentationName is the name of this package's OpenTelemetry meter and
// tracer.
const InstrumentationName = "github.com/pgfence/pgfence/idempotency/idemhttp"

const (
	attrOutcome = attribute.Key("pgfence.idempotency.http.outcome")
	attrMode    = attribute.Key("pgfence.idempotency.mode")
	attrStatus  = attribute.Key("http.response.status_code")
)

// instruments are the middleware's tracer, counter and logger; with the
// default (global, unset) providers they are no-ops.
type instruments struct {
	tracer   trace.Tracer
	log      *slog.Logger
	requests metric.Int64Counter
}

func newInstruments(mp metric.MeterProvider, tp trace.TracerProvider, log *slog.Logger) *instruments {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	report := func(err error) { log.Warn("idempotency: creating an instrument failed", "error", err) }
	return &instruments{
		tracer: tp.Tracer(InstrumentationName),
		log:    log,
		requests: telemetry.Counter(mp.Meter(InstrumentationName), "pgfence.idempotency.http.requests", "{request}",
			"Requests of a covered method through the HTTP middleware, by outcome: executed, replayed, in_progress, mismatch, "+
				"unprotected, bad_key, bad_body, unauthenticated, unavailable, unknown, error, panicked.", report),
	}
}

// start starts the span of a covered request; its result starts as
// "panicked", which stays if the handler panics.
func (t *instruments) start(ctx context.Context, mode Mode) (context.Context, *result) {
	res := &result{outcome: outcomePanicked, request: trace.SpanFromContext(ctx)}
	ctx, _ = t.tracer.Start(ctx, "pgfence.idempotency.http", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrMode.String(mode.String())))
	return ctx, res
}

// end counts and logs the outcome of one covered request, sets it on the
// request's span and on the middleware's own, and ends the latter.
func (t *instruments) end(ctx context.Context, res *result) {
	t.requests.Add(context.WithoutCancel(ctx), 1, metric.WithAttributeSet(attribute.NewSet(telemetry.Outcome.String(res.outcome))))
	if res.request.IsRecording() {
		res.request.SetAttributes(attrOutcome.String(res.outcome))
	}
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attrOutcome.String(res.outcome))
	if res.status != 0 {
		span.SetAttributes(attrStatus.Int(res.status))
	}
	span.End()
	attrs := []any{"outcome", res.outcome}
	if res.key != "" {
		attrs = append(attrs, "key", res.key)
	}
	if res.status != 0 {
		attrs = append(attrs, "status", res.status)
	}
	t.log.DebugContext(ctx, "idempotency: http request", attrs...)
}
