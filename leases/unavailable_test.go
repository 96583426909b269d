package leases_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A call that sends nothing says so: the caller's own context ended
// (context's error) or the pool is closed (ErrUnavailable), never
// ErrOutcomeUnknown, and never a bare pool error.
func TestNothingSentIsNotUnknown(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)

	// Renewed by hand only.
	l1, err := c.TryAcquire(ctx, "k1", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	l2, err := c.TryAcquire(ctx, "k2", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := l1.Renew(canceled); !errors.Is(err, context.Canceled) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Errorf("Renew with a canceled context: %v, want context.Canceled", err)
	}
	if err := l1.Release(canceled); !errors.Is(err, context.Canceled) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Errorf("Release with a canceled context: %v, want context.Canceled", err)
	}
	if _, err := c.TryAcquire(canceled, "k3", 10*time.Second, nil); !errors.Is(err, context.Canceled) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Errorf("TryAcquire with a canceled context: %v, want context.Canceled", err)
	}

	pool.Close()
	unavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Errorf("%s on a closed pool: %v, want ErrUnavailable", what, err)
		}
	}
	_, err = c.TryAcquire(ctx, "k3", 10*time.Second, nil)
	unavailable("TryAcquire", err)
	_, err = c.Acquire(ctx, "k3", 10*time.Second, &leases.AcquireOptions{MaxWait: 100 * time.Millisecond})
	unavailable("Acquire", err)
	unavailable("Renew", l2.Renew(ctx))
	unavailable("Release", l2.Release(ctx))
}

// The inspection, operator and fair-queue calls say the same when they send
// nothing: the context's error, or ErrUnavailable on a closed pool, never
// ErrOutcomeUnknown and never a bare pool error.
func TestOtherCallsNothingSentIsNotUnknown(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := c.TryAcquire(ctx, "k1", 10*time.Second, nil); err != nil {
		t.Fatal(err)
	}

	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"ForceRelease", func(ctx context.Context) error { _, err := c.ForceRelease(ctx, "k1", "test"); return err }},
		{"PauseGrants", func(ctx context.Context) error { _, err := c.PauseGrants(ctx, "k", "test"); return err }},
		{"ResumeGrants", func(ctx context.Context) error { _, err := c.ResumeGrants(ctx, "k", "test"); return err }},
		{"List", func(ctx context.Context) error { _, err := c.List(ctx); return err }},
		{"Get", func(ctx context.Context) error { _, err := c.Get(ctx, "k1"); return err }},
		{"History", func(ctx context.Context) error { _, err := c.History(ctx, "k1", 10); return err }},
		{"Pauses", func(ctx context.Context) error { _, err := c.Pauses(ctx); return err }},
		{"fair Acquire", func(ctx context.Context) error {
			_, err := c.Acquire(ctx, "k2", 10*time.Second, &leases.AcquireOptions{Fair: true, MaxWait: 100 * time.Millisecond})
			return err
		}},
	}

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range calls {
		if err := tc.call(canceled); !errors.Is(err, context.Canceled) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Errorf("%s with a canceled context: %v, want context.Canceled", tc.name, err)
		}
	}

	pool.Close()
	for _, tc := range calls {
		if err := tc.call(ctx); !errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Errorf("%s on a closed pool: %v, want ErrUnavailable", tc.name, err)
		}
	}
}

// A read changes nothing, so a connection that breaks after it was sent is
// ErrUnavailable, not an unknown outcome: there is no outcome to resolve.
func TestReadCutIsUnavailable(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	p := newProxy(t, db.URL)
	c := newClient(t, proxiedPool(t, db.URL, p), &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, time.Minute)
	l, err := c.TryAcquire(ctx, "k1", 10*time.Second, manual()) // only the reads go through the cuts
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()

	for _, tc := range []struct {
		name, sql string
		call      func() error
	}{
		{"List", "lease_status", func() error { _, err := c.List(ctx); return err }},
		{"Get", "lease_status", func() error { _, err := c.Get(ctx, "k1"); return err }},
		{"History", "lease_events", func() error { _, err := c.History(ctx, "k1", 10); return err }},
		{"Pauses", "grant_pauses", func() error { _, err := c.Pauses(ctx); return err }},
	} {
		for _, cut := range []struct {
			name string
			arm  func(func(faultproxy.Message) bool) *faultproxy.Trigger
		}{{"before", p.CutBefore}, {"after", p.CutAfter}} {
			trig := cut.arm(faultproxy.SQLContains(tc.sql))
			err := tc.call()
			select {
			case <-trig.Done():
			case <-time.After(5 * time.Second):
				trig.Cancel()
			}
			if !trig.Fired() {
				t.Errorf("%s: the read was not cut %s sending (%v)", tc.name, cut.name, err)
				continue
			}
			if !errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
				t.Errorf("%s cut %s sending: %v, want ErrUnavailable", tc.name, cut.name, err)
			}
		}
	}

	// The caller's deadline passes while the reply is on its way: the
	// context's error, neither an outage nor an unknown outcome.
	if _, err := c.Get(ctx, "k1"); err != nil { // a connection in the pool
		t.Fatal(err)
	}
	p.SetBlackhole(faultproxy.ServerToClient, true)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = c.Get(short, "k1")
	p.Heal()
	p.CutAll()
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Errorf("Get past its deadline: %v, want context.DeadlineExceeded only", err)
	}
}
