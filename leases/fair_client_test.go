package leases_test

import (
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Fair waiters take turns in arrival order across clients even when two of
// them wait in the same client: the second one of a client keeps its place
// from its arrival, and a fair waiter of another client that arrived later
// does not overtake it.
func TestFairAcquireSameClientKeepsArrivalOrder(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	cfg := &leases.Config{BackoffMax: 100 * time.Millisecond, PollInterval: 200 * time.Millisecond}
	x, y := newClient(t, pool, cfg), newClient(t, pool, cfg)
	holder, err := newClient(t, pool, cfg).TryAcquire(ctx, "fair", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_waiters WHERE key = 'fair'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// awaitQueued waits until n fair waiters have a place in the database
	// queue, or (when one never gets one) until patience has passed.
	awaitQueued := func(name string, n int, patience time.Duration) {
		t.Helper()
		deadline := time.Now().Add(patience)
		for queued() < n {
			if time.Now().After(deadline) {
				t.Logf("waiter %s has no place in the database queue", name)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	type grant struct {
		name string
		l    *leases.Lease
		err  error
	}
	grants := make(chan grant, 3)
	start := func(c *leases.Client, name string) {
		go func() {
			l, err := c.Acquire(ctx, "fair", time.Minute, &leases.AcquireOptions{Fair: true})
			grants <- grant{name, l, err}
		}()
	}
	start(x, "x1")
	awaitQueued("x1", 1, 20*time.Second)
	start(x, "x2")                      // behind x1 in its own client
	awaitQueued("x2", 2, 2*time.Second) // it has arrived by then, queued or not
	n := queued()
	start(y, "y1") // arrives last
	awaitQueued("y1", n+1, 20*time.Second)

	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var order []string
	for range 3 {
		g := <-grants
		if g.err != nil {
			t.Fatalf("waiter %s: %v", g.name, g.err)
		}
		order = append(order, g.name)
		if err := g.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if order[0] != "x1" || order[1] != "x2" || order[2] != "y1" {
		t.Fatalf("grant order %v, want arrival order [x1 x2 y1]", order)
	}
	if n := queued(); n != 0 {
		t.Fatalf("%d queue rows left behind", n)
	}
}
