package pgfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Resolve's NotApplied is final. A fenced increment is sent, then held in the
// network past the caller's deadline (ErrOutcomeUnknown); Resolve answers
// NotApplied; the caller retries with the same token, as it may; then the
// held request is delivered. It must not commit: one intent, one increment.
func TestResolveNotAppliedIsFinal(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	mustExec(t, db.Pool, `CREATE TABLE counter (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db.Pool, `INSERT INTO counter VALUES (1, 0)`)
	l := grant(t, db.Pool, "counter:1")
	const increment = `UPDATE counter SET n = n + 1 WHERE id = 1`

	conn, p := proxied(t, db)
	// The same statements once first, under another lease, so that they are
	// prepared and the held request is a single pipeline: fence, increment,
	// Sync. (A write with the same token would make Resolve's answer
	// Superseded: it cannot tell which of two writes with one token came last.)
	warm := grant(t, db.Pool, "counter:warm-up")
	if _, err := pgfence.Exec(ctx, conn, warm.lease(), increment); err != nil {
		t.Fatal(err)
	}
	held := conn.PgConn().PID()
	p.SetHold(faultproxy.ClientToServer, true)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := pgfence.Exec(short, conn, l.lease(), increment)
	cancel()
	var unknown *pgfence.OutcomeUnknownError
	if !errors.As(err, &unknown) {
		t.Fatalf("Exec held past its deadline: %v, want *OutcomeUnknownError", err)
	}
	o, err := pgfence.Resolve(ctx, db.Pool, unknown)
	if err != nil || o != pgfence.NotApplied {
		t.Fatalf("Resolve: %v, %v; want NotApplied", o, err)
	}
	if _, err := pgfence.Exec(ctx, db.Pool, l.lease(), increment); err != nil { // the retry
		t.Fatal(err)
	}

	// The held pipeline arrives now; the server runs it and refuses it.
	p.SetHold(faultproxy.ClientToServer, false)
	waitGone(t, db.Pool, held)
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("counter = %d (%v) after the held request arrived, want 2: NotApplied was contradicted", n, err)
	}
	var abandoned int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.abandoned_requests WHERE id = $1 AND kind = 'fence'`, unknown.Op).Scan(&abandoned); err != nil || abandoned != 1 {
		t.Fatalf("abandonment record: %d, %v", abandoned, err)
	}
}

// An abandoned write that reaches the server is refused with PF013, from SQL
// too; Resolve refuses a transaction, where its abandonment could not commit
// before its probe.
func TestAbandonedWriteIsRefused(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	issue(t, pool, "r")
	op := newHolder()
	if _, err := pool.Exec(ctx, `SELECT pgfence.abandon_fence('r', $1)`, op); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, `SELECT pgfence.fence('r', 1, $1)`, op)
	if sqlstate(err) != "PF013" || !errors.Is(pgfence.MapError(err), pgfence.ErrAbandoned) {
		t.Fatalf("a fence of an abandoned op: %v, want PF013 / ErrAbandoned", err)
	}
	// First write of the resource and a later one take the same check.
	if _, err := pool.Exec(ctx, `SELECT pgfence.fence('r', 1, gen_random_uuid())`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pgfence.fence('r', 2, $1)`, op); sqlstate(err) != "PF013" {
		t.Fatalf("a later fence of an abandoned op: %v, want PF013", err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := pgfence.Resolve(ctx, tx, &pgfence.OutcomeUnknownError{Resource: "r", Token: 1, Op: pgfence.OpID{1}}); !errors.Is(err, pgfence.ErrInvalid) {
		t.Fatalf("Resolve in a transaction: %v, want ErrInvalid", err)
	}
}

// waitGone waits until the backend pid has exited: the pipeline it was sent
// ran, and the Terminate that followed it ended the session.
func waitGone(t *testing.T, db pgfence.DB, pid uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = $1`, int64(pid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("backend %d did not exit", pid)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
