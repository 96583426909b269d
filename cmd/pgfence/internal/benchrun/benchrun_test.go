package benchrun

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestSummarizePercentiles(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	r := Summarize(lat, 2*time.Second, 3, 4, 5, errors.New("boom"))
	if r.Ops != 100 || r.Workers != 3 || r.Errors != 4 || r.Held != 5 || r.FirstError != "boom" {
		t.Fatalf("counts: %+v", r)
	}
	if r.P50 != 51*time.Millisecond || r.P99 != 100*time.Millisecond || r.OpsPerS != 50 {
		t.Fatalf("p50 %v p99 %v ops/s %v, want 51ms, 100ms, 50", r.P50, r.P99, r.OpsPerS)
	}
	r.SetStatements(300)
	if r.StatementsPerOp != 3 || r.StatementsPerS != 150 {
		t.Fatalf("statements/op %v, statements/s %v, want 3 and 150", r.StatementsPerOp, r.StatementsPerS)
	}
}

// Every call after the warm-up lands in exactly one of Ops, Held and Errors,
// and an explicit sample replaces the call's own duration.
func TestRunClassifiesEveryCall(t *testing.T) {
	var calls, afterStart atomic.Int64
	var started atomic.Bool
	op := func(ctx context.Context, w *Worker) (time.Duration, error) {
		n := calls.Add(1)
		if started.Load() {
			afterStart.Add(1)
		}
		if k := w.Key(); k < 0 || k >= Keys {
			t.Errorf("key %d out of range", k)
		}
		switch n % 3 {
		case 0:
			return 0, ErrHeld
		case 1:
			return 0, errors.New("failed")
		}
		return 7 * time.Millisecond, nil
	}
	r := Run(context.Background(), op, Config{Workers: 4, Duration: 20 * time.Millisecond, Started: func() {
		if calls.Load() != 4 {
			t.Errorf("warm-up made %d calls, want one per worker", calls.Load())
		}
		started.Store(true)
	}})
	if got := int64(r.Ops + r.Held + r.Errors); got != afterStart.Load() {
		t.Fatalf("ops+held+errors = %d, want %d calls after warm-up", got, afterStart.Load())
	}
	if r.Ops == 0 || r.Held == 0 || r.Errors == 0 || r.FirstError != "failed" {
		t.Fatalf("%+v", r)
	}
	if r.P50 != 7*time.Millisecond || r.P99 != 7*time.Millisecond {
		t.Fatalf("p50 %v p99 %v, want the 7 ms samples", r.P50, r.P99)
	}
}

// With Warmup, the workers keep running the operation before the clock starts,
// and nothing they did then is counted.
func TestRunWarmup(t *testing.T) {
	var calls, atStart atomic.Int64
	var startedAt time.Time
	op := func(ctx context.Context, w *Worker) (time.Duration, error) {
		calls.Add(1)
		time.Sleep(time.Millisecond)
		return 0, errors.New("failed") // every call fails: any warm-up call counted would show
	}
	begin := time.Now()
	r := Run(context.Background(), op, Config{Workers: 2, Duration: 30 * time.Millisecond, Warmup: 60 * time.Millisecond, Started: func() {
		startedAt = time.Now()
		atStart.Store(calls.Load())
	}})
	sinceStart := time.Since(startedAt)
	if warm := startedAt.Sub(begin); warm < 60*time.Millisecond {
		t.Errorf("the clock started %s after Run, before the 60ms warm-up ended", warm)
	}
	if atStart.Load() <= 2 {
		t.Errorf("%d calls before the clock started, want more than the first call of each of 2 workers", atStart.Load())
	}
	if got, want := int64(r.Errors), calls.Load()-atStart.Load(); got != want || r.Ops != 0 {
		t.Errorf("counted %d errors and %d ops, want the %d calls after the clock started", got, r.Ops, want)
	}
	// Compared with the time since the clock started, not with a fixed
	// bound: on a loaded machine the run itself may take longer.
	if r.Elapsed > sinceStart {
		t.Errorf("measured %s, but the clock started %s before Run returned: the warm-up was counted in the run's time", r.Elapsed, sinceStart)
	}
}
