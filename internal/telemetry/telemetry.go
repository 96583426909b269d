// Package telemetry is what the pgfence packages share for OpenTelemetry: a
// [Recorder] per package that gives every operation a span, a count and a
// duration by operation and outcome, and the trace id of a context (package
// driver stores it beside the rows pgfence writes). It only observes.
package telemetry

import (
	"context"
	"errors"
	"reflect"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// Attribute keys. Metric attributes are low-cardinality only (operation,
// outcome); keys, holders and tokens go on spans.
const (
	Outcome   = attribute.Key("pgfence.outcome")
	Operation = attribute.Key("pgfence.operation")
	ErrorType = attribute.Key("error.type")
)

// DBSystem marks every span as a PostgreSQL client operation.
var DBSystem = attribute.String("db.system.name", "postgresql")

// DurationBuckets are the explicit bucket boundaries, in seconds, of every
// duration histogram: a local commit takes about a millisecond, a wait for a
// lease up to minutes.
var DurationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// Recorder records one package's operations: a span named prefix + "." +
// operation, and in the instruments prefix + ".operations" (a counter) and
// prefix + ".duration" (a histogram in seconds), both by pgfence.operation
// and pgfence.outcome.
type Recorder struct {
	prefix string
	tracer trace.Tracer
	ops    metric.Int64Counter
	dur    metric.Float64Histogram
}

// New returns the Recorder of the instrumentation scope named scope, on mp
// and tp (the global providers when nil: they delegate to the providers the
// application sets later).
func New(scope, prefix string, mp metric.MeterProvider, tp trace.TracerProvider) *Recorder {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(scope)
	ops, err := m.Int64Counter(prefix+".operations", metric.WithUnit("{operation}"),
		metric.WithDescription("Operations by pgfence.operation and pgfence.outcome."))
	if err != nil {
		otel.Handle(err)
	}
	dur, err := m.Float64Histogram(prefix+".duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of operations by pgfence.operation and pgfence.outcome."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	if err != nil {
		otel.Handle(err)
	}
	return &Recorder{prefix: prefix, tracer: tp.Tracer(scope), ops: ops, dur: dur}
}

// Start starts the span of one operation; done records its outcome and
// duration and ends the span, marking it failed with err (if any).
func (r *Recorder) Start(ctx context.Context, op string, attrs ...attribute.KeyValue) (context.Context, func(outcome string, err error)) {
	start := time.Now()
	ctx, span := r.tracer.Start(ctx, r.prefix+"."+op, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(attrs, DBSystem, Operation.String(op))...))
	return ctx, func(outcome string, err error) {
		set := metric.WithAttributeSet(attribute.NewSet(Operation.String(op), Outcome.String(outcome)))
		mctx := context.WithoutCancel(ctx)
		r.ops.Add(mctx, 1, set)
		r.dur.Record(mctx, time.Since(start).Seconds(), set)
		span.SetAttributes(Outcome.String(outcome))
		if err != nil && span.IsRecording() {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(ErrorType.String(ErrorTypeOf(err)))
		}
		span.End()
	}
}

// Enabled reports whether operations are counted: work done only to count
// something can be skipped when they are not.
func (r *Recorder) Enabled(ctx context.Context) bool { return r.ops.Enabled(ctx) }

// Count records n operations that have no span of their own (a step inside
// another operation's span, or a tally).
func (r *Recorder) Count(ctx context.Context, op, outcome string, n int64) {
	r.ops.Add(context.WithoutCancel(ctx), n, metric.WithAttributeSet(attribute.NewSet(Operation.String(op), Outcome.String(outcome))))
}

// Record records a duration that is an operation's own measure (how long a
// lease was held, how much of a trust window was left).
func (r *Recorder) Record(ctx context.Context, op, outcome string, d time.Duration) {
	r.dur.Record(context.WithoutCancel(ctx), d.Seconds(), metric.WithAttributeSet(attribute.NewSet(Operation.String(op), Outcome.String(outcome))))
}

// TraceID returns the trace id of ctx's span context in hex, or "" when ctx
// carries no valid span context.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// ErrorTypeOf returns a low-cardinality name for err (for error.type): the
// SQLSTATE of a database error, else the error's Go type.
func ErrorTypeOf(err error) string {
	if code := pgerr.Code(err); code != "" {
		return code
	}
	for _, s := range []struct {
		err  error
		name string
	}{
		{pgerr.ErrOutcomeUnknown, "outcome_unknown"},
		{pgerr.ErrUnavailable, "unavailable"},
		{pgerr.ErrInvalid, "invalid"},
		{context.DeadlineExceeded, "deadline_exceeded"},
		{context.Canceled, "canceled"},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return reflect.TypeOf(err).String()
}
