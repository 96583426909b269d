package leases_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Guarantee 9: the keep-alive's MaxHold counts from the grant, not from the
// keep-alive's start nor from the last renewal. Renewals are RenewInterval
// apart and stop before the grant's send time + MaxHold, so at most
// MaxHold/RenewInterval − 1 happen when the keep-alive starts right after the
// grant, and fewer when it starts later (a grant whose reply was late: the
// keep-alive renews at once, then every RenewInterval); then the lease ends
// with ErrMaxHold, not before the hold ran out.
func TestKeepAliveMaxHoldFromGrant(t *testing.T) {
	checkLeaks(t)
	const (
		interval = 40 * time.Millisecond
		maxHold  = 5 * interval
	)
	var (
		mu       sync.Mutex
		renewals = map[string]int{} // by holder
	)
	db := pgfencetest.NewDatabase(t)
	p := newProxy(t, db.URL)
	// One connection, its statements prepared by the warm-up below: a
	// statement prepared while the replies are held would never be sent.
	pool := proxiedPool(t, db.URL, p, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	leases.SetOnEvent(c, func(e leases.LogEvent) {
		if e.Kind == leases.LogRenewed {
			mu.Lock()
			renewals[e.Holder]++
			mu.Unlock()
		}
	})
	renewed := func(l *leases.Lease) int {
		mu.Lock()
		defer mu.Unlock()
		return renewals[l.Holder()]
	}
	opts := &leases.AcquireOptions{RenewInterval: interval, MaxHold: maxHold}

	// keepAlive acquires a lease after t0 whose reply reaches the client
	// delay after t0 (its keep-alive starts then), and checks that the lease
	// ends with ErrMaxHold once the hold counted from the grant ran out,
	// after at most maxRenewals renewals.
	keepAlive := func(t *testing.T, delay time.Duration, maxRenewals int) {
		ctx := ctxTimeout(t, 5*time.Second) // generous: a keep-alive that never stops fails here
		if l, err := c.TryAcquire(ctx, "warm", 10*time.Second, manual()); err != nil {
			t.Fatal(err)
		} else if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if delay > 0 {
			p.SetHold(faultproxy.ServerToClient, true)
		}
		t0 := time.Now()
		type result struct {
			l   *leases.Lease
			err error
		}
		got := make(chan result, 1)
		go func() {
			l, err := c.TryAcquire(ctx, t.Name(), 10*time.Second, opts)
			got <- result{l, err}
		}()
		if delay > 0 {
			// The grant commits; its reply waits in the proxy until delay.
			for {
				var n int
				if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE key = $1 AND released_at IS NULL`, t.Name()).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 1 {
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			time.Sleep(time.Until(t0.Add(delay)))
			p.SetHold(faultproxy.ServerToClient, false)
		}
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		l := r.l
		select {
		case <-l.Context().Done():
		case <-ctx.Done():
			t.Fatalf("lease with MaxHold %s still held after %s", maxHold, time.Since(t0))
		}
		stopped := time.Since(t0)
		if err := l.Err(); !errors.Is(err, leases.ErrMaxHold) {
			t.Fatalf("lease with MaxHold %s ended after %s: %v, want ErrMaxHold", maxHold, stopped, err)
		}
		if stopped < maxHold {
			t.Fatalf("the keep-alive stopped %s after the grant, before MaxHold (%s)", stopped, maxHold)
		}
		if n := renewed(l); n > maxRenewals {
			t.Fatalf("%d renewals every %s, keep-alive started %s after the grant, with MaxHold %s from the grant: want at most %d", n, interval, delay, maxHold, maxRenewals)
		}
		t.Logf("%d renewals, stopped %s after the grant", renewed(l), stopped)
		after := renewed(l)
		time.Sleep(2 * interval)
		if n := renewed(l); n != after {
			t.Fatalf("%d renewals after the lease ended", n-after)
		}
		if err := l.Renew(context.Background()); !errors.Is(err, leases.ErrMaxHold) {
			t.Fatalf("Renew after MaxHold: %v", err)
		}
	}
	t.Run("right after the grant", func(t *testing.T) {
		// Renewals at interval, 2×, 3× and 4× interval at the earliest; a
		// fifth would be at 5× interval: MaxHold.
		keepAlive(t, 0, int(maxHold/interval)-1)
	})
	t.Run("later", func(t *testing.T) {
		// Started 4× interval after the grant: the renewal due since 1×
		// interval goes out at once; the next would be due at MaxHold.
		keepAlive(t, maxHold-interval, 1)
	})
}
