package tasks_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgbouncer"
	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Behind PgBouncer in transaction mode, where a session's LISTEN does not
// stay on one server connection: producers enqueue inside their
// transactions and two consumers with wake-ups off poll, through the pooler's
// few server connections, and every committed task is applied exactly once,
// each key in sequence order.
func TestConsumersBehindPgBouncer(t *testing.T) {
	checkLeaks(t)
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	if _, err := db.Pool.Exec(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	b, err := pgbouncer.Start(ctx, &pgbouncer.Config{Upstream: cluster.Addr(), Credential: pgcluster.At(cluster.Addr()).Credential(), PoolSize: 4})
	if err != nil {
		if errors.Is(err, pgbouncer.ErrNotFound) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	pooled := func() *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(b.ConnString(db.Name))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // no named statements in transaction mode
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}

	for _, by := range []string{"a", "b"} {
		client := newClient(t, pooled(), &leases.Config{DisableWakeups: true})
		c, err := tasks.NewConsumer(client, ledgerApply(by, nil, nil), &tasks.Config{Batch: 4, PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(cctx) }()
		t.Cleanup(func() {
			stop()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}

	producers := pooled()
	const perProducer = 15
	var wg sync.WaitGroup
	var committed sync.Map
	for p := range 4 {
		wg.Go(func() {
			for i := range perProducer {
				// Every third one's business transaction rolls back: no task.
				err := pgx.BeginFunc(ctx, producers, func(tx pgx.Tx) error {
					if _, err := tasks.Enqueue(ctx, tx, fmt.Sprint("sku/", i%3), []byte(fmt.Sprintf(`{"p":%d,"i":%d}`, p, i)), nil); err != nil {
						return err
					}
					if i%3 == 2 {
						return errRollback
					}
					return nil
				})
				switch {
				case err == nil:
					committed.Store(fmt.Sprint(p, "/", i), true)
				case !errors.Is(err, errRollback):
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	n := 0
	committed.Range(func(any, any) bool { n++; return true })
	waitDone(t, ctx, db.Pool, n)
	reconcile(t, ctx, db.Pool, n)
}

var errRollback = errors.New("the business transaction rolls back")
