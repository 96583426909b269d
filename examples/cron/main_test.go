package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

func TestCron(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	defer pool.Close() // its connections' goroutines end before the leak check (the harness's Close is then a no-op)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var out bytes.Buffer
	res, err := run(ctx, pool, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, slot := range slots {
		if res.RunsPerSlot[slot] != 1 {
			t.Errorf("slot %s recorded %d times, want 1", slot, res.RunsPerSlot[slot])
		}
	}
	if len(res.RunsPerSlot) != len(slots) {
		t.Errorf("runs recorded for %d slots, want %d", len(res.RunsPerSlot), len(slots))
	}
	// Every execution was recorded once per slot, or rejected as stale (the
	// frozen one at least).
	if res.Executions != len(slots)+res.StaleRejected || res.StaleRejected < 1 || !res.TakenOver {
		t.Errorf("executions %d, stale rejections %d, taken over %t; want %d+rejected, ≥1, true",
			res.Executions, res.StaleRejected, res.TakenOver, len(slots))
	}
	// Every other lease win found its slot finished.
	if want := len(slots)*len(instances) - res.Executions; res.Skipped != want {
		t.Errorf("%d skips, want %d", res.Skipped, want)
	}
}
