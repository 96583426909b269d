package leases_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A release that was not sent (or whose outcome is unknown) does not claim
// the lease released: it stays held until its trust window runs out or a
// later Release is confirmed, and KeepAlive no longer renews it.
func TestReleaseNotSentKeepsLease(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)
	canceled, cancel := context.WithCancel(ctx)
	cancel()

	// Retried with a live context, the release goes through.
	l, err := c.TryAcquire(ctx, "retried", 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(canceled); err == nil {
		t.Fatal("Release with a canceled context succeeded")
	}
	if l.Err() != nil {
		t.Fatalf("lease ended by a release that was not sent: %v", l.Err())
	}
	if st, err := c.Get(ctx, "retried"); err != nil || !st.Live {
		t.Fatalf("row after a release that was not sent: %+v %v", st, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l.Err(), leases.ErrReleased) {
		t.Fatalf("lease after the retried release: %v", l.Err())
	}
	if st, err := c.Get(ctx, "retried"); err != nil || st.Live {
		t.Fatalf("row after the retried release: %+v %v", st, err)
	}

	// Not retried: KeepAlive stops renewing (the holder asked to stop) and
	// the lease ends when its trust window runs out.
	const ttl = time.Second
	l, err = c.TryAcquire(ctx, "abandoned", ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(canceled); err == nil {
		t.Fatal("Release with a canceled context succeeded")
	}
	start := time.Now()
	err = l.KeepAlive(ctx, &leases.KeepAliveOptions{Interval: 100 * time.Millisecond})
	if !errors.Is(err, leases.ErrLeaseLost) || time.Since(start) < ttl/2 {
		t.Fatalf("KeepAlive after a release that was not sent: %v after %s, want ErrLeaseLost when the trust window runs out", err, time.Since(start))
	}
	if !errors.Is(l.Err(), leases.ErrLeaseLost) {
		t.Fatalf("lease after its trust window: %v", l.Err())
	}
	if st, err := c.Get(ctx, "abandoned"); err != nil || !st.RenewedAt.IsZero() {
		t.Fatalf("KeepAlive renewed a lease its holder asked to release: %+v %v", st, err)
	}
}
