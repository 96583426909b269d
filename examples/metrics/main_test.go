package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

// TestMetrics checks the business result against the database and the
// metrics against what happened, twice on the same database: lease rows,
// accepted tokens and idempotency keys outlive a run, and the second run must
// not trip on the first's (its requests must not be replays of them). The
// global providers are set once, as an application sets them: the second
// run's metrics are what it added.
func TestMetrics(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	reader, shutdown := setupTelemetry()
	defer shutdown()

	var before telemetrytest.Metrics
	for n := 1; n <= 2; n++ {
		t.Run(fmt.Sprintf("run-%d", n), func(t *testing.T) { before = checkRun(ctx, t, pool, reader, before) })
	}
}

// checkRun runs the example on pool and checks its outcome, and the metrics
// it added to before; it returns the metrics after it.
func checkRun(ctx context.Context, t *testing.T, pool *pgxpool.Pool, reader *sdkmetric.ManualReader, before telemetrytest.Metrics) telemetrytest.Metrics {
	var out bytes.Buffer
	res, err := run(ctx, pool, reader, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	requests := int64(workers * rounds * perRound)
	if res.Counter != requests+1 || res.Accepted != requests+1 || res.Replays != requests {
		t.Errorf("counter %d, accepted %d, replays %d; want %d, %d, %d", res.Counter, res.Accepted, res.Replays, requests+1, requests+1, requests)
	}
	if !res.StaleWrite || !res.StaleRelease {
		t.Errorf("stale write rejected %v, stale release refused %v", res.StaleWrite, res.StaleRelease)
	}
	if res.AuditEvent != "taken_over" || res.AuditToken != res.WriteToken {
		t.Errorf("audit join: %s token %d, write token %d", res.AuditEvent, res.AuditToken, res.WriteToken)
	}

	// What this run added to the metrics.
	after := telemetrytest.Metrics{RM: res.Metrics}
	sum := func(name string, attrs ...attribute.KeyValue) int64 {
		return after.Sum(name, attrs...) - before.Sum(name, attrs...)
	}
	count := func(name string, attrs ...attribute.KeyValue) uint64 {
		n, _, _ := after.Histogram(name, attrs...)
		n0, _, _ := before.Histogram(name, attrs...)
		return n - n0
	}
	outcome := func(v string) attribute.KeyValue { return attribute.String("pgfence.outcome", v) }
	mode := attribute.String("pgfence.operation", "atomic")
	lease := func(op string) attribute.KeyValue { return attribute.String("pgfence.operation", op) }
	for _, c := range []struct {
		name string
		got  int64
		want int64
	}{
		{"fence writes accepted", sum("pgfence.fence.operations", outcome("accepted")), res.Accepted},
		{"fence writes stale_token", sum("pgfence.fence.operations", outcome("stale_token")), 1},
		{"idempotency new", sum("pgfence.idempotency.operations", mode, outcome("new")), res.Accepted},
		{"idempotency replayed", sum("pgfence.idempotency.operations", mode, outcome("replayed")), res.Replays},
		{"grants", sum("pgfence.lease.operations", lease("attempt"), outcome("acquired")) + sum("pgfence.lease.operations", lease("attempt"), outcome("taken_over")), 2*requests + 2},
		{"takeovers", sum("pgfence.lease.operations", lease("attempt"), outcome("taken_over")), 1},
		{"releases not_held", sum("pgfence.lease.operations", lease("release"), outcome("not_held")), 1},
		{"releases released", sum("pgfence.lease.operations", lease("release"), outcome("released")), 2*requests + 1},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
	if n := count("pgfence.lease.duration", lease("hold"), outcome("lost")); n != 1 {
		t.Errorf("lease duration{hold, lost} count %d, want 1 (the frozen worker)", n)
	}
	// The output shows the series moving round by round.
	if strings.Count(out.String(), "pgfence.fence.operations{operation=exec,outcome=accepted}") != rounds+1 {
		t.Errorf("the accepted writes are not printed after every round:\n%s", out.String())
	}
	return after
}
