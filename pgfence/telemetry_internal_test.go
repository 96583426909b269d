package pgfence

import (
	"context"
	"testing"
)

// BenchmarkWriteTelemetry measures what the telemetry of one accepted write
// costs the client with the global providers unset and no logger: the
// default, paid by every fenced write.
func BenchmarkWriteTelemetry(b *testing.B) {
	ctx := context.Background()
	f := New(nil)
	b.ReportAllocs()
	for b.Loop() {
		w := &write{op: opExec, resource: "bench/1", token: 42, id: newOpID()}
		_ = f.observed(ctx, nil, w, func(context.Context) error { return nil })
	}
}
