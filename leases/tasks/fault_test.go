package tasks_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// holdingWorker enqueues five tasks on key, the third of which the worker
// holds inside its batch's transaction, starts a consumer worker and waits
// until it holds that task. It returns the worker and the tasks' ids.
func holdingWorker(t *testing.T, ctx context.Context, db *pgfencetest.Database, key string) (*workerproc.Worker, []int64) {
	t.Helper()
	if _, err := db.Pool.Exec(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := range 5 {
		task, err := tasks.Enqueue(ctx, db.Pool, key, []byte(fmt.Sprintf(`{"i":%d,"hold":%t}`, i, i == 2)), nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	w := workerproc.Start(t, "consumer", nil)
	if err := w.Call(ctx, "open", consumerArgs{URL: db.URL, TTL: time.Minute}, nil); err != nil {
		t.Fatal(err)
	}
	for {
		var st consumerStatus
		if err := w.Call(ctx, "status", nil, &st); err != nil {
			t.Fatal(err)
		}
		if st.Held == ids[2] {
			return w, ids
		}
		if st.Held != 0 {
			t.Fatalf("the worker holds task %d, want %d", st.Held, ids[2])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// takeOver ends the worker's lease on key by the database clock and runs a
// consumer of this process until every task is done.
func takeOver(t *testing.T, ctx context.Context, pool *pgxpool.Pool, key string, n int) {
	t.Helper()
	leasetest.Backdate(t, pool, tasks.LeaseKey(key), 0)
	c, err := tasks.NewConsumer(newClient(t, pool, nil), ledgerApply("takeover", nil, nil), &tasks.Config{PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	waitDone(t, ctx, pool, n)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A consumer killed (SIGKILL) in the middle of a batch leaves nothing of it:
// its transaction rolls back, the next consumer applies every task once and
// in order, and the interrupted batch counts one attempt for each of its
// tasks.
func TestConsumerKilledMidBatch(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	const key = "sku/killed"
	w, ids := holdingWorker(t, ctx, db, key)
	if err := w.Kill(); err != nil {
		t.Fatal(err)
	}
	takeOver(t, ctx, db.Pool, key, len(ids))
	reconcile(t, ctx, db.Pool, len(ids))
	var byWorker, attempts int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger WHERE by = 'worker'), (SELECT min(attempts) FROM pgfence.tasks)`).
		Scan(&byWorker, &attempts); err != nil {
		t.Fatal(err)
	}
	if byWorker != 0 || attempts != 1 {
		t.Fatalf("%d ledger rows by the killed worker, fewest attempts %d; want 0 and 1", byWorker, attempts)
	}
}

// A consumer stopped (SIGSTOP) in the middle of a batch past its lease,
// taken over, then resumed: the takeover applies every task once, and the
// stale consumer's batch is refused and rolls back (it logs the lost lease).
func TestConsumerPausedPastItsLease(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	const key = "sku/paused"
	w, ids := holdingWorker(t, ctx, db, key)
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	takeOver(t, ctx, db.Pool, key, len(ids))
	if err := w.Cont(); err != nil {
		t.Fatal(err)
	}
	if err := w.Call(ctx, "release", nil, nil); err != nil {
		t.Fatal(err)
	}
	for {
		var st consumerStatus
		if err := w.Call(ctx, "status", nil, &st); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(strings.Join(st.Warnings, "\n"), fmt.Sprintf("%q lost: taken over", tasks.LeaseKey(key))) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the resumed worker did not report its lost lease; it logged %q", st.Warnings)
		case <-time.After(10 * time.Millisecond):
		}
	}
	reconcile(t, ctx, db.Pool, len(ids))
}

// The database refuses a stale consumer: once another consumer took the key's
// lease over, the first one's completion and failure records are refused
// with PF002 (pgfence.ErrLeaseLost), whatever it applied rolls back with
// them, and its tasks were counted as interrupted by the takeover's claim.
func TestStaleConsumerRefused(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	const key = "sku/stale"
	task, err := tasks.Enqueue(ctx, pool, key, []byte(`{}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	oldHolder, oldToken := grantConsumer(t, ctx, pool, key)
	claim := func(holder string, token int64) int {
		var n int
		for range 2 { // the first claim takes the mark, the second numbers
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.task_claim($1, $2::uuid, $3)`, key, holder, token).Scan(&n); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}
	if n := claim(oldHolder, oldToken); n != 1 {
		t.Fatalf("claimed %d tasks, want 1", n)
	}
	leasetest.Backdate(t, pool, tasks.LeaseKey(key), 0)
	newHolder, newToken := grantConsumer(t, ctx, pool, key)
	if n := claim(newHolder, newToken); n != 1 {
		t.Fatalf("the takeover claimed %d tasks, want 1", n)
	}
	for name, sql := range map[string]string{
		"task_complete": `SELECT pgfence.task_complete($1, $2::uuid, $3, ARRAY[$4::bigint], NULL)`,
		"task_fail":     `SELECT pgfence.task_fail($1, $2::uuid, $3, $4, 'late')`,
	} {
		_, err := pool.Exec(ctx, sql, key, oldHolder, oldToken, task.ID)
		if pgerr.Code(err) != pgerr.CodeLeaseNotHeld || !errors.Is(pgfence.MapError(err), pgfence.ErrLeaseLost) {
			t.Errorf("%s by the stale consumer: %v, want PF002 (lease lost)", name, err)
		}
	}
	st, err := tasks.Status(ctx, pool, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != tasks.StateRunning || st.Attempts != 1 {
		t.Fatalf("status %+v, want running under the takeover with one interrupted attempt", st)
	}
	if _, err := pool.Exec(ctx, `SELECT pgfence.task_complete($1, $2::uuid, $3, ARRAY[$4::bigint], NULL)`, key, newHolder, newToken, task.ID); err != nil {
		t.Fatalf("the takeover's completion: %v", err)
	}
}
