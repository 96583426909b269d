package leases_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// events collects a client's events of some kinds on a channel.
func events(kinds ...leases.EventKind) (chan leases.Event, func(leases.Event)) {
	ch := make(chan leases.Event, 100)
	return ch, func(e leases.Event) {
		if slices.Contains(kinds, e.Kind) {
			select {
			case ch <- e:
			default:
			}
		}
	}
}

func waitEvent(t *testing.T, ch chan leases.Event, kind leases.EventKind, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case e := <-ch:
			if e.Kind == kind {
				return
			}
		case <-deadline:
			t.Fatalf("no %s event within %s", kind, timeout)
		}
	}
}

// handOff measures how long after the holder's release a waiter on c gets the
// lease. The holder is another client, so only the database can wake c.
func handOff(t *testing.T, holder, c *leases.Client, key string) time.Duration {
	t.Helper()
	ctx := ctxTimeout(t, 30*time.Second)
	l, err := holder.TryAcquire(ctx, key, 30*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	errc := make(chan error, 1)
	go func() {
		l2, err := c.Acquire(ctx, key, 30*time.Second, nil)
		if err != nil {
			errc <- err
			return
		}
		got <- time.Now()
		errc <- l2.Release(ctx)
	}()
	time.Sleep(time.Second) // the waiter has tried and backed off
	start := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var d time.Duration
	select {
	case at := <-got:
		d = at.Sub(start)
	case err := <-errc:
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return d
}

// A release notification wakes a waiter much sooner than polling would.
func TestWakeupFasterThanPolling(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	holder := newClient(t, pool, &leases.Config{DisableWakeups: true})
	up, onEvent := events(leases.EventListenerUp)
	notified := newClient(t, pool, &leases.Config{OnEvent: onEvent})
	polling := newClient(t, pool, &leases.Config{DisableWakeups: true, BackoffMax: time.Second})

	// Start the listener and wait until it listens.
	ctx := ctxTimeout(t, 10*time.Second)
	l, err := notified.Acquire(ctx, "warm-up", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)
	waitEvent(t, up, leases.EventListenerUp, 10*time.Second)

	var withNotify, withPolling time.Duration
	for range 3 {
		withNotify += handOff(t, holder, notified, "k")
		withPolling += handOff(t, holder, polling, "k")
	}
	t.Logf("hand-off over 3 rounds: notifications %s, polling %s", withNotify, withPolling)
	if withNotify*3 > withPolling {
		t.Fatalf("notifications (%s) not much faster than polling (%s)", withNotify, withPolling)
	}
}

// Losing the LISTEN connection (terminated, and reconnects refused) degrades
// waiting to polling: a release is still seen, and the listener comes back.
func TestListenerLossDegradesToPolling(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	p := newProxy(t, db.URL)
	ch, onEvent := events(leases.EventListenerUp, leases.EventListenerDown)
	c := newClient(t, proxiedPool(t, db.URL, p), &leases.Config{OnEvent: onEvent, BackoffMax: 200 * time.Millisecond})
	holder := newClient(t, db.Pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)

	l, err := holder.TryAcquire(ctx, "k", 30*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l2, err := c.Acquire(ctx, "k", 10*time.Second, nil)
		if err == nil {
			err = l2.Release(ctx)
		}
		got <- err
	}()
	waitEvent(t, ch, leases.EventListenerUp, 10*time.Second)

	p.SetRefuse(true) // the listener cannot come back; the pool's open connection still works
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1`, leases.ListenerApplicationName).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminated %d listeners: %v", n, err)
	}
	waitEvent(t, ch, leases.EventListenerDown, 10*time.Second)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter without its listener: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("waiter hangs without its listener")
	}

	p.SetRefuse(false)
	waitEvent(t, ch, leases.EventListenerUp, 15*time.Second)
}

// Closing the client ends waiting Acquire calls with ErrClosed and stops the
// listener.
func TestCloseEndsWaiters(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	holder := newClient(t, pool, nil)
	c, err := leases.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, 30*time.Second)
	l, err := holder.TryAcquire(ctx, "k", 30*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := c.Acquire(ctx, "k", time.Second, nil)
			errs <- err
		}()
	}
	time.Sleep(100 * time.Millisecond)
	_ = c.Close()
	for range 3 {
		if err := <-errs; !errors.Is(err, leases.ErrClosed) {
			t.Fatalf("waiter after Close: %v", err)
		}
	}
	if _, err := c.TryAcquire(context.Background(), "k", time.Second, nil); !errors.Is(err, leases.ErrClosed) {
		t.Fatalf("TryAcquire after Close: %v", err)
	}
	_ = l.Release(ctx)
}
