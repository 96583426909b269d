package leases_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// events collects a client's events of some kinds on a channel; pass the
// function to leases.SetOnEvent.
func events(kinds ...leases.LogKind) (chan leases.LogEvent, func(leases.LogEvent)) {
	ch := make(chan leases.LogEvent, 100)
	return ch, func(e leases.LogEvent) {
		if slices.Contains(kinds, e.Kind) {
			select {
			case ch <- e:
			default:
			}
		}
	}
}

func waitEvent(t *testing.T, ch chan leases.LogEvent, kind leases.LogKind, timeout time.Duration) {
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

// A release notification wakes a waiter: with polling and backoff set to a
// minute, a waiter that has tried and lost still gets the lease right after
// the holder, a client that cannot wake it locally, releases it. Polling
// alone would not try again within the waiter's deadline. (How much faster
// than polling a hand-off is: BenchmarkHandOff, wakeups=true and false.)
func TestReleaseNotificationWakesWaiter(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	holder := newClient(t, pool, &leases.Config{DisableWakeups: true})
	p := telemetrytest.New(t)
	up, onEvent := events(leases.LogListenerUp)
	const poll = time.Minute
	c := newClient(t, pool, &leases.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer,
		PollInterval: poll, BackoffMax: poll})
	leases.SetOnEvent(c, onEvent)
	ctx := ctxTimeout(t, 30*time.Second)

	// Start the listener and wait until it listens: from then on, every
	// failed attempt waits at least PollInterval/2 unless woken.
	l, err := c.Acquire(ctx, "warm-up", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, up, leases.LogListenerUp, 10*time.Second)

	// The holder's lease outlasts the test: its expiry wakes nobody.
	held, err := holder.TryAcquire(ctx, "k", 10*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, poll/4) // before any poll
		defer cancel()
		l, err := c.Acquire(wctx, "k", time.Minute, nil)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	// Release once the waiter has tried and lost.
	for ops(p.Metrics(t), "attempt", "held") == 0 {
		select {
		case err := <-got:
			t.Fatalf("waiter returned before its first attempt failed: %v", err)
		case <-ctx.Done():
			t.Fatal("the waiter made no attempt")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter not woken by the release notification: %v", err)
	}
}

// Losing the LISTEN connection (terminated, and reconnects refused) degrades
// waiting to polling: a release is still seen, and the listener comes back.
func TestListenerLossDegradesToPolling(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	p := newProxy(t, db.URL)
	ch, onEvent := events(leases.LogListenerUp, leases.LogListenerDown)
	c := newClient(t, proxiedPool(t, db.URL, p), &leases.Config{BackoffMax: 200 * time.Millisecond})
	leases.SetOnEvent(c, onEvent)
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
	waitEvent(t, ch, leases.LogListenerUp, 10*time.Second)

	p.SetRefuse(true) // the listener cannot come back; the pool's open connection still works
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1`, leases.ListenerApplicationName).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminated %d listeners: %v", n, err)
	}
	waitEvent(t, ch, leases.LogListenerDown, 10*time.Second)
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
	waitEvent(t, ch, leases.LogListenerUp, 15*time.Second)
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

// After Close every method of the client returns ErrClosed and sends
// nothing, while a lease granted before stays held (no longer kept alive)
// and can still be renewed, changed and released.
func TestCloseRefusesLaterCalls(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	other := newClient(t, pool, nil)
	c, err := leases.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var renewals atomic.Int64
	leases.SetOnEvent(c, func(e leases.LogEvent) {
		if e.Kind == leases.LogRenewed {
			renewals.Add(1)
		}
	})
	ctx := ctxTimeout(t, 30*time.Second)
	l, err := c.TryAcquire(ctx, "closed/k", time.Minute, &leases.AcquireOptions{RenewInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for renewals.Load() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the lease was not kept alive")
		}
		time.Sleep(5 * time.Millisecond)
	}
	w, err := c.Watch(ctx, "closed/k", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for range w.Events() {
	}
	if err := w.State().Err; !errors.Is(err, leases.ErrClosed) {
		t.Errorf("a watch ended by Close: State().Err = %v, want ErrClosed", err)
	}
	// Close stopped the keep-alive and waited for it: no renewal after it,
	// and the lease is still held.
	renewed := renewals.Load()
	time.Sleep(50 * time.Millisecond) // five renewal intervals
	if n := renewals.Load() - renewed; n != 0 {
		t.Errorf("%d renewals after Close", n)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease after Close: %v, want still held", err)
	}
	calls := map[string]func() error{
		"TryAcquire": func() error { _, err := c.TryAcquire(ctx, "closed/j", time.Second, nil); return err },
		"Acquire":    func() error { _, err := c.Acquire(ctx, "closed/j", time.Second, nil); return err },
		"Do": func() error {
			return c.Do(ctx, "closed/j", time.Second, nil, func(context.Context, *leases.Lease) error { return nil })
		},
		"Watch":        func() error { _, err := c.Watch(ctx, "closed/k", nil); return err },
		"List":         func() error { _, err := c.List(ctx); return err },
		"Get":          func() error { _, err := c.Get(ctx, "closed/k"); return err },
		"History":      func() error { _, err := c.History(ctx, "closed/k", 10); return err },
		"Count":        func() error { _, err := c.Count(ctx); return err },
		"Pauses":       func() error { _, err := c.Pauses(ctx); return err },
		"PauseGrants":  func() error { _, err := c.PauseGrants(ctx, "closed/", "after close"); return err },
		"ResumeGrants": func() error { _, err := c.ResumeGrants(ctx, "closed/", ""); return err },
		"ForceRelease": func() error { _, err := c.ForceRelease(ctx, "closed/k", "after close"); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, leases.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
	// Nothing was sent: no pause, no grant, the lease still held.
	if pauses, err := other.Pauses(ctx); err != nil || len(pauses) != 0 {
		t.Errorf("pauses after the refused PauseGrants: %+v %v", pauses, err)
	}
	if _, err := other.Get(ctx, "closed/j"); !errors.Is(err, pgfence.ErrNotFound) {
		t.Errorf("closed/j after the refused grants: %v, want ErrNotFound", err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("Renew of a lease granted before Close: %v", err)
	}
	if _, err := l.SetHolderInfo(ctx, "closing down"); err != nil {
		t.Fatalf("SetHolderInfo of a lease granted before Close: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release of a lease granted before Close: %v", err)
	}
	if s, err := other.Get(ctx, "closed/k"); err != nil || s.Live {
		t.Fatalf("closed/k after its release: %+v %v", s, err)
	}
}
