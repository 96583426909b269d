package pgfence

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// BenchmarkWriteTelemetry measures what the telemetry of one accepted write
// costs the client with the global providers unset: the default, paid by
// every fenced write.
func BenchmarkWriteTelemetry(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		w := &aWrite{op: opExec, resource: "bench/1", token: 42, id: newOpID()}
		_ = observe[pgx.Tx](ctx, nil, w, func(context.Context) error { return nil })
	}
}
