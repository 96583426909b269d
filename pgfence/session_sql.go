package pgfence

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/sqlhandle"
	"github.com/pgfence/pgfence/internal/telemetry"
	"github.com/pgfence/pgfence/internal/tracesql"
	"github.com/pgfence/pgfence/pgfence/internal/sqlbridge"
)

// The database/sql adapter of the writes (package sqlfence is their public
// face; it reaches them through internal/sqlbridge).

// sqlSession runs the writes on database/sql: a pool (*sql.DB, or a type
// that embeds one, such as *sqlx.DB), a connection (*sql.Conn) or the
// caller's *sql.Tx.
type sqlSession struct{ sqlhandle.Handle }

var _ session[*sql.Tx, sql.Result] = sqlSession{}

// newSQLSession returns the session of db, or an ErrInvalid error naming
// what db should have been.
func newSQLSession(db sqlbridge.DB) (sqlSession, error) {
	h, err := sqlhandle.Of(db)
	return sqlSession{h}, err
}

func (s sqlSession) ownCommit() bool { return s.Tx == nil }

// owned returns the connection the helper's own transaction runs on.
func (s sqlSession) owned(ctx context.Context) (sqlhandle.Conn, func(), error) {
	c, release, err := s.Own(ctx)
	if err != nil {
		return nil, nil, mapError(err, false)
	}
	return c, release, nil
}

func (s sqlSession) begin(ctx context.Context) (txn[*sql.Tx], func(), error) {
	if s.Tx != nil {
		sp := sqlhandle.NewSavepoint()
		if _, err := s.Tx.ExecContext(ctx, sp.Create()); err != nil {
			return nil, nil, mapError(err, false)
		}
		return sqlTxn{tx: s.Tx, savepoint: sp}, func() {}, nil
	}
	c, release, err := s.owned(ctx)
	if err != nil {
		return nil, nil, err
	}
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		release()
		return nil, nil, mapError(err, false)
	}
	return sqlTxn{tx: tx, conn: c}, release, nil
}

// pipeline sends first and query as one pipeline, one round trip and one
// implicit transaction, where the driver can (pgx's stdlib: through
// [sql.Conn.Raw]); with other drivers (lib/pq) in a transaction of its own:
// BEGIN, first, query, COMMIT. In the caller's transaction both join it.
func (s sqlSession) pipeline(ctx context.Context, first statement, traced bool, query string, args []any) (sql.Result, error) {
	if s.Tx != nil {
		t := sqlTxn{tx: s.Tx}
		if err := t.exec(ctx, traced, first.sql, first.args...); err != nil {
			return nil, mapError(err, false)
		}
		r, err := s.Tx.ExecContext(ctx, query, args...)
		if err != nil {
			return nil, mapError(err, false)
		}
		return r, nil
	}
	c, release, err := s.owned(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	pipelined := false
	var n int64
	err = c.Raw(func(dc any) error {
		pc := sqlhandle.PgxConn(dc)
		if pc == nil {
			return nil
		}
		pipelined = true
		tag, err := pipelineBatch(ctx, pc, first, traced, query, args)
		n = tag.RowsAffected()
		return err
	})
	if pipelined {
		if err != nil {
			return nil, mapError(err, true)
		}
		return driver.RowsAffected(n), nil
	}
	if err != nil { // Raw refused: the connection was closed; nothing was sent
		return nil, mapError(err, false)
	}
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		return nil, mapError(err, false)
	}
	t := sqlTxn{tx: tx, conn: c}
	if err := t.exec(ctx, traced, first.sql, first.args...); err != nil {
		return nil, rollback(ctx, txn[*sql.Tx](t), mapError(err, false))
	}
	r, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return nil, rollback(ctx, txn[*sql.Tx](t), mapError(err, false))
	}
	if err := t.commit(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

func (s sqlSession) conn(ctx context.Context) (stmtConn, func(), error) {
	if s.Tx != nil {
		return sqlStmts{s.Tx}, func() {}, nil
	}
	c, release, err := s.owned(ctx)
	if err != nil {
		return nil, nil, err
	}
	return sqlStmts{c}, release, nil
}

func (s sqlSession) execRows(ctx context.Context, query string, args ...any) (int64, error) {
	return sqlStmts{s.DB()}.execRows(ctx, query, args...)
}

func (s sqlSession) queryRow(ctx context.Context, query string, args ...any) rowScanner {
	return s.DB().QueryRowContext(ctx, query, args...)
}

// sqlStmts runs single statements on a pool, a connection or a transaction.
type sqlStmts struct{ q sqlhandle.DB }

func (s sqlStmts) execRows(ctx context.Context, query string, args ...any) (int64, error) {
	r, err := s.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

func (s sqlStmts) queryRow(ctx context.Context, query string, args ...any) rowScanner {
	return s.q.QueryRowContext(ctx, query, args...)
}

// sqlTxn is the transaction of a Write on database/sql: the helper's own on
// conn, or (conn nil) savepoint in the caller's tx.
type sqlTxn struct {
	tx        *sql.Tx
	conn      sqlhandle.Conn
	savepoint sqlhandle.Savepoint
}

func (t sqlTxn) handle() *sql.Tx { return t.tx }

// exec runs query in the transaction. When traced and ctx carries a trace
// id, the id is first set for the transaction (pgfence.fences stores it with
// the accepted token): database/sql cannot pipeline, so tracing costs a
// round trip here.
func (t sqlTxn) exec(ctx context.Context, traced bool, query string, args ...any) error {
	if id := telemetry.TraceID(ctx); traced && id != "" {
		if _, err := t.tx.ExecContext(ctx, tracesql.SetTraceIDSQL, id); err != nil {
			return err
		}
	}
	_, err := t.tx.ExecContext(ctx, query, args...)
	return err
}

// endedByFn reads the connection's transaction status where the driver
// shows it without a round trip (pgx's stdlib). lib/pq keeps the status
// itself and refuses a COMMIT outside a transaction; in the caller's
// transaction RELEASE SAVEPOINT fails then.
func (t sqlTxn) endedByFn() bool {
	if t.conn == nil {
		return false
	}
	ended := false
	_ = t.conn.Raw(func(dc any) error {
		if pc := sqlhandle.PgxConn(dc); pc != nil && pc.PgConn() != nil {
			ended = pc.PgConn().TxStatus() == 'I'
		}
		return nil
	})
	return ended
}

// connLost asks the driver whether the connection is still usable (pgx:
// closed; others: [driver.Validator]); in the caller's transaction, whose
// connection it cannot reach, fnErr tells ([driver.ErrBadConn]).
func (t sqlTxn) connLost(fnErr error) bool {
	if t.conn == nil {
		return errors.Is(fnErr, driver.ErrBadConn)
	}
	lost := errors.Is(fnErr, driver.ErrBadConn)
	if err := t.conn.Raw(func(dc any) error {
		if pc := sqlhandle.PgxConn(dc); pc != nil {
			lost = pc.IsClosed()
		} else if v, ok := dc.(driver.Validator); ok {
			lost = !v.IsValid()
		}
		return nil
	}); err != nil {
		lost = true // the *sql.Conn is closed
	}
	return lost
}

// commit commits the write's own transaction, or releases its savepoint in
// the caller's.
func (t sqlTxn) commit(ctx context.Context) error {
	if t.conn == nil {
		_, err := t.tx.ExecContext(ctx, t.savepoint.Release())
		switch code := pgerr.Code(err); {
		case err == nil:
			return nil
		case errors.Is(err, sql.ErrTxDone), code == sqlhandle.CodeNoActiveTransaction, code == sqlhandle.CodeInvalidSavepoint:
			// fn committed or rolled back the caller's transaction (it has
			// the caller's *sql.Tx), or released the savepoint: with the
			// fence, or without it.
			return fnEndedTx(true)
		}
		// The caller's transaction is gone with the savepoint (a lost
		// connection aborts it): nothing can commit.
		return mapError(err, false)
	}
	err := t.tx.Commit()
	switch {
	case err == nil:
		return nil
	case err == context.Canceled || err == context.DeadlineExceeded: // the bare value, not wrapped
		// database/sql found the context ended before it sent COMMIT, and
		// rolls the transaction back.
		return mapError(err, false)
	case errors.Is(err, sql.ErrTxDone) && ctx.Err() != nil:
		// database/sql rolled the transaction back when the context ended,
		// unless fn had ended it itself.
		return fmt.Errorf("%w: the context ended before COMMIT: %w", ErrOutcomeUnknown, ctx.Err())
	case errors.Is(err, sql.ErrTxDone):
		return fnEndedTx(true)
	}
	return mapError(err, true)
}

func (t sqlTxn) rollback(ctx context.Context) error {
	var err error
	if t.conn == nil {
		_, err = t.tx.ExecContext(ctx, t.savepoint.RollbackTo())
	} else {
		err = t.tx.Rollback()
	}
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}
