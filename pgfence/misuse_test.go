package pgfence_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// mustPanic runs f and reports whether it panicked with "boom".
func mustPanic(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if p := recover(); p != "boom" {
			t.Fatalf("recovered %v, want the panic of fn to reach the caller", p)
		}
	}()
	f()
}

// A panic in fn rolls the transaction back on its way to the caller: the
// connection goes back to the pool, and the fence row (for a fenced Write) or
// the lease row (for a lease-checked one) is not left locked by an open
// transaction. It once was, until the backend was killed: every later writer
// of the resource waited, a takeover of the lease waited, and the pool's
// Close hung.
func TestPanicInFnRollsBack(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	issue(t, pool, "panic/1", "panic/2")
	boom := func(context.Context, pgx.Tx) error { panic("boom") }

	mustPanic(t, func() { _, _ = pgfence.Write(ctx, pool, pgfence.LeaseOf("panic/1", "", 1), boom) })
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired after fn panicked", n)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := pgfence.Write(wctx, pool, pgfence.LeaseOf("panic/1", "", 2), func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatalf("the next writer of the resource: %v", err)
	}

	lease := grant(t, pool, "panic/lease")
	mustPanic(t, func() { _, _ = pgfence.Write(ctx, pool, pgfence.Checked(lease.lease()), boom) })
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired after fn panicked", n)
	}
	// A takeover updates the lease row; FOR UPDATE NOWAIT fails at once if a
	// transaction still holds FOR SHARE on it.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = 'panic/lease' FOR UPDATE NOWAIT`)
		return err
	}); err != nil {
		t.Fatalf("the lease row is still locked after fn panicked: %v", err)
	}

	// Inside a caller's transaction only the savepoint is rolled back, and
	// the caller's transaction goes on.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	mustPanic(t, func() {
		_, _ = pgfence.Write(ctx, tx, pgfence.LeaseOf("panic/2", "", 1), func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `CREATE TEMP TABLE rolled_back (x int)`); err != nil {
				return err
			}
			panic("boom")
		})
	})
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'rolled_back'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("caller's transaction after the panic: %d tables, %v; want it usable, the savepoint rolled back", n, err)
	}
}

// fn must leave COMMIT and ROLLBACK to the helper. When it ends the
// transaction itself the helper cannot know the outcome: the error says so,
// wraps ErrInvalid and ErrOutcomeUnknown, and Resolve tells what happened.
func TestFnEndsTransactionItself(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	issue(t, pool, "ended/1")
	for _, tc := range []struct {
		end  func(context.Context, pgx.Tx) error
		want pgfence.Outcome
	}{
		{func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }, pgfence.NotApplied},
		{func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }, pgfence.Applied},
	} {
		_, err := pgfence.Write(ctx, pool, pgfence.LeaseOf("ended/1", "", 5), tc.end)
		var unknown *pgfence.OutcomeUnknownError
		if !errors.Is(err, pgfence.ErrInvalid) || !errors.As(err, &unknown) {
			t.Fatalf("fn ended the transaction: %v, want ErrInvalid and *OutcomeUnknownError", err)
		}
		if got, err := pgfence.Resolve(ctx, pool, unknown); err != nil || got != tc.want {
			t.Errorf("Resolve: %v, %v; want %v", got, err, tc.want)
		}
	}
	lease := grant(t, pool, "ended/lease")
	_, err := pgfence.Write(ctx, pool, pgfence.Checked(lease.lease()), func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) })
	if !errors.Is(err, pgfence.ErrInvalid) || !errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("lease-checked Write, fn committed: %v, want ErrInvalid and ErrOutcomeUnknown", err)
	}
}

// A nil db, or a nil pool in it, is refused as an invalid argument instead of
// a nil dereference inside.
func TestNilDB(t *testing.T) {
	ctx := testContext(t)
	noop := func(context.Context, pgx.Tx) error { return nil }
	lease := leaseRow{Key: "k", Holder: "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", Token: 1}
	for _, db := range []pgfence.DB{nil, (*pgxpool.Pool)(nil), (*pgx.Conn)(nil)} {
		for name, call := range map[string]func() error{
			"Write":         func() error { _, err := pgfence.Write(ctx, db, pgfence.LeaseOf("r", "", 1), noop); return err },
			"Exec":          func() error { _, err := pgfence.Exec(ctx, db, pgfence.LeaseOf("r", "", 1), `SELECT 1`); return err },
			"Write checked": func() error { _, err := pgfence.Write(ctx, db, pgfence.Checked(lease.lease()), noop); return err },
			"Exec checked":  func() error { _, err := pgfence.Exec(ctx, db, pgfence.Checked(lease.lease()), `SELECT 1`); return err },
			"Resolve": func() error {
				_, err := pgfence.Resolve(ctx, db, &pgfence.OutcomeUnknownError{Resource: "r", Token: 1, Op: pgfence.OpID{1}})
				return err
			},
			"LookupFence": func() error { _, err := pgfence.LookupFence(ctx, db, "r"); return err },
			"Protected":   func() error { _, err := pgfence.Protected(ctx, db); return err },
		} {
			if err := call(); !errors.Is(err, pgfence.ErrInvalid) {
				t.Errorf("%s with db %#v: %v, want ErrInvalid", name, db, err)
			}
		}
	}
}

// A lease whose key or holder the database would refuse is refused before
// any round trip, as ErrInvalid, like every other argument.
func TestLeaseArgumentsCheckedFirst(t *testing.T) {
	ctx := testContext(t)
	dead, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	const holder = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
	for _, l := range []leaseRow{
		{Key: "a\x00b", Holder: holder, Token: 1},
		{Key: "\xff", Holder: holder, Token: 1},
		{Key: "k", Holder: "3b2e1a4c0000400080000000000000-00", Token: 1},
		{Key: "k", Holder: "{" + holder, Token: 1},
	} {
		if _, err := pgfence.Write(ctx, dead, pgfence.Checked(l.lease()), func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("lease-checked Write with %#v: %v, want ErrInvalid", l, err)
		}
		if _, err := pgfence.Exec(ctx, dead, pgfence.Checked(l.lease()), `SELECT 1`); !errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("lease-checked Exec with %#v: %v, want ErrInvalid", l, err)
		}
	}
}

// The same when fn ends the transaction with SQL (COMMIT or ROLLBACK sent
// through tx.Exec): pgx's tx does not know, and a COMMIT sent afterwards
// succeeds with only a warning ("there is no transaction in progress"). Write
// must not return a receipt for a fence that was rolled back, nor for
// statements of fn that then ran outside any fenced transaction.
func TestFnEndsTransactionWithSQL(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	issue(t, pool, "ended-sql/1")
	lease := grant(t, pool, "ended-sql/lease")
	for i, tc := range []struct {
		sql  string
		want pgfence.Outcome
	}{
		{"ROLLBACK", pgfence.NotApplied},
		{"COMMIT", pgfence.Applied},
	} {
		token := int64(10 + i)
		// After ending the transaction, fn writes: that statement commits on
		// its own, unfenced.
		end := func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, tc.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE kv SET v = $1 WHERE k = 'a'`, tc.sql)
			return err
		}
		rcpt, err := pgfence.Write(ctx, pool, pgfence.LeaseOf("ended-sql/1", "", token), end)
		var unknown *pgfence.OutcomeUnknownError
		if !errors.Is(err, pgfence.ErrInvalid) || !errors.As(err, &unknown) {
			t.Fatalf("Write, fn sent %s: receipt %+v, error %v; want ErrInvalid and *OutcomeUnknownError", tc.sql, rcpt, err)
		}
		if got, err := pgfence.Resolve(ctx, pool, unknown); err != nil || got != tc.want {
			t.Errorf("Resolve after fn sent %s: %v, %v; want %v", tc.sql, got, err, tc.want)
		}
		_, err = pgfence.Write(ctx, pool, pgfence.Checked(lease.lease()), end)
		if !errors.Is(err, pgfence.ErrInvalid) || !errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Fatalf("lease-checked Write, fn sent %s: %v, want ErrInvalid and ErrOutcomeUnknown", tc.sql, err)
		}
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}

// connlessTx is a pgx.Tx of another implementation (a wrapper of the kind
// tracing or mocking libraries provide) that exposes no connection.
type connlessTx struct{ pgx.Tx }

func (t connlessTx) Conn() *pgx.Conn { return nil }

func (t connlessTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return connlessTx{tx}, nil
}

// Fenced and lease-checked writes work on a pgx.Tx that exposes no
// connection.
func TestWriteOnConnlessTx(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	issue(t, pool, "connless/1")
	lease := grant(t, pool, "connless/lease")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	noop := func(context.Context, pgx.Tx) error { return nil }
	if _, err := pgfence.Write(ctx, connlessTx{tx}, pgfence.LeaseOf("connless/1", "", 1), noop); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if _, err := pgfence.Write(ctx, connlessTx{tx}, pgfence.Checked(lease.lease()), noop); err != nil {
		t.Fatalf("lease-checked Write: %v", err)
	}
}

// An error fn returns is fn's, returned unchanged, even a network error of
// its own (a failed HTTP call): it once came back wrapped in ErrUnavailable,
// "the database could not be reached", sending callers to the wrong runbook.
// Errors of fn's own statements are still mapped.
func TestFnErrorReturnedUnchanged(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	issue(t, pool, "fnerr/1", "fnerr/2", "fnerr/3")
	httpErr := &url.Error{Op: "Post", URL: "http://payments.invalid/charge",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	fail := func(context.Context, pgx.Tx) error { return httpErr }
	if _, err := pgfence.Write(ctx, pool, pgfence.LeaseOf("fnerr/1", "", 1), fail); err != httpErr {
		t.Errorf("Write: fn's error came back as %v, want it unchanged", err)
	}
	lease := grant(t, pool, "fnerr/lease")
	if _, err := pgfence.Write(ctx, pool, pgfence.Checked(lease.lease()), fail); err != httpErr {
		t.Errorf("lease-checked Write: fn's error came back as %v, want it unchanged", err)
	}
	// fn's statement that raises a pgfence SQLSTATE is mapped.
	_, err := pgfence.Write(ctx, pool, pgfence.LeaseOf("fnerr/2", "", 1), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT pgfence.fence('fnerr/3', 5); SELECT pgfence.fence('fnerr/3', 4)`)
		return err
	})
	if !errors.Is(err, pgfence.ErrStaleToken) {
		t.Errorf("fn's stale fence: %v, want ErrStaleToken", err)
	}
}
