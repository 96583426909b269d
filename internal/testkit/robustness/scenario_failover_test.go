package robustness

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/pgfence"
)

// Primary failover, asynchronous and synchronous standby. A holds the lease
// and writes; the standby is promoted after the primary crashes. A standby
// grants nothing while in recovery. After promotion, tokens continue above
// every token the old primary handed out, even one it acknowledged but never
// replicated (async): the timeline is in the token's high bits. The new
// holder's writes stand and the old holder's token is rejected.
//
// With an async standby, what the old primary acknowledged after the standby
// fell behind is lost by design; those operations are recorded as unknown
// (the checker then allows both). With a sync standby nothing acknowledged is
// lost, and they are recorded as acknowledged.
func TestScenarioFailover(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(map[bool]string{false: "async", true: "sync"}[sync], func(t *testing.T) {
			e := newEnv(t, envOptions{dedicated: true, resources: []string{sku}})
			ctx := bounded(t, 3*time.Minute)
			a := e.local(0, nil)
			t1 := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)
			want(t, e.recorded(0, func() Op { return a.write(ctx, sku, t1.Token, "a1") }), OK)
			want(t, e.recorded(0, func() Op { return a.effect(ctx, "order-1", "a") }), OK)

			primary := pgcluster.At(e.cluster.Addr())
			standby, err := primary.StartStandby(ctx, &pgcluster.StandbyConfig{Sync: sync})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = standby.Close() })
			if err := primary.WaitReplayed(ctx, standby); err != nil {
				t.Fatal(err)
			}
			standbyURL := standby.ConnString(e.db.Name)

			// In recovery the standby grants nothing.
			ro, err := newActor(ctx, actorConfig{URL: standbyURL, App: "pf-standby-reader", MaxConns: 2})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ro.leases.TryAcquire(ctx, "other", time.Minute, nil); !errors.Is(err, pgfence.ErrNotPrimary) {
				t.Fatalf("grant on a standby: %v, want ErrNotPrimary", err)
			}
			ro.close()

			afterLag := OK // how A's operations from now on are recorded
			if !sync {
				// The standby falls behind: what follows is acknowledged by
				// the old primary only.
				if err := standby.Stop(pgcluster.Fast); err != nil {
					t.Fatal(err)
				}
				afterLag = Unknown
			}
			want(t, e.recorded(0, func() Op { return a.release(ctx, sku) }), OK)
			t2 := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)
			if t2.Token <= t1.Token {
				t.Fatalf("second grant %d not above %d", t2.Token, t1.Token)
			}
			for _, op := range []Op{
				e.recorded(0, func() Op { return a.write(ctx, sku, t2.Token, "a2") }),
				e.recorded(0, func() Op { return a.effect(ctx, "order-2", "a") }),
			} {
				want(t, op, OK)
			}
			if afterLag == Unknown {
				lost := e.rec.MarkUnknown(func(op Op) bool { return op.Value == "a2" || op.Key == "order-2" },
					"acknowledged by a primary that was lost before its async standby had it")
				if lost != 2 {
					t.Fatalf("marked %d operations unknown, want 2", lost)
				}
			}

			// The primary crashes; the standby is promoted.
			if err := primary.Kill(); err != nil {
				t.Fatal(err)
			}
			if !sync {
				if err := standby.Start(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := standby.Promote(ctx); err != nil {
				t.Fatal(err)
			}
			pool, err := pgxpool.New(ctx, standbyURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			e.promoted = pool

			// Clients move to the new primary; the lease A holds is still
			// there (sync) or its first grant is (async). It expires.
			e.backdate(sku)
			b, err := newActor(ctx, actorConfig{URL: standbyURL, App: "pf-new-primary-1", MaxConns: 4})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.close)
			t3 := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)
			if t3.Token <= t2.Token {
				t.Fatalf("after failover the token %d is not above %d, which the old primary acknowledged", t3.Token, t2.Token)
			}
			want(t, e.recorded(1, func() Op { return b.write(ctx, sku, t3.Token, "b1") }), OK)
			a2, err := newActor(ctx, actorConfig{URL: standbyURL, App: "pf-new-primary-0", MaxConns: 4})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(a2.close)
			want(t, e.recorded(0, func() Op { return a2.write(ctx, sku, t2.Token, "a3") }), Stale)
			want(t, e.recorded(1, func() Op { return b.effect(ctx, "order-1", "b") }), OK)

			tr, _ := e.reconcile(ctx)
			if f := tr.Final[sku]; f.Value != "b1" || f.Token != t3.Token {
				t.Fatalf("final %+v, want b1 with token %d", f, t3.Token)
			}
			if sync && tr.Stored["order-2"] != "a" {
				t.Fatalf("sync failover lost an acknowledged intent: stored %q", tr.Stored["order-2"])
			}
			t.Logf("tokens: %d, %d (old primary), %d (new primary, %s)", t1.Token, t2.Token, t3.Token, fmt.Sprintf("timeline %d", t3.Token>>40))
		})
	}
}
