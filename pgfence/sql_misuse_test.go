package pgfence_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// sqlDrivers are the database/sql drivers the tests prove.
var sqlDrivers = []struct{ name, driver string }{
	{"stdlib", "pgx"},
	{"pq", "postgres"},
}

// nothingWritten fails t unless the database holds no trace of a write:
// no accepted token for kv:a and row a as setupKV left it.
func nothingWritten(t *testing.T, db *pgfencetest.Database) {
	t.Helper()
	if got := accepted(t, db, "kv:a"); got != 0 {
		t.Errorf("token %d accepted for kv:a", got)
	}
	if v, _ := kvRow(t, db.Pool); v != "initial" {
		t.Errorf("row a is %q", v)
	}
}

// Bad input and broken handles give a clear error and write nothing: a
// closed *sql.DB, a transaction already aborted or already committed, an
// argument the driver cannot send (an error of the driver, not of
// PostgreSQL), a handle of another type, nil arguments.
func TestBadInputWritesNothing(t *testing.T) {
	for _, d := range sqlDrivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			db := pgfencetest.NewDatabase(t)
			newKV(t, db.Pool)
			pgfencetest.IssueToken(t, db.Pool, "kv:a", 100)
			sdb := openDB(t, d.driver, db.URL)
			called := false
			fn := func(ctx context.Context, tx *sql.Tx) error {
				called = true
				_, err := tx.ExecContext(ctx, `UPDATE kv SET v = 'written' WHERE k = 'a'`)
				return err
			}
			lease := pgfence.LeaseOf("kv:a", "", 5)

			// A transaction already aborted by a failed statement: the
			// server's error (25P02) says so.
			tx, err := sdb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, `SELECT 1 / 0`); err == nil {
				t.Fatal("1 / 0 succeeded")
			}
			if _, err := pgfence.WriteSQL(ctx, tx, lease, fn); pgerr.Code(err) != "25P02" {
				t.Errorf("Write in an aborted transaction: %v, want the server's 25P02", err)
			}
			if _, err := pgfence.ExecSQL(ctx, tx, lease, `UPDATE kv SET v = 'written' WHERE k = 'a'`); pgerr.Code(err) != "25P02" {
				t.Errorf("Exec in an aborted transaction: %v, want the server's 25P02", err)
			}
			_ = tx.Rollback()

			// A transaction already committed.
			tx, err = sdb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if _, err := pgfence.WriteSQL(ctx, tx, lease, fn); !errors.Is(err, sql.ErrTxDone) {
				t.Errorf("Write in a committed transaction: %v, want sql.ErrTxDone", err)
			}

			// An argument the driver cannot encode: its error, unchanged,
			// never an outage or an unknown outcome; the fence rolls back.
			// (pgx closes a connection whose pipeline it could not encode,
			// so the *sql.Conn is last used by Exec.)
			for _, handle := range []pgfence.SQLDB{sdb, mustConn(t, sdb)} {
				_, err = pgfence.WriteSQL(ctx, handle, lease, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `UPDATE kv SET v = $1 WHERE k = 'a'`, struct{ x int }{1})
					return err
				})
				if err == nil || errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
					t.Errorf("Write on %T whose fn's argument the driver cannot send: %v, want the driver's error", handle, err)
				}
				_, err := pgfence.ExecSQL(ctx, handle, lease, `UPDATE kv SET v = $1 WHERE k = 'a'`, make(chan int))
				if err == nil || errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) || pgerr.Code(err) != "" {
					t.Errorf("Exec on %T with an argument the driver cannot send: %v, want the driver's error", handle, err)
				}
			}

			// Handles that are not database/sql's, and nil arguments.
			for _, tc := range []struct {
				name string
				err  error
				want string
			}{
				{"a type that only looks like a DB", func() error { _, err := pgfence.WriteSQL(ctx, fakeDB{sdb}, lease, fn); return err }(), "must be a *sql.DB"},
				{"a transaction type that wraps *sql.Tx", func() error { _, err := pgfence.WriteSQL(ctx, wrappedTx{tx}, lease, fn); return err }(), "pass the *sql.Tx it wraps"},
				{"nil db", func() error { _, err := pgfence.WriteSQL(ctx, nil, lease, fn); return err }(), "db is nil"},
				{"nil *sql.DB", func() error { _, err := pgfence.WriteSQL(ctx, (*sql.DB)(nil), lease, fn); return err }(), "nil *sql.DB"},
				{"nil lease", func() error { _, err := pgfence.WriteSQL(ctx, sdb, nil, fn); return err }(), "lease is nil"},
				{"nil fn", func() error { _, err := pgfence.WriteSQL(ctx, sdb, lease, nil); return err }(), "fn is nil"},
				{"invalid holder", func() error {
					_, err := pgfence.WriteSQL(ctx, sdb, pgfence.Checked(pgfence.LeaseOf("kv:a", "not-a-uuid", 5)), fn)
					return err
				}(), "not a UUID"},
				{"resolve in a transaction", func() error {
					_, err := pgfence.ResolveSQL(ctx, tx, &pgfence.OutcomeUnknownError{Resource: "kv:a", Token: 5, Op: pgfence.OpID{1}})
					return err
				}(), "not a transaction"},
			} {
				if !errors.Is(tc.err, pgfence.ErrInvalid) || !strings.Contains(tc.err.Error(), tc.want) {
					t.Errorf("%s: %v, want ErrInvalid saying %q", tc.name, tc.err, tc.want)
				}
			}

			// A closed *sql.DB.
			closed := openDB(t, d.driver, db.URL)
			if err := closed.Close(); err != nil {
				t.Fatal(err)
			}
			_, err = pgfence.WriteSQL(ctx, closed, lease, fn)
			if err == nil || !strings.Contains(err.Error(), "database is closed") || errors.Is(err, pgfence.ErrOutcomeUnknown) {
				t.Errorf("Write on a closed *sql.DB: %v, want database/sql's error", err)
			}
			if _, err := pgfence.ExecSQL(ctx, closed, lease, `UPDATE kv SET v = 'written' WHERE k = 'a'`); err == nil || errors.Is(err, pgfence.ErrOutcomeUnknown) {
				t.Errorf("Exec on a closed *sql.DB: %v", err)
			}

			// A closed *sql.Conn.
			c := mustConn(t, sdb)
			_ = c.Close()
			if _, err := pgfence.WriteSQL(ctx, c, lease, fn); !errors.Is(err, sql.ErrConnDone) {
				t.Errorf("Write on a closed *sql.Conn: %v, want sql.ErrConnDone", err)
			}
			if _, err := pgfence.ExecSQL(ctx, c, lease, `UPDATE kv SET v = 'written' WHERE k = 'a'`); !errors.Is(err, sql.ErrConnDone) {
				t.Errorf("Exec on a closed *sql.Conn: %v, want sql.ErrConnDone", err)
			}

			if called {
				t.Error("fn ran")
			}
			nothingWritten(t, db)
		})
	}
}

func mustConn(t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// fakeDB has the methods of a DB but is no database/sql handle: the helpers
// cannot tell whether it commits on its own.
type fakeDB struct{ db *sql.DB }

func (f fakeDB) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return f.db.ExecContext(ctx, query, args...)
}

func (f fakeDB) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return f.db.QueryRowContext(ctx, query, args...)
}

// wrappedTx is an ORM's transaction type around a *sql.Tx.
type wrappedTx struct{ *sql.Tx }

// A database that cannot be reached is unavailable: nothing was done.
func TestUnreachableIsUnavailable(t *testing.T) {
	for _, d := range sqlDrivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			dead := openDB(t, d.driver, "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
			_, err := pgfence.ExecSQL(ctx, dead, pgfence.LeaseOf("r", "", 1), `SELECT 1`)
			if !errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
				t.Errorf("Exec on a dead server: %v, want ErrUnavailable", err)
			}
			_, err = pgfence.WriteSQL(ctx, dead, pgfence.LeaseOf("r", "", 1), func(context.Context, *sql.Tx) error { return nil })
			if !errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
				t.Errorf("Write on a dead server: %v, want ErrUnavailable", err)
			}
		})
	}
}

// fn that commits or rolls back the *sql.Tx it is given, through
// database/sql, ends the transaction the fence is in: the caller's whole
// transaction when the helper runs inside one. The helper cannot know what
// committed: ErrOutcomeUnknown and ErrInvalid, never success.
func TestFnEndsTransactionThroughDatabaseSQL(t *testing.T) {
	for _, d := range sqlDrivers {
		for _, inTx := range []bool{false, true} {
			name := d.name + "/db"
			if inTx {
				name = d.name + "/tx"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := testContext(t)
				db := pgfencetest.NewDatabase(t)
				newKV(t, db.Pool)
				pgfencetest.IssueToken(t, db.Pool, "kv:a", 100)
				f := sqlFencer{db: openDB(t, d.driver, db.URL), handle: handleDB}
				if inTx {
					f.handle = handleTx
				}
				for i, end := range []func(*sql.Tx) error{(*sql.Tx).Commit, (*sql.Tx).Rollback} {
					err := f.run(ctx, func(h pgfence.SQLDB) error {
						_, err := pgfence.WriteSQL(ctx, h, pgfence.LeaseOf("kv:a", "", int64(5+i)), func(ctx context.Context, tx *sql.Tx) error {
							return end(tx)
						})
						return err
					})
					if !errors.Is(err, pgfence.ErrOutcomeUnknown) || !errors.Is(err, pgfence.ErrInvalid) {
						t.Errorf("fn ended the transaction (%d): %v, want ErrOutcomeUnknown and ErrInvalid", i, err)
					}
				}
			})
		}
	}
}

// ExecSQL with pgx's database/sql driver, fenced or lease-checked, sends the
// fence (or the lease check) and the statement in one round trip, as one
// pipeline: once the statements are prepared on the connection, one Sync and
// no simple Query (no BEGIN, no COMMIT).
func TestExecSQLInOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	newKV(t, db.Pool)
	pgfencetest.IssueToken(t, db.Pool, "kv:a", 100)
	url, p := proxiedURL(t, db)
	sdb := openDB(t, "pgx", url)
	sdb.SetMaxOpenConns(1)
	l := acquire(t, db.Pool, "job")
	write := func(token int64) {
		if _, err := pgfence.ExecSQL(ctx, sdb, pgfence.LeaseOf("kv:a", "", token), `UPDATE kv SET v = $1 WHERE k = 'a'`, "exec"); err != nil {
			t.Fatal(err)
		}
		if _, err := pgfence.ExecSQL(ctx, sdb, pgfence.Checked(l), `UPDATE kv SET v = $1 WHERE k = 'a'`, "leased"); err != nil {
			t.Fatal(err)
		}
	}
	write(5) // pgx prepares its statements on the first two rounds
	write(6)
	sent := countRequests(p)
	write(7)
	if s, q := sent(); s != 2 || q != 0 {
		t.Errorf("the last fenced and lease-checked ExecSQL sent %d Syncs and %d simple queries, want 2 and 0", s, q)
	}
}

// countRequests starts counting the requests that reach the server through
// p: simple queries and Syncs (each closing extended-protocol messages). The
// function it returns stops and gives both counts.
func countRequests(p *faultproxy.Proxy) func() (syncs, queries int) {
	var s, q atomic.Int64
	trigger := p.CutBefore(func(m faultproxy.Message) bool {
		switch m.Type {
		case 'S':
			s.Add(1)
		case 'Q':
			q.Add(1)
		}
		return false
	})
	return func() (int, int) {
		trigger.Cancel()
		return int(s.Load()), int(q.Load())
	}
}
