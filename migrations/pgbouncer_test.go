package migrations_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgbouncer"
	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// behindPgBouncer returns a fresh database on a cluster of its own, and a
// function that opens pools on it through a transaction-mode PgBouncer
// with poolSize server connections. pgx must not use named prepared
// statements there (PgBouncer 1.18).
func behindPgBouncer(t *testing.T, poolSize int) (*pgfencetest.Database, func() *pgxpool.Pool) {
	t.Helper()
	cluster := pgfencetest.NewCluster(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := pgbouncer.Start(ctx, &pgbouncer.Config{Upstream: cluster.Addr(), Credential: pgcluster.At(cluster.Addr()).Credential(), PoolSize: poolSize})
	if err != nil {
		if errors.Is(err, pgbouncer.ErrNotFound) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	db := cluster.NewDatabase(t)
	open := func() *pgxpool.Pool {
		t.Helper()
		cfg, err := pgxpool.ParseConfig(b.ConnString(db.Name) + "&default_query_exec_mode=exec")
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	return db, open
}

// Several migrators at once through a transaction-mode PgBouncer: each
// migration is applied once, every Up succeeds, and no lock is left behind,
// so the next Up and Status return at once. With a session advisory lock,
// the lock and its unlock landed on different server connections.
func TestPgBouncerConcurrentUp(t *testing.T) {
	t.Parallel()
	db, open := behindPgBouncer(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round := range 3 {
		if _, err := db.Pool.Exec(ctx, `DROP SCHEMA pgfence CASCADE`); err != nil {
			t.Fatal(err)
		}
		const n = 4
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			pool := open()
			wg.Add(1)
			go func() {
				defer wg.Done()
				m, err := migrations.New(pool, &migrations.Config{LockTimeout: time.Minute})
				if err != nil {
					errs[i] = err
					return
				}
				defer m.Close()
				_, errs[i] = m.Up(ctx)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d, migrator %d: %v", round, i, err)
			}
		}
		vs := appliedVersions(t, db.Pool)
		seen := map[int64]bool{}
		for _, v := range vs {
			if seen[v] {
				t.Fatalf("round %d: migration %d applied twice: %v", round, v, vs)
			}
			seen[v] = true
		}
		if !slices.Equal(vs, migrations.Versions()) {
			t.Fatalf("round %d: versions %v, want each of %v once", round, vs, migrations.Versions())
		}
		if n := lockRows(t, db.Pool); n != 0 {
			t.Fatalf("round %d: %d lock rows left", round, n)
		}
		// No lock left on a pooled server connection: the next runs return at once.
		m := newMigrator(t, open())
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		if rs, err := m.Up(qctx); err != nil || len(rs) != 0 {
			t.Fatalf("round %d: Up after the concurrent ones: %v, %v", round, rs, err)
		}
		if _, err := m.Status(qctx); err != nil {
			t.Fatalf("round %d: Status after the concurrent ones: %v", round, err)
		}
		qcancel()
	}
}

// Through PgBouncer, a held lock makes Up fail after LockTimeout with the
// holder named, Status answers at once, and a lapsed lease is taken over.
func TestPgBouncerHeldLock(t *testing.T) {
	t.Parallel()
	db, open := behindPgBouncer(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holdLock(t, db.Pool, "paused-migrator", time.Hour)
	m, err := migrations.New(open(), &migrations.Config{LockTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, err = m.Up(ctx)
	var le *migrations.LockedError
	if !errors.As(err, &le) || le.Holder.Application != "paused-migrator" || le.Holder.Host != "build-7" {
		t.Fatalf("Up through PgBouncer with the lock held: %v, want a *LockedError naming the holder", err)
	}
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if _, err := m.Status(sctx); err != nil {
		t.Fatalf("Status through PgBouncer with the lock held: %v", err)
	}

	holdLock(t, db.Pool, "crashed-migrator", -time.Second)
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("Up through PgBouncer after a crashed migrator: %v", err)
	}
	if n := lockRows(t, db.Pool); n != 0 {
		t.Fatalf("%d lock rows left", n)
	}
}

// The retention floor through a transaction-mode PgBouncer: advancing it,
// reading it, refusing a superseded token and pruning, each a statement of
// its own on whichever server connection the pooler picks.
func TestRetentionThroughPgBouncer(t *testing.T) {
	t.Parallel()
	db, open := behindPgBouncer(t, 2)
	pooled := open()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := leases.New(pooled, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := &retentionRig{t: t, ctx: ctx, pool: pooled, client: c}
	ended := r.acquireAndWrite("bouncer/ended")
	if err := ended.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := r.acquireAndWrite("bouncer/reused")
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := c.TryAcquire(ctx, "bouncer/reused", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	retention, err := pgfence.AdvanceRetention(ctx, pooled)
	if err != nil || retention < second.Token() {
		t.Fatalf("advance through PgBouncer: %d %v, want at least %d", retention, err, second.Token())
	}
	if state, err := pgfence.TokenFloor(ctx, pooled); err != nil || state.Retention != retention {
		t.Fatalf("token floor through PgBouncer: %+v %v, want retention %d", state, err, retention)
	}
	if _, err := pgfence.Exec(ctx, pooled, first, `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("a superseded token through PgBouncer: %v, want stale", err)
	}
	// An hour later (rows moved back, directly) the ended lease and both
	// fence rows go; the live lease stays.
	backdate(t, db.Pool, 2*time.Hour, "bouncer/ended")
	if p, err := pgfence.PruneRetired(ctx, pooled, 100); err != nil || p.Leases != 1 || p.Fences != 2 {
		t.Fatalf("prune through PgBouncer: %+v %v, want 1 lease, 2 fence rows", p, err)
	}
	if _, err := pgfence.Exec(ctx, pooled, second, `SELECT 1`); err != nil {
		t.Fatalf("the live holder after the prune, through PgBouncer: %v", err)
	}
	if _, err := pgfence.Exec(ctx, pooled, ended, `SELECT 1`); !errors.Is(err, pgfence.ErrTokenNotIssued) {
		t.Fatalf("the pruned lease's token through PgBouncer: %v, want not issued", err)
	}
}
