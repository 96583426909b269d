package leases_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Guarantee 9: KeepAlive's MaxHold counts from the grant, not from the
// KeepAlive call nor from the last renewal. Renewals are Interval apart and
// stop before the grant's send time + MaxHold, so at most MaxHold/Interval − 1
// happen after a KeepAlive call right after the grant, and fewer when it is
// called later (a late call renews at once, then every Interval); then the
// lease ends with ErrMaxHold, not before the hold ran out.
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
	c := newClient(t, pgfencetest.NewPool(t), &leases.Config{DisableWakeups: true, OnEvent: func(e leases.Event) {
		if e.Kind == leases.EventRenewed {
			mu.Lock()
			renewals[e.Holder]++
			mu.Unlock()
		}
	}})
	renewed := func(l *leases.Lease) int {
		mu.Lock()
		defer mu.Unlock()
		return renewals[l.Holder()]
	}
	opts := &leases.KeepAliveOptions{Interval: interval, MaxHold: maxHold}

	// keepAlive runs KeepAlive on a lease granted after t0, delay after the
	// grant, and checks that it stops with ErrMaxHold once the hold counted
	// from the grant ran out, after at most maxRenewals renewals.
	keepAlive := func(t *testing.T, delay time.Duration, maxRenewals int) {
		// Generous: a loop that never stops ends here with nil instead.
		ctx := ctxTimeout(t, 5*time.Second)
		t0 := time.Now()
		l, err := c.TryAcquire(ctx, t.Name(), 10*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(delay)
		err = l.KeepAlive(ctx, opts)
		stopped := time.Since(t0)
		if !errors.Is(err, leases.ErrMaxHold) || !errors.Is(l.Err(), leases.ErrMaxHold) {
			t.Fatalf("KeepAlive with MaxHold %s returned after %s: %v (lease: %v), want ErrMaxHold", maxHold, stopped, err, l.Err())
		}
		if stopped < maxHold {
			t.Fatalf("KeepAlive stopped %s after the grant, before MaxHold (%s)", stopped, maxHold)
		}
		if n := renewed(l); n > maxRenewals {
			t.Fatalf("%d renewals every %s, called %s after the grant, with MaxHold %s from the grant: want at most %d", n, interval, delay, maxHold, maxRenewals)
		}
		t.Logf("%d renewals, stopped %s after the grant", renewed(l), stopped)
		after := renewed(l)
		time.Sleep(2 * interval)
		if n := renewed(l); n != after {
			t.Fatalf("%d renewals after KeepAlive returned", n-after)
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
		// Called 4× interval after the grant: the renewal due since 1×
		// interval goes out at once; the next would be due at MaxHold.
		keepAlive(t, maxHold-interval, 1)
	})
}
