package tasks_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"

	"github.com/pgfence/pgfence/internal/telemetry"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Enqueues and applied batches are counted by outcome and traced, and each
// applied task's lag from its enqueue is recorded. The global providers are
// the SDK's for this test (not parallel: no other test's tasks count).
func TestTelemetry(t *testing.T) {
	p := telemetrytest.New(t)
	prevMeter, prevTracer := otel.GetMeterProvider(), otel.GetTracerProvider()
	otel.SetMeterProvider(p.Meter)
	otel.SetTracerProvider(p.Tracer)
	t.Cleanup(func() { otel.SetMeterProvider(prevMeter); otel.SetTracerProvider(prevTracer) })
	before := p.Metrics(t)

	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := db.Pool.Exec(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := tasks.Enqueue(ctx, db.Pool, "sku/1", []byte(fmt.Sprintf(`{"i":%d}`, i)), &tasks.EnqueueOptions{IdempotencyKey: fmt.Sprint(i), MaxBacklog: 3}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tasks.Enqueue(ctx, db.Pool, "sku/1", []byte(`{"i":0}`), &tasks.EnqueueOptions{IdempotencyKey: "0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.Enqueue(ctx, db.Pool, "sku/1", []byte(`{"i":3}`), &tasks.EnqueueOptions{MaxBacklog: 3}); !errors.Is(err, pgfence.ErrBacklogFull) {
		t.Fatalf("a fourth open task under a backlog of 3: %v, want ErrBacklogFull", err)
	}
	runConsumer(t, ctx, db.Pool, &tasks.Config{PollInterval: 10 * time.Millisecond})
	waitDone(t, ctx, db.Pool, 3)

	// The batch's counts come after its commit: wait for them.
	sum := func(op, outcome string) int64 {
		set := []attribute.KeyValue{telemetry.Operation.String(op), telemetry.Outcome.String(outcome)}
		return p.Metrics(t).Sum("pgfence.task.operations", set...) - before.Sum("pgfence.task.operations", set...)
	}
	for deadline := time.Now().Add(30 * time.Second); sum("apply", "task_done") < 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range []struct {
		op, outcome string
		want        int64
	}{
		{"enqueue", "enqueued", 3}, {"enqueue", "duplicate", 1}, {"enqueue", "backlog_full", 1},
		{"apply", "task_done", 3}, {"apply", "task_failed", 0},
	} {
		if got := sum(c.op, c.outcome); got != c.want {
			t.Errorf("pgfence.task.operations{%s, %s} = %d, want %d", c.op, c.outcome, got, c.want)
		}
	}
	if n, _, _ := p.Metrics(t).Histogram("pgfence.task.duration", telemetry.Operation.String("lag"), telemetry.Outcome.String("applied")); n != 3 {
		t.Errorf("%d lags recorded, want one per applied task (3)", n)
	}
	spans := map[string]int{}
	for _, s := range p.Spans.Ended() {
		spans[s.Name()]++
	}
	if spans["pgfence.task.enqueue"] != 5 || spans["pgfence.task.apply"] < 1 {
		t.Errorf("spans %v, want 5 pgfence.task.enqueue and the batches' pgfence.task.apply", spans)
	}
}
