package pgfence_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"testing"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence"
)

// foreignError is an error of a driver that is not PostgreSQL's: no
// SQLSTATE a pgfence helper could read.
type foreignError struct{ msg string }

func (e *foreignError) Error() string { return e.msg }

// foreignDriver is a database/sql driver of another database: it begins
// transactions, but every statement fails with its own error type. It
// counts commits and rollbacks.
type foreignDriver struct {
	mu                 sync.Mutex
	commits, rollbacks int
	statements, begun  int
}

func (d *foreignDriver) Open(string) (driver.Conn, error) { return &foreignConn{d: d}, nil }

type foreignConn struct{ d *foreignDriver }

func (c *foreignConn) Prepare(string) (driver.Stmt, error) {
	return nil, &foreignError{"foreign: prepared statements unsupported"}
}
func (c *foreignConn) Close() error { return nil }
func (c *foreignConn) Begin() (driver.Tx, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.d.begun++
	return &foreignTx{d: c.d}, nil
}

func (c *foreignConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.d.statements++
	return nil, &foreignError{"foreign: syntax error near 'pgfence'"}
}

func (c *foreignConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.d.statements++
	return nil, &foreignError{"foreign: syntax error near 'pgfence'"}
}

type foreignTx struct{ d *foreignDriver }

func (t *foreignTx) Commit() error {
	t.d.mu.Lock()
	defer t.d.mu.Unlock()
	t.d.commits++
	return nil
}

func (t *foreignTx) Rollback() error {
	t.d.mu.Lock()
	defer t.d.mu.Unlock()
	t.d.rollbacks++
	return nil
}

// A *sql.DB of a driver that is not PostgreSQL's: every helper returns the
// driver's own error, unchanged and recognisable, never a pgfence sentinel
// or an unknown outcome; fn never runs and nothing commits.
func TestForeignDriverErrorWritesNothing(t *testing.T) {
	d := &foreignDriver{}
	db := sql.OpenDB(foreignConnector{d})
	defer db.Close()
	ctx := testContext(t)
	lease := pgfence.LeaseOf("kv:a", "6b1c1c8e-3f0e-4a57-9b5e-2f4f8a6d8d11", 5)
	called := false
	fn := func(context.Context, *sql.Tx) error { called = true; return nil }
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // the test's own transaction
	for name, call := range map[string]func() error{
		"Write":         func() error { _, err := pgfence.WriteSQL(ctx, db, lease, fn); return err },
		"Write in a tx": func() error { _, err := pgfence.WriteSQL(ctx, tx, lease, fn); return err },
		"Exec":          func() error { _, err := pgfence.ExecSQL(ctx, db, lease, `UPDATE kv SET v = 'x'`); return err },
		"Write checked": func() error { _, err := pgfence.WriteSQL(ctx, db, pgfence.Checked(lease), fn); return err },
		"Exec checked": func() error {
			_, err := pgfence.ExecSQL(ctx, db, pgfence.Checked(lease), `UPDATE kv SET v = 'x'`)
			return err
		},
		"Resolve": func() error {
			_, err := pgfence.ResolveSQL(ctx, db, &pgfence.OutcomeUnknownError{Resource: "kv:a", Token: 5, Op: pgfence.OpID{1}})
			return err
		},
	} {
		err := call()
		t.Logf("%s: %v", name, err)
		var fe *foreignError
		if !errors.As(err, &fe) || pgerr.Code(err) != "" {
			t.Errorf("%s: %v, want the driver's own error", name, err)
		}
		for _, sentinel := range []error{pgfence.ErrOutcomeUnknown, pgfence.ErrStaleToken, pgfence.ErrLeaseLost, pgfence.ErrUnavailable, pgfence.ErrInvalid} {
			if errors.Is(err, sentinel) {
				t.Errorf("%s: %v, is %v", name, err, sentinel)
			}
		}
	}
	if called {
		t.Error("fn ran")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.commits != 0 || d.statements == 0 {
		t.Errorf("%d commits, %d statements; want none committed, the statements refused", d.commits, d.statements)
	}
	// Every transaction a helper began was rolled back (the test's own is
	// still open).
	if d.rollbacks != d.begun-1 {
		t.Errorf("%d transactions begun by the helpers, %d rolled back", d.begun-1, d.rollbacks)
	}
}

// foreignConnector opens the foreign driver's connections for sql.OpenDB.
type foreignConnector struct{ d *foreignDriver }

func (c foreignConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open("") }
func (c foreignConnector) Driver() driver.Driver                        { return c.d }
