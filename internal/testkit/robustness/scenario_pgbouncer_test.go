package robustness

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/testkit/pgbouncer"
	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// PgBouncer in transaction mode: leases without wake-ups,
// fenced writes into a protected table and idempotency keys keep every
// guarantee when consecutive statements of one client connection reach
// different server backends. pgx must not use named prepared statements
// there (PgBouncer 1.18): default_query_exec_mode=exec or simple_protocol.
func TestScenarioPgBouncerTransactionMode(t *testing.T) {
	cluster := pgfencetest.NewCluster(t, nil)
	ctx := bounded(t, 2*time.Minute)
	b, err := pgbouncer.Start(ctx, &pgbouncer.Config{Upstream: cluster.Addr(), Credential: pgcluster.At(cluster.Addr()).Credential(), PoolSize: 3})
	if err != nil {
		if errors.Is(err, pgbouncer.ErrNotFound) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	direct := cluster.NewDatabase(t)
	if _, err := direct.Pool.Exec(ctx, `
		CREATE TABLE counters (name text PRIMARY KEY, n bigint NOT NULL, last_token bigint NOT NULL);
		CREATE TABLE effects (intent text NOT NULL, result text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := pgfence.Protect(ctx, direct.Pool, pgx.Identifier{"counters"}, "name", "counter/"); err != nil {
		t.Fatal(err)
	}

	for _, mode := range []string{"exec", "simple_protocol"} {
		sub := mode
		t.Run(sub, func(t *testing.T) {
			url := b.ConnString(direct.Name) + "&default_query_exec_mode=" + mode
			assertPooled(t, ctx, url)
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 8
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()

			// The lease's key is the resource its tokens fence: the row
			// name of table counters under the guard's prefix.
			name := "c-" + sub
			resource := "counter/" + name
			client, err := leases.New(pool, &leases.Config{DisableWakeups: true, BackoffMax: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()

			// 6 workers × 5 rounds: lease, fenced increment, release.
			const workers, rounds = 6, 5
			var mu sync.Mutex
			var tokens []int64
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range rounds {
						actx, cancel := context.WithTimeout(ctx, 30*time.Second)
						l, err := client.Acquire(actx, resource, 10*time.Second, nil)
						cancel()
						if err != nil {
							t.Errorf("acquire through PgBouncer: %v", err)
							return
						}
						if err := l.Renew(ctx); err != nil {
							t.Errorf("renew through PgBouncer: %v", err)
						}
						if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf(resource, "", l.Token()),
							`INSERT INTO counters VALUES ($1, 1, $2) ON CONFLICT (name) DO UPDATE SET n = counters.n + 1, last_token = $2`, name, l.Token()); err != nil {
							t.Errorf("fenced write through PgBouncer: %v", err)
						}
						mu.Lock()
						tokens = append(tokens, l.Token())
						mu.Unlock()
						if err := l.Release(ctx); err != nil {
							t.Errorf("release through PgBouncer: %v", err)
						}
					}
				}()
			}
			wg.Wait()
			var n, last int64
			if err := direct.Pool.QueryRow(ctx, `SELECT n, last_token FROM counters WHERE name = $1`, name).Scan(&n, &last); err != nil {
				t.Fatal(err)
			}
			if n != workers*rounds || len(tokens) != workers*rounds {
				t.Fatalf("counter %d after %d grants, want %d (no lost update)", n, len(tokens), workers*rounds)
			}
			seen := map[int64]bool{}
			highest := int64(0)
			for _, tok := range tokens {
				if seen[tok] {
					t.Fatalf("token %d issued twice", tok)
				}
				seen[tok] = true
				highest = max(highest, tok)
			}
			if last != highest {
				t.Fatalf("final row written with token %d, want the highest %d", last, highest)
			}

			// A stale token and an unfenced write are refused through the pooler too.
			if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf(resource, "", tokens[0]), `UPDATE counters SET n = 0 WHERE name = $1`, name); !errors.Is(err, pgfence.ErrStaleToken) {
				t.Fatalf("stale write through PgBouncer: %v, want ErrStaleToken", err)
			}
			if _, err := pool.Exec(ctx, `UPDATE counters SET n = 0 WHERE name = $1`, name); !errors.Is(pgfence.MapError(err), pgfence.ErrUnfencedWrite) {
				t.Fatalf("unfenced write through PgBouncer: %v, want ErrUnfencedWrite", err)
			}

			// Duplicates of one intent: one effect, one result.
			store, err := idempotency.NewStore(nil)
			if err != nil {
				t.Fatal(err)
			}
			results := make([]string, 8)
			for i := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out, err := store.Do(ctx, pool, idempotency.Request{Scope: "pgbouncer", Key: "intent-" + sub}, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, "intent-"+sub, mode)
						return []byte(mode), err
					})
					if err != nil {
						t.Errorf("idempotent Do through PgBouncer: %v", err)
						return
					}
					results[i] = string(out.Result)
				}()
			}
			wg.Wait()
			var effects int
			if err := direct.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE intent = $1`, "intent-"+sub).Scan(&effects); err != nil {
				t.Fatal(err)
			}
			if effects != 1 {
				t.Fatalf("%d effects for one intent through PgBouncer, want 1", effects)
			}
			for i, r := range results {
				if r != mode {
					t.Errorf("duplicate %d got %q, want %q", i, r, mode)
				}
			}
		})
	}
}

// assertPooled proves the test really runs through a transaction pooler: more
// client connections than the pooler's 3 server connections stay connected
// and all keep working, which a session pooler (or none) would not allow.
func assertPooled(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	const clients = 5
	conns := make([]*pgx.Conn, clients)
	for i := range conns {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.WithoutCancel(ctx))
		conns[i] = c
	}
	for round := range 2 {
		for i, c := range conns {
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			var one int
			err := c.QueryRow(qctx, `SELECT 1`).Scan(&one)
			cancel()
			if err != nil {
				t.Fatalf("round %d, client %d of %d over 3 server connections: %v (not transaction pooling?)", round, i, clients, err)
			}
		}
	}
}
