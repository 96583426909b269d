package driver

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// guardedTx is the pgx.Tx a helper's transaction hands out. Once the helper
// has committed or rolled back, every call answers [pgx.ErrTxClosed] and
// sends nothing: a commit may travel in one pipeline that pgx's own
// transaction does not see, and a pooled connection goes back to its pool
// right after, so a late call on the transaction itself (a deferred
// Rollback, a goroutine of the caller's) would reach a connection that
// another caller may be using by then.
//
// It embeds the transaction so that it keeps implementing pgx.Tx if pgx adds
// methods; those are not guarded.
type guardedTx struct {
	pgx.Tx
	closed *closedFlag // shared with the savepoints begun on it
}

// closedFlag is set once the helper's transaction has ended.
type closedFlag struct{ atomic.Bool }

func (f *closedFlag) close() { f.Store(true) }

func (g *guardedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if g.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	tx, err := g.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &guardedTx{Tx: tx, closed: g.closed}, nil
}

func (g *guardedTx) Commit(ctx context.Context) error {
	if g.closed.Load() {
		return pgx.ErrTxClosed
	}
	return g.Tx.Commit(ctx)
}

func (g *guardedTx) Rollback(ctx context.Context) error {
	if g.closed.Load() {
		return pgx.ErrTxClosed
	}
	return g.Tx.Rollback(ctx)
}

func (g *guardedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if g.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return g.Tx.CopyFrom(ctx, table, columns, src)
}

func (g *guardedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if g.closed.Load() {
		return closedBatch{}
	}
	return g.Tx.SendBatch(ctx, b)
}

// LargeObjects is the transaction's; pgx gives no way to guard its calls.
func (g *guardedTx) LargeObjects() pgx.LargeObjects { return g.Tx.LargeObjects() }

func (g *guardedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if g.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return g.Tx.Prepare(ctx, name, sql)
}

func (g *guardedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if g.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return g.Tx.Exec(ctx, sql, args...)
}

func (g *guardedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if g.closed.Load() {
		return closedRows{}, pgx.ErrTxClosed
	}
	return g.Tx.Query(ctx, sql, args...)
}

func (g *guardedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if g.closed.Load() {
		return errRow{pgx.ErrTxClosed}
	}
	return g.Tx.QueryRow(ctx, sql, args...)
}

// Conn is the connection the transaction runs on (nil once the attempt
// ended: it may belong to another caller then).
func (g *guardedTx) Conn() *pgx.Conn {
	if g.closed.Load() {
		return nil
	}
	return g.Tx.Conn()
}

// closedRows are the rows of a query on an ended attempt: none, and the
// error. The embedded (nil) interface only keeps it a pgx.Rows if pgx adds
// methods.
type closedRows struct{ pgx.Rows }

func (closedRows) Close()                                       {}
func (closedRows) Err() error                                   { return pgx.ErrTxClosed }
func (closedRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (closedRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (closedRows) Next() bool                                   { return false }
func (closedRows) Scan(...any) error                            { return pgx.ErrTxClosed }
func (closedRows) Values() ([]any, error)                       { return nil, pgx.ErrTxClosed }
func (closedRows) RawValues() [][]byte                          { return nil }
func (closedRows) Conn() *pgx.Conn                              { return nil }
func (closedRows) TypeMap() *pgtype.Map                         { return nil }

// closedBatch is the result of a batch sent on an ended attempt.
type closedBatch struct{ pgx.BatchResults }

func (closedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, pgx.ErrTxClosed }
func (closedBatch) Query() (pgx.Rows, error)         { return closedRows{}, pgx.ErrTxClosed }
func (closedBatch) QueryRow() pgx.Row                { return errRow{pgx.ErrTxClosed} }
func (closedBatch) Close() error                     { return pgx.ErrTxClosed }
func (closedBatch) Tx() pgx.Tx                       { return nil }

var _ pgx.Tx = (*guardedTx)(nil)
