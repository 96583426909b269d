package leases_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Fair waiters of different clients (as of different processes) get the
// lease in the order they arrived, and leave no queue rows behind.
func TestFairAcquireAcrossClients(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgfencetest.NewPool(t)
	newClient := func() *leases.Client {
		c, err := leases.New(pool, &leases.Config{BackoffMax: 100 * time.Millisecond, PollInterval: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	holder, err := newClient().TryAcquire(ctx, "fair", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}

	const waiters = 4
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	queued := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_waiters WHERE key = 'fair'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := range waiters {
		c := newClient()
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Acquire(ctx, "fair", time.Minute, &leases.AcquireOptions{Fair: true})
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond) // let the others race for it
			if err := l.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		}()
		// The next waiter arrives only once this one has its place.
		deadline := time.Now().Add(20 * time.Second)
		for queued() < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d never queued", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, w := range order {
		if w != i {
			t.Fatalf("grant order %v, want arrival order [0 1 2 3]", order)
		}
	}
	if len(order) != waiters {
		t.Fatalf("%d grants, want %d", len(order), waiters)
	}
	if n := queued(); n != 0 {
		t.Fatalf("%d queue rows left behind", n)
	}
}
