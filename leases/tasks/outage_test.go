package tasks_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// runConsumer runs a consumer with ledgerApply on pool until the test ends.
func runConsumer(t *testing.T, ctx context.Context, pool *pgxpool.Pool, cfg *tasks.Config) {
	t.Helper()
	c, err := tasks.NewConsumer(newClient(t, pool, nil), ledgerApply("c", nil, nil), cfg)
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

// A consumer's connection cut when its batch's COMMIT was sent (a lost
// reply: the batch committed) or before its completion reached the server
// (a lost request: nothing committed): every task is applied once, in order.
func TestConsumerConnectionCut(t *testing.T) {
	for name, arm := range map[string]func(*faultproxy.Proxy) *faultproxy.Trigger{
		"reply to COMMIT lost": func(p *faultproxy.Proxy) *faultproxy.Trigger { return p.CutAfter(faultproxy.IsCommit) },
		"task_complete not sent": func(p *faultproxy.Proxy) *faultproxy.Trigger {
			return p.CutBefore(faultproxy.SQLContains("task_complete"))
		},
	} {
		t.Run(name, func(t *testing.T) {
			db := pgfencetest.NewDatabase(t)
			ctx := ctxTimeout(t, time.Minute)
			if _, err := db.Pool.Exec(ctx, ledgerDDL); err != nil {
				t.Fatal(err)
			}
			const n = 20
			for i := range n {
				if _, err := tasks.Enqueue(ctx, db.Pool, fmt.Sprint("sku/", i%2), []byte(fmt.Sprintf(`{"i":%d}`, i)), nil); err != nil {
					t.Fatal(err)
				}
			}
			p := leasetest.NewProxy(t, db.URL)
			trigger := arm(p)
			runConsumer(t, ctx, leasetest.ProxiedPool(t, db.URL, p), &tasks.Config{Batch: 3, PollInterval: 10 * time.Millisecond})
			select {
			case <-trigger.Done():
			case <-ctx.Done():
				t.Fatal("the cut never happened")
			}
			waitDone(t, ctx, db.Pool, n)
			reconcile(t, ctx, db.Pool, n)
		})
	}
}

// An immediate restart (a crash: SIGKILL of the server, crash recovery)
// while producers enqueue and a consumer applies: producers retry what did
// not answer with the same idempotency key, and every intent is applied
// exactly once, each key in order.
func TestServerCrashRestart(t *testing.T) {
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	if _, err := db.Pool.Exec(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	runConsumer(t, ctx, db.Pool, &tasks.Config{Batch: 4, PollInterval: 10 * time.Millisecond, TTL: 2 * time.Second})
	const n = 60
	enqueue := func(i int) {
		for {
			_, err := tasks.Enqueue(ctx, db.Pool, fmt.Sprint("sku/", i%3), []byte(fmt.Sprintf(`{"i":%d}`, i)),
				&tasks.EnqueueOptions{IdempotencyKey: fmt.Sprint("order-", i)})
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // the server is down: try again
		}
	}
	for i := range n / 2 {
		enqueue(i)
	}
	if err := cluster.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for i := n / 2; i < n; i++ {
		enqueue(i)
	}
	waitDone(t, ctx, db.Pool, n)
	reconcile(t, ctx, db.Pool, n)
}
