package leases_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A release whose reply was lost committed, and a waiter took the key before
// the retry: the retry finds the key held by another grant (not_held). The
// release was this lease's own, so Release returns nil and the lease ends as
// released, not lost, and is counted as released (not as a stale holder's
// not_held).
func TestReleaseRetryAfterTakeover(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	proxy := newProxy(t, db.URL)
	// After the cut, every retry needs a new connection.
	pool := proxiedPool(t, db.URL, proxy, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	p := telemetrytest.New(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, MeterProvider: p.Meter})
	other := leasesClient(t, db)
	ctx := ctxTimeout(t, 30*time.Second)

	l, err := c.TryAcquire(ctx, "k", 10*time.Second, manual()) // the pool's one connection is for the release
	if err != nil {
		t.Fatal(err)
	}
	// The release commits, its reply is lost, and its retries are refused.
	trig := proxy.CutAfter(faultproxy.SQLContains("pgfence.release"))
	proxy.SetRefuse(true)
	if err := l.Release(ctx); !errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("release whose reply was lost and whose retries were refused: %v, want ErrOutcomeUnknown", err)
	}
	if !trig.Replied() {
		t.Fatal("the release did not commit before the cut")
	}
	// A waiter takes the key the release freed.
	next, err := other.TryAcquire(ctx, "k", 10*time.Second, nil)
	if err != nil {
		t.Fatalf("the key after the committed release: %v", err)
	}
	proxy.SetRefuse(false)
	if err := l.Release(ctx); err != nil {
		t.Errorf("retried release of a grant this lease released: %v, want nil", err)
	}
	if !errors.Is(l.Err(), leases.ErrReleased) {
		t.Errorf("lease after the retried release: %v, want ErrReleased", l.Err())
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	m := p.Metrics(t)
	if n := ops(m, "release", "not_held"); n != 0 {
		t.Errorf("operations{release, not_held} = %d, want 0", n)
	}
	if n := ops(m, "release", "released"); n != 1 {
		t.Errorf("operations{release, released} = %d, want 1", n)
	}
}
