// Package telemetry holds what the pgfence packages share for OpenTelemetry:
// attribute names, histogram buckets, instrument constructors and the trace
// id of a context. It only observes; package tracesql stores the trace id
// beside the rows pgfence writes.
package telemetry

import (
	"context"
	"errors"
	"reflect"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// Attribute keys. Metric attributes are low-cardinality only (outcome,
// operation, mode); keys, holders and tokens go on spans.
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

// TraceID returns the trace id of ctx's span context in hex, or "" when ctx
// carries no valid span context.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// Unknown reports whether err says the outcome of a change is unknown.
func Unknown(err error) bool { return errors.Is(err, pgerr.ErrOutcomeUnknown) }

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

// End ends span, marking it as failed with err (if any).
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(ErrorType.String(ErrorTypeOf(err)))
	}
	span.End()
}

// Counter creates a counter, reporting a creation error (there is none with
// valid names) to report.
func Counter(m metric.Meter, name, unit, desc string, report func(error)) metric.Int64Counter {
	c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	if err != nil {
		report(err)
	}
	return c
}

// Seconds creates a float64 duration histogram in seconds with
// DurationBuckets.
func Seconds(m metric.Meter, name, desc string, report func(error)) metric.Float64Histogram {
	h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	if err != nil {
		report(err)
	}
	return h
}
