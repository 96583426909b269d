package driver

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// SQLDB is what database/sql's *sql.DB, *sql.Conn and *sql.Tx share.
type SQLDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// sqlPool is a *sql.DB (or a type that embeds one, such as *sqlx.DB).
type sqlPool interface {
	SQLDB
	Conn(ctx context.Context) (*sql.Conn, error)
}

// sqlConn is a *sql.Conn (or a type that embeds one).
type sqlConn interface {
	SQLDB
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
	Raw(f func(driverConn any) error) error
}

var (
	_ sqlPool = (*sql.DB)(nil)
	_ sqlConn = (*sql.Conn)(nil)
	_ SQLDB   = (*sql.Tx)(nil)
)

// SQL returns the handle of db: a *sql.DB (or a type embedding one), a
// *sql.Conn or a *sql.Tx. Anything else is refused with ErrInvalid saying
// what it should have been: a type that has only SQLDB's methods could
// commit on its own or not, and an ORM's transaction type cannot be given to
// code that takes the *sql.Tx it wraps.
func SQL(db SQLDB) (Handle[*sql.Tx], error) {
	if err := NilHandle(db); err != nil {
		return nil, err
	}
	switch db := db.(type) {
	case *sql.Tx:
		return sqlHandle{tx: db}, nil
	case sqlConn:
		return sqlHandle{conn: db}, nil
	case sqlPool:
		return sqlHandle{pool: db}, nil
	case interface{ Commit() error }:
		return nil, fmt.Errorf("%w: db is a %T: pass the *sql.Tx it wraps (sqlx and bun: tx.Tx; GORM: tx.Statement.ConnPool.(*sql.Tx), or .(*gorm.PreparedStmtTX).Tx.(*sql.Tx) with PrepareStmt)", pgerr.ErrInvalid, db)
	}
	return nil, fmt.Errorf("%w: db is a %T: it must be a *sql.DB, a *sql.Conn or a *sql.Tx", pgerr.ErrInvalid, db)
}

// sqlHandle is one of the three; exactly one field is set.
type sqlHandle struct {
	pool sqlPool
	conn sqlConn
	tx   *sql.Tx
}

func (h sqlHandle) InTx() bool { return h.tx != nil }

// own returns the connection a helper's own statements run on: the caller's
// *sql.Conn, or one of the pool's until release. Statements on a pinned
// connection are never sent again by database/sql (it retries a statement on
// *sql.DB whose driver answered driver.ErrBadConn, which lib/pq also answers
// after a statement was sent).
func (h sqlHandle) own(ctx context.Context) (sqlConn, func(), error) {
	if h.conn != nil {
		return h.conn, func() {}, nil
	}
	c, err := h.pool.Conn(ctx)
	if err != nil {
		return nil, nil, Acquired(ctx, err)
	}
	return c, func() { _ = c.Close() }, nil
}

func (h sqlHandle) Begin(ctx context.Context, readCommitted bool) (Tx[*sql.Tx], error) {
	if h.tx != nil {
		sp := newSavepoint()
		if _, err := h.tx.ExecContext(ctx, "SAVEPOINT "+sp); err != nil {
			return nil, pgerr.Classify(err, false)
		}
		return &sqlTx{tx: h.tx, savepoint: sp, release: func() {}}, nil
	}
	c, release, err := h.own(ctx)
	if err != nil {
		return nil, err
	}
	var opts *sql.TxOptions
	if readCommitted {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := c.BeginTx(ctx, opts)
	if err != nil {
		release()
		return nil, pgerr.Classify(err, false)
	}
	return &sqlTx{tx: tx, conn: c, release: release}, nil
}

func (h sqlHandle) Pipeline(ctx context.Context, stmts ...Stmt) (int64, error) {
	if h.tx != nil {
		var n int64
		for _, s := range stmts {
			r, err := h.tx.ExecContext(ctx, s.SQL, s.Args...)
			if err != nil {
				return 0, pgerr.Classify(err, false)
			}
			n, _ = r.RowsAffected()
		}
		return n, nil
	}
	c, release, err := h.own(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	// pgx's driver pipelines through its own connection.
	var (
		n         int64
		pipelined bool
	)
	if err := c.Raw(func(dc any) error {
		pc := pgxConnOf(dc)
		if pc == nil {
			return nil
		}
		pipelined = true
		n, err = pipelinePgx(ctx, pc, stmts)
		return nil
	}); err != nil {
		return 0, pgerr.Classify(err, false) // the *sql.Conn is closed: nothing was sent
	}
	if pipelined {
		return n, classifyPipeline(err, true)
	}
	// Other drivers (lib/pq): a transaction of its own, one statement per
	// round trip.
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		return 0, pgerr.Classify(err, false)
	}
	t := &sqlTx{tx: tx, conn: c, release: func() {}}
	for _, s := range stmts {
		r, err := tx.ExecContext(ctx, s.SQL, s.Args...)
		if err != nil {
			return 0, Abort(ctx, Tx[*sql.Tx](t), t.Classify(err))
		}
		n, _ = r.RowsAffected()
	}
	if err := t.Commit(ctx, nil); err != nil {
		return 0, Abort(ctx, Tx[*sql.Tx](t), err)
	}
	return n, nil
}

func (h sqlHandle) QueryRow(ctx context.Context, query string, args ...any) Row {
	return h.row(ctx, h.tx == nil, query, args)
}

func (h sqlHandle) Read(ctx context.Context, query string, args ...any) Row {
	return h.row(ctx, false, query, args)
}

func (h sqlHandle) row(ctx context.Context, sent bool, query string, args []any) Row {
	if h.tx != nil {
		return classifiedRow{h.tx.QueryRowContext(ctx, query, args...), sent}
	}
	c, release, err := h.own(ctx)
	if err != nil {
		return errRow{err}
	}
	return releasingRow{classifiedRow{c.QueryRowContext(ctx, query, args...), sent}, release}
}

// pgxConnOf returns the *pgx.Conn of a driver connection of pgx's
// database/sql driver (as [sql.Conn.Raw] gives it), or nil for another
// driver.
func pgxConnOf(driverConn any) *pgx.Conn {
	if c, ok := driverConn.(interface{ Conn() *pgx.Conn }); ok {
		return c.Conn()
	}
	return nil
}

var savepoints atomic.Uint64

// newSavepoint returns a savepoint name no other call of this process uses:
// ROLLBACK TO keeps the savepoint it rolls back to, so with a shared name
// the outer call of two nested ones (a fenced write inside an idempotent
// claim) would roll back to the inner one's and keep its own work.
func newSavepoint() string { return "pgfence_" + strconv.FormatUint(savepoints.Add(1), 10) }

// SQLSTATEs of a RELEASE SAVEPOINT whose transaction the caller's code ended.
const (
	codeNoActiveTransaction = "25P01"
	codeInvalidSavepoint    = "3B001"
)

// sqlTx is a helper's transaction on database/sql: its own on conn, or
// (conn nil) a savepoint of the caller's tx.
type sqlTx struct {
	tx        *sql.Tx
	conn      sqlConn
	savepoint string
	release   func()
	committed bool
}

func (t *sqlTx) Handle() *sql.Tx { return t.tx }

func (t *sqlTx) Exec(ctx context.Context, stmts ...Stmt) error { return t.Query(ctx, nil, stmts...) }

// Query sends one statement per round trip: database/sql cannot pipeline.
func (t *sqlTx) Query(ctx context.Context, dest []any, stmts ...Stmt) error {
	for i, s := range stmts {
		if i == len(stmts)-1 && dest != nil {
			return t.tx.QueryRowContext(ctx, s.SQL, s.Args...).Scan(dest...)
		}
		if _, err := t.tx.ExecContext(ctx, s.SQL, s.Args...); err != nil {
			return err
		}
	}
	return nil
}

// Classify asks the driver whether the connection is still usable (pgx:
// closed; others: driver.Validator); in the caller's transaction, whose
// connection it cannot reach, the error tells (driver.ErrBadConn).
func (t *sqlTx) Classify(err error) error {
	if pgerr.Code(err) != "" || t.connLost(err) {
		return pgerr.Classify(err, false)
	}
	return err
}

func (t *sqlTx) connLost(err error) bool {
	lost := errors.Is(err, driver.ErrBadConn)
	if t.conn == nil {
		return lost
	}
	if rerr := t.conn.Raw(func(dc any) error {
		if pc := pgxConnOf(dc); pc != nil {
			lost = pc.IsClosed()
		} else if v, ok := dc.(driver.Validator); ok {
			lost = !v.IsValid()
		}
		return nil
	}); rerr != nil {
		lost = true // the *sql.Conn is closed
	}
	return lost
}

// EndedByCaller reads the connection's transaction status where the driver
// shows it without a round trip (pgx's). lib/pq keeps the status itself and
// refuses a COMMIT outside a transaction; in the caller's transaction
// RELEASE SAVEPOINT fails then.
func (t *sqlTx) EndedByCaller() bool {
	if t.conn == nil {
		return false
	}
	ended := false
	_ = t.conn.Raw(func(dc any) error {
		if pc := pgxConnOf(dc); pc != nil && pc.PgConn() != nil {
			ended = pc.PgConn().TxStatus() == 'I'
		}
		return nil
	})
	return ended
}

func (t *sqlTx) Commit(ctx context.Context, last *Stmt, dest ...any) error {
	if last != nil {
		if err := t.Query(ctx, dest, *last); err != nil {
			return t.Classify(err)
		}
	}
	if t.conn == nil {
		_, err := t.tx.ExecContext(ctx, "RELEASE SAVEPOINT "+t.savepoint)
		switch code := pgerr.Code(err); {
		case err == nil:
			t.done(true)
			return nil
		case errors.Is(err, sql.ErrTxDone), code == codeNoActiveTransaction:
			// The caller's code (it has the caller's *sql.Tx) committed or
			// rolled back the caller's transaction: with this work, or
			// without it.
			return EndedByCaller(true)
		case code == codeInvalidSavepoint:
			// The caller's code released the savepoint or rolled back past
			// it; the failed RELEASE has aborted the caller's transaction,
			// so nothing of it commits.
			return EndedByCaller(false)
		}
		// The caller's transaction is gone with the savepoint (a lost
		// connection aborts it): nothing can commit.
		return pgerr.Classify(err, false)
	}
	err := t.tx.Commit()
	switch {
	case err == nil:
		t.done(true)
		return nil
	case err == context.Canceled || err == context.DeadlineExceeded: // the bare value, not wrapped
		// database/sql found the context ended before it sent COMMIT, and
		// rolls the transaction back.
		return err
	case errors.Is(err, sql.ErrTxDone) && ctx.Err() != nil:
		// database/sql rolled the transaction back when the context ended,
		// unless the caller's code had ended it itself.
		return fmt.Errorf("%w: the context ended before COMMIT: %w", pgerr.ErrOutcomeUnknown, ctx.Err())
	case errors.Is(err, sql.ErrTxDone):
		return EndedByCaller(true)
	}
	return pgerr.Classify(err, true)
}

func (t *sqlTx) Rollback(ctx context.Context) error {
	if t.committed || t.release == nil {
		return nil
	}
	var err error
	if t.conn == nil {
		_, err = t.tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+t.savepoint)
		if pgerr.Code(err) == codeNoActiveTransaction {
			err = nil // the caller's code ended the caller's transaction, and the savepoint with it
		}
	} else {
		err = t.tx.Rollback()
	}
	t.done(false)
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

func (t *sqlTx) done(committed bool) {
	t.committed = committed
	if t.release != nil {
		t.release()
		t.release = nil
	}
}
