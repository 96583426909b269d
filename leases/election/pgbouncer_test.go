package election_test

import (
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgbouncer"
	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/election"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Behind PgBouncer in transaction mode, with wake-ups off (no LISTEN): the
// followers poll, and still see every change of leadership in order; a
// resignation and a leader whose lease ran out (backdated: as if it had
// died) are both followed by a new leader, found by the followers' reads
// within a few BackoffMax; the replaced leader's term ends as lost.
func TestElectionBehindPgBouncer(t *testing.T) {
	checkLeaks(t)
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	b, err := pgbouncer.Start(ctx, &pgbouncer.Config{Upstream: cluster.Addr(), Credential: pgcluster.At(cluster.Addr()).Credential(), PoolSize: 3})
	if err != nil {
		if errors.Is(err, pgbouncer.ErrNotFound) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	const backoffMax = 200 * time.Millisecond
	var rs []*replica
	for _, name := range []string{"a", "b", "c"} {
		// A process of its own: its own pool through the pooler, which
		// shares 3 server connections among all of them. PgBouncer 1.18 in
		// transaction mode: no named prepared statements.
		cfg, err := pgxpool.ParseConfig(b.ConnString(db.Name))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		cfg.MaxConns = 3
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		client := newClient(t, pool, &leases.Config{DisableWakeups: true, BackoffMax: backoffMax})
		rs = append(rs, startReplicaWith(t, client, "pooled/leader", name, election.Config{TTL: 3 * time.Second}))
	}

	first := oneLeader(t, rs, nil)
	term1 := first.e.Term()
	start := time.Now()
	if err := first.e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	second := oneLeader(t, rs, first)
	t.Logf("after a resignation, %s leads, found by polling in %s", second.name, time.Since(start))
	term2 := second.e.Term()
	if term2.Token() <= term1.Token() {
		t.Fatalf("term %d after %d", term2.Token(), term1.Token())
	}

	// The second leader's lease runs out by the database clock: a follower
	// polls, finds it over and is elected; the second leader's renewal is
	// refused and its term ends as lost.
	backdate(t, db.Pool, "pooled/leader", 0)
	start = time.Now()
	third := oneLeader(t, rs, second)
	t.Logf("after an expiry, %s leads, found by polling in %s", third.name, time.Since(start))
	eventually(t, 10*time.Second, "the replaced leader's term ends as lost", func() bool {
		cause, ok := second.stopCause(term2.Token())
		return ok && errors.Is(cause, pgfence.ErrLeaseLost)
	})

	// Every replica saw the same terms in the same order, each once.
	want := rs[0].terms()
	if len(want) < 3 {
		t.Fatalf("%s saw terms %v, want 3", rs[0].name, want)
	}
	for _, r := range rs[1:] {
		if got := r.terms(); !slices.Equal(got, want) {
			t.Errorf("%s saw terms %v, %s saw %v", r.name, got, rs[0].name, want)
		}
	}
	if !slices.IsSorted(want) {
		t.Errorf("terms out of order: %v", want)
	}
}
