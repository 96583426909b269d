package tasks_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func countTasks(t *testing.T, ctx context.Context, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.tasks`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Bad input gets a clear error and writes nothing: from the Go client before
// anything is sent, and from the SQL function (PF008) for other clients.
func TestBadInputWritesNothing(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	big := `"` + strings.Repeat("x", tasks.MaxPayloadBytes) + `"`
	for name, c := range map[string]struct {
		key     string
		payload string
		opts    *tasks.EnqueueOptions
	}{
		"empty key":         {"", `{}`, nil},
		"oversized key":     {strings.Repeat("k", tasks.MaxKeyBytes+1), `{}`, nil},
		"key with NUL":      {"a\x00b", `{}`, nil},
		"oversized payload": {"k", big, nil},
		"payload not JSON":  {"k", `{"a":`, nil},
		"empty payload":     {"k", ``, nil},
		"negative backlog":  {"k", `{}`, &tasks.EnqueueOptions{MaxBacklog: -1}},
		"oversized idem":    {"k", `{}`, &tasks.EnqueueOptions{IdempotencyKey: strings.Repeat("i", 257)}},
	} {
		if _, err := tasks.Enqueue(ctx, pool, c.key, []byte(c.payload), c.opts); !errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	for name, q := range map[string]string{
		"empty key":         `SELECT * FROM pgfence.task_enqueue('', '{}')`,
		"oversized key":     `SELECT * FROM pgfence.task_enqueue(repeat('k', 481), '{}')`,
		"NULL payload":      `SELECT * FROM pgfence.task_enqueue('k', NULL)`,
		"oversized payload": `SELECT * FROM pgfence.task_enqueue('k', to_jsonb(repeat('x', 65536)))`,
		"zero backlog":      `SELECT * FROM pgfence.task_enqueue('k', '{}', NULL, 0)`,
		"empty idem key":    `SELECT * FROM pgfence.task_enqueue('k', '{}', '')`,
	} {
		if _, err := pool.Exec(ctx, q); !errors.Is(pgfence.MapError(err), pgfence.ErrInvalid) {
			t.Errorf("SQL, %s: %v, want PF008", name, err)
		}
	}
	if n := countTasks(t, ctx, pool); n != 0 {
		t.Fatalf("%d tasks written by bad input", n)
	}
	if _, err := tasks.Status(ctx, pool, 12345); !errors.Is(err, pgfence.ErrNotFound) {
		t.Fatalf("status of an unknown task: %v, want ErrNotFound", err)
	}
}

// A full backlog refuses the next enqueue (ErrBacklogFull, PF016) and
// writes nothing; a duplicate of an idempotency key still gets its task.
func TestBacklogBound(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	opts := &tasks.EnqueueOptions{MaxBacklog: 3, IdempotencyKey: "order-1"}
	first, err := tasks.Enqueue(ctx, pool, "k", []byte(`{"n":1}`), opts)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := tasks.Enqueue(ctx, pool, "k", []byte(`{}`), &tasks.EnqueueOptions{MaxBacklog: 3}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tasks.Enqueue(ctx, pool, "k", []byte(`{}`), &tasks.EnqueueOptions{MaxBacklog: 3}); !errors.Is(err, pgfence.ErrBacklogFull) {
		t.Fatalf("enqueue past the backlog: %v, want ErrBacklogFull", err)
	}
	if _, err := tasks.Enqueue(ctx, pool, "other", []byte(`{}`), &tasks.EnqueueOptions{MaxBacklog: 3}); err != nil {
		t.Fatalf("another key's backlog: %v", err)
	}
	dup, err := tasks.Enqueue(ctx, pool, "k", []byte(`{"n":1}`), opts)
	if err != nil || !dup.Duplicate || dup.ID != first.ID {
		t.Fatalf("duplicate enqueue: %+v, %v; want task %d again", dup, err, first.ID)
	}
	if n := countTasks(t, ctx, pool); n != 4 {
		t.Fatalf("%d tasks, want 4", n)
	}
}

// An idempotency key returns the first task to a duplicate, also to one
// racing it in another transaction, and refuses another payload.
func TestEnqueueIdempotencyKey(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	opts := &tasks.EnqueueOptions{IdempotencyKey: "order-7"}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	first, err := tasks.Enqueue(ctx, tx, "k", []byte(`{"qty":1}`), opts)
	if err != nil {
		t.Fatal(err)
	}
	raced := make(chan tasks.Task, 1)
	go func() {
		dup, err := tasks.Enqueue(ctx, pool, "k", []byte(`{"qty":1}`), opts) // waits for tx
		if err != nil {
			t.Error(err)
		}
		raced <- dup
	}()
	time.Sleep(50 * time.Millisecond) // let the duplicate meet the uncommitted row (either way the answer is the same)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if dup := <-raced; !dup.Duplicate || dup.ID != first.ID {
		t.Fatalf("racing duplicate: %+v, want task %d", dup, first.ID)
	}
	if _, err := tasks.Enqueue(ctx, pool, "k", []byte(`{"qty":2}`), opts); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("same key, another payload: %v, want a mismatch", err)
	}
	if n := countTasks(t, ctx, pool); n != 1 {
		t.Fatalf("%d tasks, want 1", n)
	}
}

// A duplicate of an idempotency key that an open transaction is enqueueing
// waits for it only up to the session's lock_timeout (5 s at most), then
// gets ErrInProgress and writes nothing; the wait leaves the session's
// lock_timeout as it was.
func TestEnqueueIdempotencyKeyInFlight(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	opts := &tasks.EnqueueOptions{IdempotencyKey: "order-8"}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	first, err := tasks.Enqueue(ctx, tx, "k", []byte(`{"qty":1}`), opts)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET lock_timeout = '150ms'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.Enqueue(ctx, conn, "k", []byte(`{"qty":1}`), opts); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("duplicate of a key in flight: %v, want ErrInProgress", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	dup, err := tasks.Enqueue(ctx, conn, "k", []byte(`{"qty":1}`), opts)
	if err != nil || !dup.Duplicate || dup.ID != first.ID {
		t.Fatalf("duplicate once the first committed: %+v, %v, want task %d", dup, err, first.ID)
	}
	if n := countTasks(t, ctx, pool); n != 1 {
		t.Fatalf("%d tasks, want 1", n)
	}
	// The session's setting, in and after a transaction that enqueued.
	for _, set := range []string{"0", "3s"} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, set); err != nil {
			t.Fatal(err)
		}
		if _, err := tasks.Enqueue(ctx, tx, "k", []byte(`{}`), &tasks.EnqueueOptions{IdempotencyKey: "t-" + set}); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&got); err != nil || got != set {
			t.Fatalf("lock_timeout after an enqueue: %q (%v), want %q", got, err, set)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// On database/sql, a task enqueued in a transaction that rolls back does not
// exist; one that commits does, and its status reads back.
func TestEnqueueSQLJoinsTheTransaction(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	for _, commit := range []bool{false, true} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		task, err := tasks.EnqueueSQL(ctx, tx, "k", []byte(`{}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		end := tx.Rollback
		if commit {
			end = tx.Commit
		}
		if err := end(); err != nil {
			t.Fatal(err)
		}
		st, err := tasks.StatusSQL(ctx, db, task.ID)
		switch {
		case commit && (err != nil || st.State != tasks.StatePending):
			t.Fatalf("committed task: %+v, %v", st, err)
		case !commit && !errors.Is(err, pgfence.ErrNotFound):
			t.Fatalf("rolled-back task: %+v, %v; want ErrNotFound", st, err)
		}
	}
}

// loginRole creates a login role in group granted prefix, and a pool as it.
func loginRole(t *testing.T, ctx context.Context, db *pgfencetest.Database, prefix string) *pgxpool.Pool {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "pgfence_t_tasks_" + hex.EncodeToString(b[:])
	if _, err := db.Pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{name}.Sanitize()+` LOGIN PASSWORD 'pw' IN ROLE pgfence_app`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, $2)`, name, prefix); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = name, "pw"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// A producer granted "orders/" enqueues there and nowhere else, cannot take
// the consumer lease of its keys, and sees the status of its own tasks only;
// the keys' consumer sees the status of every task of them, as it sees
// their rows.
func TestTenancy(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	producer := loginRole(t, ctx, db, "orders/")
	other := loginRole(t, ctx, db, "orders/")
	consumer := loginRole(t, ctx, db, tasks.LeaseKey("orders/"))
	billing := loginRole(t, ctx, db, tasks.LeaseKey("billing/"))
	task, err := tasks.Enqueue(ctx, producer, "orders/1", []byte(`{}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.Enqueue(ctx, producer, "billing/1", []byte(`{}`), nil); !errors.Is(err, pgfence.ErrNotGranted) {
		t.Fatalf("enqueue outside the prefix: %v, want ErrNotGranted", err)
	}
	if _, err := producer.Exec(ctx, `SELECT * FROM pgfence.try_acquire(pgfence.task_lease_key('orders/1'), interval '1 minute')`); !errors.Is(pgfence.MapError(err), pgfence.ErrNotGranted) {
		t.Fatalf("a producer takes the consumer lease: %v, want ErrNotGranted", err)
	}
	if _, err := tasks.Status(ctx, producer, task.ID); err != nil {
		t.Fatalf("own status: %v", err)
	}
	if _, err := tasks.Status(ctx, other, task.ID); !errors.Is(err, pgfence.ErrNotFound) {
		t.Fatalf("another role's status: %v, want ErrNotFound", err)
	}
	var rows int
	if err := consumer.QueryRow(ctx, `SELECT count(*) FROM pgfence.tasks`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("the consumer sees %d task rows (%v), want 1", rows, err)
	}
	if st, err := tasks.Status(ctx, consumer, task.ID); err != nil || st.ID != task.ID {
		t.Fatalf("the key's consumer reads the status: %+v, %v", st, err)
	}
	if _, err := tasks.Status(ctx, billing, task.ID); !errors.Is(err, pgfence.ErrNotFound) {
		t.Fatalf("another keys' consumer reads the status: %v, want ErrNotFound", err)
	}
	var visible int
	if err := other.QueryRow(ctx, `SELECT count(*) FROM pgfence.tasks`).Scan(&visible); err != nil || visible != 0 {
		t.Fatalf("another producer sees %d task rows (%v), want 0", visible, err)
	}
}
