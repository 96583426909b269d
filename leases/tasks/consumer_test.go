package tasks_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// reconcile checks the ledger against the tasks: every committed task is
// done and was applied exactly once (one ledger row), and each key's rows,
// in the order they committed, are its tasks in sequence order 1, 2, 3...
func reconcile(t *testing.T, ctx context.Context, pool *pgxpool.Pool, want int) {
	t.Helper()
	var tasksN, done, ledgerN, distinct int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgfence.tasks), (SELECT count(*) FROM pgfence.tasks WHERE state = 'done'),
	        (SELECT count(*) FROM ledger), (SELECT count(DISTINCT task) FROM ledger)`).Scan(&tasksN, &done, &ledgerN, &distinct); err != nil {
		t.Fatal(err)
	}
	if tasksN != want || done != want || ledgerN != want || distinct != want {
		t.Fatalf("tasks %d (done %d), ledger rows %d (tasks %d); want %d of each", tasksN, done, ledgerN, distinct, want)
	}
	var bad int
	if err := pool.QueryRow(ctx, `
SELECT count(*) FROM (
  SELECT l.seq, t.seq AS task_seq, row_number() OVER (PARTITION BY l.key ORDER BY l.n) AS pos
    FROM ledger l JOIN pgfence.tasks t ON t.id = l.task) x
 WHERE x.seq <> x.pos OR x.task_seq <> x.pos`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	if bad != 0 {
		t.Fatalf("%d ledger rows out of sequence order", bad)
	}
}

// waitDone waits until n tasks are done.
func waitDone(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int) {
	t.Helper()
	for {
		var done int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.tasks WHERE state = 'done'`).Scan(&done); err != nil {
			t.Fatal(err)
		}
		if done >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d tasks done: %v", done, n, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Producers enqueue on a few hot keys, some inside business transactions
// that roll back, while three consumers apply: every committed task is
// applied exactly once, each key in sequence order, and the status of a task
// says done with its result.
func TestConsumersApplyEachTaskOnceInOrder(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	if _, err := db.Pool.Exec(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(ctx)
	var consumers sync.WaitGroup
	for i := range 3 {
		c, err := tasks.NewConsumer(newClient(t, db.Pool, nil), ledgerApply(fmt.Sprint("c", i), nil, nil),
			&tasks.Config{Batch: 7, PollInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			if err := c.Run(cctx); err != nil {
				t.Error(err)
			}
		}()
	}
	defer func() { stop(); consumers.Wait() }()

	var (
		producers sync.WaitGroup
		mu        sync.Mutex
		committed []int64
	)
	for p := range 4 {
		producers.Add(1)
		go func() {
			defer producers.Done()
			for i := range 30 {
				key := fmt.Sprintf("sku/%d", i%3)
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				task, err := tasks.Enqueue(ctx, tx, key, []byte(fmt.Sprintf(`{"i":%d}`, p*100+i)), nil)
				if err != nil {
					t.Error(err)
					_ = tx.Rollback(ctx)
					return
				}
				if i%5 == 4 {
					if err := tx.Rollback(ctx); err != nil {
						t.Error(err)
					}
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				committed = append(committed, task.ID)
				mu.Unlock()
			}
		}()
	}
	producers.Wait()
	if t.Failed() {
		return
	}
	waitDone(t, ctx, db.Pool, len(committed))
	reconcile(t, ctx, db.Pool, len(committed))
	st, err := tasks.Status(ctx, db.Pool, committed[0])
	if err != nil {
		t.Fatal(err)
	}
	if st.State != tasks.StateDone || st.Seq == 0 || string(st.Result) != fmt.Sprintf(`{"seq": %d}`, st.Seq) || st.FinishedAt.IsZero() {
		t.Fatalf("status %+v, want done with its result", st)
	}
}

// An idle consumer hears of a key's first task: with a poll interval of an
// hour, the task is applied all the same.
func TestConsumerWakesOnEnqueue(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := db.Pool.Exec(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.Enqueue(ctx, db.Pool, "first", []byte(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	runConsumer(t, ctx, db.Pool, &tasks.Config{PollInterval: time.Hour})
	waitDone(t, ctx, db.Pool, 1)
	// The consumer is idle once it has released the key, and listening once
	// its LISTEN connection has sent LISTEN.
	until(t, ctx, db.Pool, "the consumer released the key and listens", `SELECT
	    EXISTS (SELECT 1 FROM pgfence.leases WHERE key = $1 AND released_at IS NOT NULL)
	AND EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = $2 AND query LIKE 'LISTEN%')`,
		tasks.LeaseKey("first"), leasetest.ListenerApplicationName)
	if _, err := tasks.Enqueue(ctx, db.Pool, "second", []byte(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	waitDone(t, ctx, db.Pool, 2)
}

// One consumer and a key that never empties: the consumer turns to the
// other key all the same.
func TestConsumerServesEveryKey(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := db.Pool.Exec(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	produced := make(chan struct{})
	go func() { // keeps the hot key busy until the test ends
		defer close(produced)
		for pctx.Err() == nil {
			if _, err := tasks.Enqueue(pctx, db.Pool, "hot", []byte(`{}`), &tasks.EnqueueOptions{MaxBacklog: 1000000}); err != nil && pctx.Err() == nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { stop(); <-produced }()
	until(t, ctx, db.Pool, "the hot key has a backlog", `SELECT count(*) > 500 FROM pgfence.tasks WHERE key = 'hot'`)
	runConsumer(t, ctx, db.Pool, &tasks.Config{Batch: 1, PollInterval: 10 * time.Millisecond})
	until(t, ctx, db.Pool, "the hot key is being applied", `SELECT count(*) > 0 FROM ledger WHERE key = 'hot'`)
	cold, err := tasks.Enqueue(ctx, db.Pool, "cold", []byte(`{}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	until(t, ctx, db.Pool, "the cold key's task is applied", `SELECT state = 'done' FROM pgfence.tasks WHERE id = $1`, cold.ID)
}
