// Package telemetrytest reads what the pgfence packages recorded with the
// OpenTelemetry SDK's in-memory readers, for tests.
package telemetrytest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// RemoteTrace returns ctx carrying a sampled remote span context whose trace
// id is id (32 hex digits), as an incoming request's propagated context: the
// pgfence packages store that trace id without an SDK installed.
func RemoteTrace(t testing.TB, ctx context.Context, id string) context.Context {
	t.Helper()
	tid, err := trace.TraceIDFromHex(id)
	if err != nil {
		t.Fatal(err)
	}
	return trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled, Remote: true}))
}

// Providers are an SDK meter provider with a manual reader and an SDK tracer
// provider with a span recorder.
type Providers struct {
	Reader *sdkmetric.ManualReader
	Meter  *sdkmetric.MeterProvider
	Spans  *tracetest.SpanRecorder
	Tracer *sdktrace.TracerProvider
}

// New returns fresh providers, shut down at t's cleanup.
func New(t testing.TB) *Providers {
	p := &Providers{Reader: sdkmetric.NewManualReader(), Spans: tracetest.NewSpanRecorder()}
	p.Meter = sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.Reader))
	p.Tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p.Spans))
	t.Cleanup(func() {
		_ = p.Meter.Shutdown(context.Background())
		_ = p.Tracer.Shutdown(context.Background())
	})
	return p
}

// Metrics collects the current metrics.
func (p *Providers) Metrics(t testing.TB) Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := p.Reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return Metrics{rm}
}

// Metrics is one collection.
type Metrics struct{ RM metricdata.ResourceMetrics }

// Find returns the metric named name, and whether it exists.
func (m Metrics) Find(name string) (metricdata.Metrics, bool) {
	for _, sm := range m.RM.ScopeMetrics {
		for _, x := range sm.Metrics {
			if x.Name == name {
				return x, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// Names returns the names of all metrics with data.
func (m Metrics) Names() []string {
	var out []string
	for _, sm := range m.RM.ScopeMetrics {
		for _, x := range sm.Metrics {
			out = append(out, x.Name)
		}
	}
	return out
}

func matches(set attribute.Set, attrs []attribute.KeyValue) bool {
	for _, kv := range attrs {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// Sum is the total of the int64 counter name over the data points whose
// attributes include attrs (0 if there are none).
func (m Metrics) Sum(name string, attrs ...attribute.KeyValue) int64 {
	x, ok := m.Find(name)
	if !ok {
		return 0
	}
	sum, ok := x.Data.(metricdata.Sum[int64])
	if !ok {
		return -1
	}
	var total int64
	for _, dp := range sum.DataPoints {
		if matches(dp.Attributes, attrs) {
			total += dp.Value
		}
	}
	return total
}

// Histogram returns the count, sum and max of the float64 histogram name over
// the data points whose attributes include attrs.
func (m Metrics) Histogram(name string, attrs ...attribute.KeyValue) (count uint64, sum, maxValue float64) {
	x, ok := m.Find(name)
	if !ok {
		return 0, 0, 0
	}
	h, ok := x.Data.(metricdata.Histogram[float64])
	if !ok {
		return 0, 0, -1
	}
	for _, dp := range h.DataPoints {
		if matches(dp.Attributes, attrs) {
			count += dp.Count
			sum += dp.Sum
			if v, ok := dp.Max.Value(); ok && v > maxValue {
				maxValue = v
			}
		}
	}
	return count, sum, maxValue
}

// Unit returns the unit of metric name.
func (m Metrics) Unit(name string) string {
	x, _ := m.Find(name)
	return x.Unit
}

// Ended returns the ended spans named name.
func (p *Providers) Ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range p.Spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// Attr returns the value of span attribute key, and whether it is set.
func Attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}
