package idempotency_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"testing"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
)

// foreignError is an error of a driver that is not PostgreSQL's.
type foreignError struct{}

func (*foreignError) Error() string { return "foreign: syntax error near 'pgfence'" }

// foreignDriver is a database/sql driver of another database: it begins
// transactions, but every statement fails with its own error type.
type foreignDriver struct {
	mu               sync.Mutex
	begun, commits   int
	rollbacks, stmts int
}

func (d *foreignDriver) Open(string) (driver.Conn, error)             { return foreignConn{d}, nil }
func (d *foreignDriver) Connect(context.Context) (driver.Conn, error) { return foreignConn{d}, nil }
func (d *foreignDriver) Driver() driver.Driver                        { return d }

func (d *foreignDriver) count(n *int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	*n++
}

type foreignConn struct{ d *foreignDriver }

func (c foreignConn) Prepare(string) (driver.Stmt, error) { return nil, &foreignError{} }
func (c foreignConn) Close() error                        { return nil }
func (c foreignConn) Begin() (driver.Tx, error)           { c.d.count(&c.d.begun); return foreignTx(c), nil }
func (c foreignConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	return c.Begin()
}
func (c foreignConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	c.d.count(&c.d.stmts)
	return nil, &foreignError{}
}
func (c foreignConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	c.d.count(&c.d.stmts)
	return nil, &foreignError{}
}

type foreignTx struct{ d *foreignDriver }

func (t foreignTx) Commit() error   { t.d.count(&t.d.commits); return nil }
func (t foreignTx) Rollback() error { t.d.count(&t.d.rollbacks); return nil }

// DoSQL on a *sql.DB of a driver that is not PostgreSQL's, and inside its
// transaction: the driver's own error, never a sentinel or an unknown
// outcome; fn never runs and nothing commits.
func TestDoSQLForeignDriverError(t *testing.T) {
	d := &foreignDriver{}
	db := sql.OpenDB(d)
	defer db.Close()
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "orders", Key: "k"}
	called := false
	fn := func(context.Context, *sql.Tx) ([]byte, error) { called = true; return nil, nil }
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]idempotency.SQLDB{"*sql.DB": db, "*sql.Tx": tx} {
		_, err := store.DoSQL(ctx, h, req, fn)
		var fe *foreignError
		if !errors.As(err, &fe) || pgerr.Code(err) != "" || errors.Is(err, idempotency.ErrOutcomeUnknown) ||
			errors.Is(err, idempotency.ErrUnavailable) || errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("DoSQL on the foreign %s: %v, want the driver's own error", name, err)
		}
	}
	_ = tx.Rollback()
	if called {
		t.Error("fn ran")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.commits != 0 || d.stmts == 0 || d.rollbacks != d.begun {
		t.Errorf("%d begun, %d committed, %d rolled back, %d statements; want none committed, all rolled back", d.begun, d.commits, d.rollbacks, d.stmts)
	}
}
