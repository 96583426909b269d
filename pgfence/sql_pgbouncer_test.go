package pgfence_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/pgbouncer"
	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Behind PgBouncer in transaction mode, which hands out its three server
// connections round robin, so one client's consecutive transactions reach
// different backends, the guarantee tests hold through every
// API, driver and handle: no helper relies on session state (a prepared
// statement, a setting) surviving from one transaction to the next. Each
// driver is configured as PgBouncer 1.18 needs: pgx in exec mode
// (default_query_exec_mode=exec), lib/pq with binary_parameters=yes —
// without it lib/pq sends a statement with arguments outside a transaction
// in two round trips, which the pooler may send to two backends
// ("unnamed prepared statement does not exist"): the rejection audit and
// Resolve, which run outside the write's transaction, then fail.
func TestBehindPgBouncer(t *testing.T) {
	t.Parallel()
	cluster := pgfencetest.NewCluster(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := pgbouncer.Start(ctx, &pgbouncer.Config{Upstream: cluster.Addr(), Credential: pgcluster.At(cluster.Addr()).Credential(), RoundRobin: true, PoolSize: 3})
	if err != nil {
		if errors.Is(err, pgbouncer.ErrNotFound) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	for _, g := range []struct {
		name string
		body func(t *testing.T, c connector, db *pgfencetest.Database, f fencer)
	}{{"stale token", staleTokenRefused}, {"lost lease", lostLeaseRefused}} {
		t.Run(g.name, func(t *testing.T) {
			for _, c := range connectors {
				t.Run(c.name, func(t *testing.T) {
					db := cluster.NewDatabase(t)
					if _, err := b.Warm(ctx, db.Name, 3); err != nil {
						t.Fatal(err)
					}
					url := b.ConnString(db.Name)
					if c.driver == "lib/pq" {
						url += "&binary_parameters=yes"
					} else {
						url += "&default_query_exec_mode=exec"
					}
					g.body(t, c, db, c.open(t, url))
				})
			}
		})
	}
}
