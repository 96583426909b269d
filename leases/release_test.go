package leases_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A release that was not sent (or whose outcome is unknown) does not claim
// the lease released: it stays held until its trust window runs out or a
// later Release is confirmed, and the keep-alive no longer renews it.
func TestReleaseNotSentKeepsLease(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	var renewals atomic.Int64
	leases.SetOnEvent(c, func(e leases.LogEvent) {
		if e.Kind == leases.LogRenewed {
			renewals.Add(1)
		}
	})
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

	// Not retried: the keep-alive stops renewing (the holder asked to stop)
	// and the lease ends when its trust window runs out. It renews every
	// 20 ms until then; a renewal already sent may still commit.
	const ttl = time.Second
	l, err = c.TryAcquire(ctx, "abandoned", ttl, &leases.AcquireOptions{RenewInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for renewals.Load() < 2 {
		select {
		case <-l.Context().Done():
			t.Fatalf("lease ended while kept alive: %v", l.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := l.Release(canceled); err == nil {
		t.Fatal("Release with a canceled context succeeded")
	}
	start := time.Now()
	before := renewals.Load()
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("lease still held 5 s after a release that was not sent (%d renewals since): the keep-alive renewed it", renewals.Load()-before)
	}
	if err := l.Err(); !errors.Is(err, pgfence.ErrLeaseLost) || time.Since(start) < ttl/2 {
		t.Fatalf("lease after a release that was not sent: %v after %s, want ErrLeaseLost when the trust window runs out", err, time.Since(start))
	}
	if n := renewals.Load() - before; n > 1 {
		t.Fatalf("%d renewals of a lease its holder asked to release, want at most the one already sent", n)
	}
}

// A release that finds its grant already ended by someone else (an operator's
// ForceRelease) says the lease was lost; releases of the same lease, one
// after the other or at once, return nil.
func TestReleaseAfterForceReleaseIsLost(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)

	// Not kept alive: a refused renewal would end it before the release.
	l, err := c.TryAcquire(ctx, "k", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ForceRelease(ctx, "k", "op"); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("release of a force-released grant: %v, want ErrLeaseLost", err)
	}
	if !errors.Is(l.Err(), pgfence.ErrLeaseLost) {
		t.Fatalf("lease after the release of a force-released grant: %v", l.Err())
	}
	if err := l.Release(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("second release of a force-released grant: %v, want ErrLeaseLost", err)
	}

	// Do reports it too when the operator acts while fn runs.
	err = c.Do(ctx, "k", 10*time.Second, nil, func(ctx context.Context, l *leases.Lease) error {
		_, err := c.ForceRelease(ctx, "k", "op")
		return err
	})
	if !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("Do whose lease was force-released: %v, want ErrLeaseLost", err)
	}

	// Concurrent releases of one lease all succeed.
	l, err = c.TryAcquire(ctx, "k", 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 5)
	for range 5 {
		go func() { errs <- l.Release(ctx) }()
	}
	for range 5 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent release: %v", err)
		}
	}
	if err := l.Release(ctx); err != nil || !errors.Is(l.Err(), leases.ErrReleased) {
		t.Fatalf("release after concurrent releases: %v, lease %v", err, l.Err())
	}
}

// After a lost release reply, a retry that finds the grant released asks the
// history who released it.
func TestReleaseRetryAfterLostReply(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	proxy := newProxy(t, db.URL)
	// After a cut, every retry needs a new connection.
	pool := proxiedPool(t, db.URL, proxy, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)

	// The leases are not kept alive: the pool's one connection and the cuts
	// are for the releases.
	// The lost release committed: the retry finds it.
	l, err := c.TryAcquire(ctx, "mine", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	trig := proxy.CutAfter(faultproxy.SQLContains("pgfence.release"))
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release retried after a lost reply: %v", err)
	}
	if !trig.Fired() || !errors.Is(l.Err(), leases.ErrReleased) {
		t.Fatalf("cut fired %v, lease %v", trig.Fired(), l.Err())
	}

	// A pooler answers the release it forwarded with its FATAL 08P01
	// (PgBouncer's "server conn crashed?") and refuses the retries: an
	// unknown outcome, like a closed connection, never "not sent". Another
	// holder takes the key meanwhile; the next retry learns from the history
	// that the release by this grant's holder id committed.
	l, err = c.TryAcquire(ctx, "pooled", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	proxy.SetPoolerFatal(true)
	trig = proxy.CutAfter(faultproxy.SQLContains("pgfence.release"))
	proxy.SetRefuse(true) // the pool's one connection is open: only retries need a new one
	if err := l.Release(ctx); !errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("release answered by the pooler's FATAL after it committed, retries refused: %v, want ErrOutcomeUnknown", err)
	}
	proxy.SetPoolerFatal(false)
	if !trig.Replied() {
		t.Fatal("the server did not finish the forwarded release")
	}
	next, err := leasesClient(t, db).TryAcquire(ctx, "pooled", 10*time.Second, nil)
	if err != nil {
		t.Fatalf("the key after the release committed: %v", err)
	}
	defer next.Release(ctx)
	proxy.SetRefuse(false)
	if err := l.Release(ctx); err != nil || !errors.Is(l.Err(), leases.ErrReleased) {
		t.Fatalf("retried release after the key's next grant: %v (lease %v), want it confirmed from the history", err, l.Err())
	}

	// The lost release never arrived and an operator ended the grant before
	// the retry: the retry says the lease was lost.
	l, err = c.TryAcquire(ctx, "forced", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	proxy.CutBefore(faultproxy.SQLContains("pgfence.release"))
	proxy.SetRefuse(true)
	if err := l.Release(ctx); !errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("release whose reply was lost and whose retries were refused: %v, want ErrOutcomeUnknown", err)
	}
	if l.Err() != nil {
		t.Fatalf("lease ended by a release of unknown outcome: %v", l.Err())
	}
	if _, err := leasesClient(t, db).ForceRelease(ctx, "forced", "op"); err != nil {
		t.Fatal(err)
	}
	proxy.SetRefuse(false)
	if err := l.Release(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("retried release of a force-released grant: %v, want ErrLeaseLost", err)
	}
}
