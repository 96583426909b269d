package pgfence_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestFenceSQL(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	issue(t, pool, "r")
	var got int64
	if err := pool.QueryRow(ctx, `SELECT pgfence.fence('r', 5)`).Scan(&got); err != nil || got != 5 {
		t.Fatalf("first fence: %d, %v", got, err)
	}
	mustExec(t, pool, `SELECT pgfence.fence('r', 5)`) // equal passes
	mustExec(t, pool, `SELECT pgfence.fence('r', 9)`)
	_, err := pool.Exec(ctx, `SELECT pgfence.fence('r', 7)`)
	if sqlstate(err) != "PF001" {
		t.Fatalf("stale fence: want PF001, got %v", err)
	}
	var st *pgfence.StaleTokenError
	if !errors.As(pgfence.MapError(err), &st) || st.Resource != "r" || st.Presented != 7 || st.Accepted != 9 {
		t.Fatalf("stale fence: got %#v", st)
	}
	var token, writes int64
	if err := pool.QueryRow(ctx, `SELECT token, writes FROM pgfence.fences WHERE resource = 'r'`).Scan(&token, &writes); err != nil {
		t.Fatal(err)
	}
	if token != 9 || writes != 3 {
		t.Fatalf("fence row: token %d writes %d, want 9 and 3", token, writes)
	}
	for _, q := range []string{
		`SELECT pgfence.fence('', 1)`,
		`SELECT pgfence.fence(repeat('x', 513), 1)`,
		`SELECT pgfence.fence('r', 0)`,
		`SELECT pgfence.fence(NULL, 1)`,
	} {
		if _, err := pool.Exec(ctx, q); sqlstate(err) != "PF008" {
			t.Errorf("%s: want PF008, got %v", q, err)
		}
	}
	// The accepted token can never be lowered or forgotten, not even by DML
	// that bypasses pgfence.fence().
	for q, says := range map[string]string{
		`UPDATE pgfence.fences SET token = 1 WHERE resource = 'r'`:                     "may not be lowered",
		`DELETE FROM pgfence.fences WHERE resource = 'r'`:                              "may not be deleted",
		`TRUNCATE pgfence.fences`:                                                      "may not be deleted",
		`UPDATE pgfence.fences SET resource = 'other' WHERE resource = 'r'`:            "may not be moved to resource other",
		`UPDATE pgfence.fences SET resource = 'other', token = 1 WHERE resource = 'r'`: "may not be moved to resource other",
	} {
		if _, err := pool.Exec(ctx, q); sqlstate(err) != "PF001" || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: want PF001 saying %q, got %v", q, says, err)
		}
	}
}

// A failed fence in the caller's transaction leaves nothing behind; a fence in
// a transaction that rolls back is not accepted.
func TestFenceRollback(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	issue(t, pool, "r")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, `SELECT pgfence.fence('r', 100)`)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.LookupFence(ctx, pool, "r"); !errors.Is(err, pgfence.ErrNotFound) {
		t.Fatalf("after rollback: want ErrNotFound, got %v", err)
	}
	mustExec(t, pool, `SELECT pgfence.fence('r', 3)`) // 100 was never accepted
}

func setupKV(t testing.TB, db execer) {
	t.Helper()
	mustExec(t, db, `CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL, token bigint NOT NULL)`)
	mustExec(t, db, `INSERT INTO kv VALUES ('a', 'init', 0)`)
	issue(t, db, "kv:a")
}

func TestWrite(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	write := func(token int64, v string) (pgfence.Receipt, error) {
		return pgfence.Write(ctx, pool, pgfence.LeaseOf("kv:a", "", token), func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`, v, token)
			return err
		})
	}
	rc, err := write(10, "ten")
	if err != nil || rc.Token != 10 || rc.Resource != "kv:a" {
		t.Fatalf("write 10: %+v, %v", rc, err)
	}
	called := false
	_, err = pgfence.Write(ctx, pool, pgfence.LeaseOf("kv:a", "", 9), func(ctx context.Context, tx pgx.Tx) error { called = true; return nil })
	var st *pgfence.StaleTokenError
	if !errors.As(err, &st) || !errors.Is(err, pgfence.ErrStaleToken) || st.Presented != 9 || st.Accepted != 10 || st.Resource != "kv:a" {
		t.Fatalf("write 9: want stale (9 < 10), got %v", err)
	}
	if called {
		t.Fatal("fn ran for a stale token")
	}
	rc2, err := write(10, "ten again")
	if err != nil {
		t.Fatalf("equal token: %v", err)
	}
	// fn's error rolls the acceptance back.
	boom := errors.New("boom")
	if _, err := pgfence.Write(ctx, pool, pgfence.LeaseOf("kv:a", "", 50), func(context.Context, pgx.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("fn error: got %v", err)
	}
	if st, err := pgfence.LookupFence(ctx, pool, "kv:a"); err != nil || st.Token != 10 || st.Writes != 2 || st.Op != rc2.Op || rc2.Op == rc.Op {
		t.Fatalf("accepted after fn error: %+v, %v; want token 10, 2 writes, the second write's op %s", st, err, rc2.Op)
	}
	var v string
	if err := pool.QueryRow(ctx, `SELECT v FROM kv WHERE k = 'a'`).Scan(&v); err != nil || v != "ten again" {
		t.Fatalf("row: %q, %v", v, err)
	}
	if _, err := pgfence.Write(ctx, pool, pgfence.LeaseOf("", "", 1), func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, pgfence.ErrInvalid) {
		t.Fatalf("empty resource: %v", err)
	}
	if _, err := pgfence.Write(ctx, pool, pgfence.LeaseOf("r", "", 0), func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, pgfence.ErrInvalid) {
		t.Fatalf("zero token: %v", err)
	}
}

// Inside the caller's transaction Write is a savepoint: a rejection does not
// abort the caller's transaction, and nothing is accepted until it commits.
func TestWriteInCallerTransaction(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	mustExec(t, pool, `SELECT pgfence.fence('kv:a', 20)`)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = pgfence.Write(ctx, tx, pgfence.LeaseOf("kv:a", "", 19), func(ctx context.Context, tx pgx.Tx) error { return nil })
	if !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("want stale, got %v", err)
	}
	if _, err := pgfence.Write(ctx, tx, pgfence.LeaseOf("kv:a", "", 21), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE kv SET v = 'in tx', token = 21 WHERE k = 'a'`)
		return err
	}); err != nil {
		t.Fatalf("write in caller tx after a rejection: %v", err)
	}
	if st, _ := pgfence.LookupFence(ctx, pool, "kv:a"); st.Token != 20 {
		t.Fatalf("token visible before the caller committed: %d", st.Token)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := pgfence.LookupFence(ctx, pool, "kv:a"); st.Token != 21 {
		t.Fatalf("after commit: token %d, want 21", st.Token)
	}
}

func TestExec(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	n, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 7), `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`, "seven", int64(7))
	if err != nil || n != 1 {
		t.Fatalf("exec 7: %d rows, %v", n, err)
	}
	// The rows are the statement's, not the fence's (whose SELECT returns one).
	if n, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 7), `UPDATE kv SET v = v WHERE false`); err != nil || n != 0 {
		t.Fatalf("exec of an UPDATE of no row: %d rows, %v", n, err)
	}
	_, err = pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 6), `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`, "six", int64(6))
	var st *pgfence.StaleTokenError
	if !errors.As(err, &st) || st.Accepted != 7 || st.Presented != 6 {
		t.Fatalf("exec 6: want stale, got %v", err)
	}
	// A failing statement rolls back the acceptance (one implicit transaction).
	_, err = pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 8), `UPDATE kv SET v = NULL WHERE k = 'a'`)
	if sqlstate(err) != "23502" {
		t.Fatalf("not-null violation: got %v", err)
	}
	if st, _ := pgfence.LookupFence(ctx, pool, "kv:a"); st.Token != 7 {
		t.Fatalf("accepted %d after a failed statement, want 7", st.Token)
	}
	var v string
	var tok int64
	if err := pool.QueryRow(ctx, `SELECT v, token FROM kv WHERE k = 'a'`).Scan(&v, &tok); err != nil || v != "seven" || tok != 7 {
		t.Fatalf("row %q %d %v", v, tok, err)
	}
	// Inside a caller's transaction.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, tx, pgfence.LeaseOf("kv:a", "", 8), `UPDATE kv SET v = 'eight', token = 8 WHERE k = 'a'`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := pgfence.LookupFence(ctx, pool, "kv:a"); st.Token != 8 {
		t.Fatalf("accepted %d, want 8", st.Token)
	}
}

// Under REPEATABLE READ a fence whose snapshot predates a newer accepted
// token never passes: it fails as stale or with a serialization error
// (ErrIsolation), for an existing resource and for one first fenced after the
// snapshot was taken.
func TestFenceRepeatableRead(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	issue(t, pool, "old", "new")
	mustExec(t, pool, `SELECT pgfence.fence('old', 1)`)
	for _, resource := range []string{"old", "new"} {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, tx, `SELECT count(*) FROM pgfence.fences`) // take the snapshot
		mustExec(t, pool, `SELECT pgfence.fence($1, 10)`, resource)
		_, err = pgfence.Exec(ctx, tx, pgfence.LeaseOf(resource, "", 5), `SELECT 1`)
		if !errors.Is(err, pgfence.ErrStaleToken) && !errors.Is(err, pgfence.ErrIsolation) {
			t.Fatalf("%s: token 5 under REPEATABLE READ after 10 was accepted: %v", resource, err)
		}
		_ = tx.Rollback(ctx)
	}
}

// An accepted token must be as durable as the write it guards: in a session
// with synchronous_commit off (or local), pgfence.fence() raises it to on for
// its transaction only.
func TestFenceForcesSynchronousCommit(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	issue(t, conn, "r")
	for _, session := range []string{"off", "local", "remote_apply"} {
		mustExec(t, conn, `SELECT set_config('synchronous_commit', $1, false)`, session)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, tx, `SELECT pgfence.fence('r', 1)`)
		var inTx string
		if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&inTx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"off": "on", "local": "on", "remote_apply": "remote_apply"}[session]
		var after string
		if err := conn.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if inTx != want || after != session {
			t.Fatalf("session %s: synchronous_commit %s in the fence's transaction (want %s), %s after (want %s)", session, inTx, want, after, session)
		}
	}
}

// Reads and grants refuse bad names before the round trip.
func TestReadsRefuseBadNames(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	if _, err := pgfence.LookupFence(ctx, pool, ""); !errors.Is(err, pgfence.ErrInvalid) {
		t.Errorf("LookupFence(\"\"): %v, want ErrInvalid", err)
	}
	if _, err := pgfence.LookupFence(ctx, pool, "kv:\xff"); !errors.Is(err, pgfence.ErrInvalid) {
		t.Errorf("LookupFence of invalid UTF-8: %v, want ErrInvalid", err)
	}
}
