package robustness

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// Split brain: after a failover, the old primary is started again as it
// was (not as a standby of the new one: no HA manager fenced it off). It is
// a primary on the old timeline and grants leases and accepts writes there,
// into a history the new primary never sees. What pgfence does about it:
//
//   - a lease client that has seen a grant of the new timeline refuses a
//     grant of an older one (ErrNotPrimary): its epoch check;
//   - a client that never saw the new timeline is granted a lease on the
//     old primary, with a token of the old timeline: the database it talks
//     to is a primary, and nothing in it can tell;
//   - that token is below every token of the new timeline, so once the
//     new primary has accepted a write with one, a write with it is
//     refused there as stale.
//
// Fencing the old primary off (it must come back as a standby, or not at
// all) is the HA manager's job; pgfence only keeps the two histories from
// mixing where a client or the new primary can tell.
func TestScenarioOldPrimaryRestartedAsItWas(t *testing.T) {
	e := newEnv(t, envOptions{dedicated: true, resources: []string{sku}})
	ctx := bounded(t, 3*time.Minute)
	primary := pgcluster.At(e.cluster.Addr())
	standby, err := primary.StartStandby(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	if err := primary.WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}

	// Client A's pool connects to whichever server the test points it at.
	var target atomic.Int32
	target.Store(int32(primary.Port()))
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "pf-split-a"
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.Port = uint16(target.Load())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	a, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	point := func(c *pgcluster.Cluster) {
		target.Store(int32(c.Port()))
		pool.Reset()
	}

	l1, err := a.TryAcquire(ctx, sku, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := primary.WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}

	// Failover, then the old primary comes back as it was.
	if err := primary.Stop(pgcluster.Fast); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if err := primary.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if in, err := primary.InRecovery(ctx); err != nil || in {
		t.Fatalf("the old primary restarted as it was: in recovery %v (%v), want a primary", in, err)
	}

	// A moves to the new primary and is granted a token of timeline 2.
	point(standby)
	l2, err := a.TryAcquire(ctx, sku, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token()>>40 != 2 || l2.Token() <= l1.Token() {
		t.Fatalf("grant on the new primary: token %d (timeline %d) after %d, want timeline 2", l2.Token(), l2.Token()>>40, l1.Token())
	}
	newPrimary, err := pgxpool.New(ctx, standby.ConnString(e.db.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(newPrimary.Close)
	if _, err := pgfence.Exec(ctx, newPrimary, pgfence.LeaseOf(sku, "", l2.Token()), writeSQL, sku, "a-new", l2.Token()); err != nil {
		t.Fatalf("write on the new primary with its grant: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A client that never saw timeline 2 is granted a lease there.
	b := e.local(1, nil) // e.db.URL: the old primary, on the port it kept
	zombie := want(t, e.recorded(1, func() Op { return b.acquire(ctx, "zombie/"+sku, time.Minute, 0) }), OK)
	if zombie.Token>>40 != 1 {
		t.Fatalf("grant on the old primary: token %d of timeline %d, want timeline 1", zombie.Token, zombie.Token>>40)
	}
	old := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)
	if old.Token>>40 != 1 || old.Token >= l2.Token() {
		t.Fatalf("grant of %s on the old primary: token %d, want one of timeline 1, below %d", sku, old.Token, l2.Token())
	}
	// The old primary accepts a write with it, into its own history.
	if _, err := pgfence.Exec(ctx, b.pool, pgfence.LeaseOf(sku, "", old.Token), writeSQL, sku, "b-old", old.Token); err != nil {
		t.Fatalf("write on the old primary with its own grant: %v", err)
	}
	// The new primary refuses it: a higher token was accepted there.
	if _, err := pgfence.Exec(ctx, newPrimary, pgfence.LeaseOf(sku, "", old.Token), writeSQL, sku, "b-old", old.Token); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("write on the new primary with a token of the old primary's timeline: %v, want ErrStaleToken", err)
	}

	// Pointed back at the old primary, A refuses what it grants.
	point(primary)
	if l, err := a.TryAcquire(ctx, "other/"+sku, time.Minute, nil); !errors.Is(err, pgfence.ErrNotPrimary) {
		t.Fatalf("grant on the old primary to a client that saw timeline 2: lease %v, error %v; want ErrNotPrimary", l, err)
	}

	t.Logf("tokens: %d before the failover; %d on the new primary (timeline 2); %d granted by the old primary restarted as it was (timeline 1), refused by the new one",
		l1.Token(), l2.Token(), old.Token)
}
