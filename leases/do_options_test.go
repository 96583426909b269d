package leases_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TryOnce: a held key is skipped at once, without running fn; a free one is
// run.
func TestDoTryOnceSkipsHeldKey(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)

	other, err := c.TryAcquire(ctx, "job", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A Do that waited would wait until this deadline and fail with it.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ran := false
	err = c.Do(wctx, "job", time.Second, &leases.AcquireOptions{TryOnce: true}, func(context.Context, *leases.Lease) error {
		ran = true
		return nil
	})
	var held *leases.HeldError
	if ran || !errors.As(err, &held) || held.Remaining < 50*time.Second || wctx.Err() != nil {
		t.Fatalf("TryOnce on a held key: ran %v, err %v (context %v); want ErrLeaseHeld at once, fn not run", ran, err, wctx.Err())
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	err = c.Do(ctx, "job", time.Second, &leases.AcquireOptions{TryOnce: true}, func(context.Context, *leases.Lease) error {
		ran = true
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("TryOnce on a free key: ran %v, err %v", ran, err)
	}
}

// MaxWait bounds the wait only: the work under the lease outlives it. A
// deadline on the context bounds both, as documented, and fn's context says
// so.
func TestDoMaxWaitBoundsOnlyTheWait(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)
	const maxWait = 200 * time.Millisecond

	// Held: the wait gives up after MaxWait, fn does not run.
	other, err := c.TryAcquire(ctx, "job", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = c.Do(ctx, "job", time.Second, &leases.AcquireOptions{MaxWait: maxWait}, func(context.Context, *leases.Lease) error {
		t.Error("fn ran on a held key")
		return nil
	})
	// The last attempt found the key held, or (on a loaded machine) was still
	// in flight when the wait ended: its outcome is then unknown, and settled
	// in the background.
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, pgfence.ErrLeaseHeld) && !errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("MaxWait on a held key: %v; want the wait's deadline and the last attempt's ErrLeaseHeld (or ErrOutcomeUnknown)", err)
	}
	t.Logf("gave up after %s", time.Since(start))
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Free: the work runs three times MaxWait and is not cancelled.
	err = c.Do(ctx, "job", time.Second, &leases.AcquireOptions{MaxWait: maxWait}, func(ctx context.Context, _ *leases.Lease) error {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(3 * maxWait):
			return nil
		}
	})
	if err != nil {
		t.Fatalf("work longer than MaxWait: %v", err)
	}

	// A deadline on ctx bounds the work too: fn's context ends with it.
	dctx, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	err = c.Do(dctx, "job", time.Second, nil, func(ctx context.Context, _ *leases.Lease) error {
		<-ctx.Done()
		return context.Cause(ctx)
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("work under a context deadline: %v, want the context's deadline", err)
	}
	if st, err := c.Get(ctx, "job"); err != nil || st.Live {
		t.Fatalf("lease after Do: %+v %v, want released", st, err)
	}
}

// MaxHold ends the work with ErrMaxHold, and the error names the option and
// the default; HolderInfo and RenewInterval reach the lease.
//
// Nothing here depends on how fast the machine is: the renewals are awaited
// (with a bound far below the default interval's first renewal), and MaxHold
// is checked on work that blocks until it ends.
func TestDoKeepAliveOptions(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	renewed := make(chan struct{}, 64)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	leases.SetOnEvent(c, func(e leases.LogEvent) {
		if e.Kind == leases.LogRenewed {
			select {
			case renewed <- struct{}{}:
			default:
			}
		}
	})
	ctx := ctxTimeout(t, time.Minute)

	// HolderInfo and RenewInterval. With a 90 s TTL the default interval
	// (TTL / 3) renews first after 30 s; the option's
	// 50 ms renews twice well within the 15 s allowed.
	const ttl = 90 * time.Second
	if d := ttl / 3; d < 20*time.Second {
		t.Fatalf("default renew interval %s: the test needs it above its 15 s bound", d)
	}
	var info string
	err := c.Do(ctx, "job", ttl, &leases.AcquireOptions{RenewInterval: 50 * time.Millisecond, HolderInfo: "nightly on host-7"},
		func(ctx context.Context, l *leases.Lease) error {
			st, err := c.Get(ctx, "job")
			if err != nil {
				return err
			}
			info = st.HolderInfo
			bound := time.NewTimer(15 * time.Second)
			defer bound.Stop()
			for range 2 {
				select {
				case <-renewed:
				case <-bound.C:
					return errors.New("fewer than 2 renewals in 15 s with RenewInterval 50ms")
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
			return nil
		})
	if err != nil {
		t.Fatalf("Do with RenewInterval and HolderInfo: %v", err)
	}
	if info != "nightly on host-7" {
		t.Errorf("holder info %q, want the option's", info)
	}

	// MaxHold: work that runs until its context ends is ended by it.
	err = c.Do(ctx, "job", 3*time.Second, &leases.AcquireOptions{MaxHold: 400 * time.Millisecond},
		func(ctx context.Context, l *leases.Lease) error {
			<-ctx.Done()
			return nil
		})
	if !errors.Is(err, leases.ErrMaxHold) {
		t.Fatalf("Do past MaxHold: %v, want ErrMaxHold", err)
	}
	// The limit and the option that sets it; no default, which differs by
	// caller (an election's is NoMaxHold).
	for _, want := range []string{"400ms", "AcquireOptions.MaxHold", "raise it"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ErrMaxHold message %q does not name %q", err, want)
		}
	}
}

// Fair waits in the database's queue.
func TestDoFairQueues(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, PollInterval: 20 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	ctx := ctxTimeout(t, 30*time.Second)
	other, err := c.TryAcquire(ctx, "job", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- c.Do(ctx, "job", time.Second, &leases.AcquireOptions{Fair: true}, func(context.Context, *leases.Lease) error { return nil })
	}()
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_waiters WHERE key = 'job'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Do returned before queueing: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Options the keep-alive would refuse only after the grant are refused
// before anything is granted, naming the field.
func TestDoRefusesOptionsBeforeTheGrant(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)
	fn := func(context.Context, *leases.Lease) error { t.Error("fn ran"); return nil }
	for _, tc := range []struct {
		field string
		opts  *leases.AcquireOptions
	}{
		{"AcquireOptions.MaxWait", &leases.AcquireOptions{MaxWait: -1}},
		{"AcquireOptions.MaxWait", &leases.AcquireOptions{TryOnce: true, MaxWait: time.Second}},
		{"AcquireOptions.RenewInterval", &leases.AcquireOptions{RenewInterval: 900 * time.Millisecond}}, // TTL 1s − margin 100ms
		{"AcquireOptions.MaxHold", &leases.AcquireOptions{MaxHold: -1}},
		{"AcquireOptions.MaxFailures", &leases.AcquireOptions{MaxFailures: -1}},
		{"AcquireOptions.Fair", &leases.AcquireOptions{TryOnce: true, Fair: true}},
		{"AcquireOptions.HolderInfo", &leases.AcquireOptions{HolderInfo: strings.Repeat("x", leases.MaxHolderInfoBytes+1)}},
		// fn would lose its lease after one TTL.
		{"AcquireOptions.NoKeepAlive", &leases.AcquireOptions{NoKeepAlive: true}},
	} {
		err := c.Do(ctx, "job", time.Second, tc.opts, fn)
		if !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: %v, want ErrInvalid naming %s", tc.opts, err, tc.field)
		}
	}
	if _, err := c.Get(ctx, "job"); !errors.Is(err, pgfence.ErrNotFound) {
		t.Fatalf("a refused Do granted the key: %v", err)
	}
}

// Err reads the clock: once the trust window has run out, the lease is
// ended even if the timer that ends it has not run (a process resumed after
// a pause runs its goroutines in any order).
func TestErrChecksTrustWindow(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)
	// Not kept alive: a renewal would move the trust window.
	l, err := c.TryAcquire(ctx, "k", 100*time.Millisecond, manual())
	if err != nil {
		t.Fatal(err)
	}
	leases.StopTrustTimer(l)
	time.Sleep(100 * time.Millisecond) // past the window: TTL − 10 ms
	if err := l.Err(); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("Err after the trust window ran out: %v, want ErrLeaseLost", err)
	}
	select {
	case <-l.Context().Done():
	default:
		t.Fatal("Err reported the loss but the lease's context is still open")
	}
}
