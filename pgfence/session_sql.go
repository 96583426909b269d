package pgfence

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
	several := false
	_ = c.Raw(func(dc any) error { several = sqlhandle.SeveralStatements(dc); return nil })
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		release()
		return nil, nil, mapError(err, false)
	}
	return sqlTxn{tx: tx, conn: c, several: several}, release, nil
}

// pipeline sends first and query as one pipeline, one round trip and one
// implicit transaction, where the driver can: pgx's stdlib through
// [sql.Conn.Raw]; lib/pq as one simple query with the arguments written as
// constants, when they can be (see interpolate), else BEGIN with first, then
// query, then COMMIT. With other drivers in a transaction of its own: BEGIN,
// first, query, COMMIT. In the caller's transaction both join it.
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
	pipelined, several := false, false
	var n int64
	err = c.Raw(func(dc any) error {
		pc := sqlhandle.PgxConn(dc)
		if pc == nil {
			several = sqlhandle.SeveralStatements(dc)
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
	if several {
		if head, ok := literalStatements(ctx, traced, first); ok {
			if q, ok := interpolate(query, args); ok {
				return oneSimpleQuery(ctx, c, head+"; "+q)
			}
			return pipelineSimple(ctx, c, "BEGIN; "+head, query, args)
		}
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

// literalStatements is the statement that names the trace (when traced and
// ctx has one) and st, as one simple query: st's arguments written as
// literals. ok is false when an argument has no literal form here.
func literalStatements(ctx context.Context, traced bool, st statement) (string, bool) {
	var b strings.Builder
	if id := telemetry.TraceID(ctx); traced && id != "" {
		if !writeWithLiterals(&b, tracesql.SetTraceIDSQL, []any{id}) {
			return "", false
		}
		b.WriteString("; ")
	}
	if !writeWithLiterals(&b, st.sql, st.args) {
		return "", false
	}
	return b.String(), true
}

// escapeString escapes the body of an escape-string constant (E'...').
var escapeString = strings.NewReplacer(`\`, `\\`, `'`, `''`)

// writeWithLiterals writes query to b with each $n replaced by the literal of
// args[n-1], in one pass (a literal that contains "$1" is not replaced
// again). Strings are written as escape-string constants (E'...'), which
// mean the same whatever standard_conforming_strings says; integers in
// decimal. Anything else, a string with a NUL byte (PostgreSQL's text cannot
// hold one), or a $n without its argument: false.
func writeWithLiterals(b *strings.Builder, query string, args []any) bool {
	for i := 0; i < len(query); i++ {
		if query[i] != '$' {
			b.WriteByte(query[i])
			continue
		}
		j := i + 1
		for j < len(query) && query[j] >= '0' && query[j] <= '9' {
			j++
		}
		n, err := strconv.Atoi(query[i+1 : j])
		if err != nil || n < 1 || n > len(args) {
			return false
		}
		switch v := args[n-1].(type) {
		case string:
			if strings.IndexByte(v, 0) >= 0 {
				return false
			}
			b.WriteString("E'")
			b.WriteString(escapeString.Replace(v))
			b.WriteByte('\'')
		case int64:
			b.WriteString(strconv.FormatInt(v, 10))
		default:
			return false
		}
		i = j - 1
	}
	return true
}

// oneSimpleQuery runs the check and the statement (its arguments written as
// constants, see interpolate) as one simple query: one round trip and one
// implicit transaction, which commits both or neither, as pgx's pipeline
// does. The result is the statement's, the query's last. A failure leaves no
// transaction open; a connection lost once the query is sent leaves the
// outcome unknown.
func oneSimpleQuery(ctx context.Context, c sqlhandle.Conn, query string) (sql.Result, error) {
	r, err := c.ExecContext(ctx, query)
	if err != nil {
		return nil, mapError(err, true)
	}
	return r, nil
}

// pipelineSimple runs head (BEGIN and the check, see literalStatements), query and
// COMMIT on c: three round trips where BEGIN, the check, the statement and
// COMMIT would take four, or six for a driver that prepares each statement
// with arguments in a round trip of its own. The transaction is not
// database/sql's: every way out that did not commit ends it here, and a
// connection whose transaction could not be ended is discarded, never
// returned to the pool inside it.
func pipelineSimple(ctx context.Context, c sqlhandle.Conn, head, query string, args []any) (sql.Result, error) {
	if _, err := c.ExecContext(ctx, head); err != nil {
		return nil, endSimple(ctx, c, mapError(err, false))
	}
	r, err := c.ExecContext(ctx, query, args...)
	if err != nil {
		return nil, endSimple(ctx, c, mapError(err, false))
	}
	if _, err := c.ExecContext(ctx, "COMMIT"); err != nil {
		return nil, endSimple(ctx, c, mapError(err, true))
	}
	return r, nil
}

// endSimple rolls back pipelineSimple's transaction (a ROLLBACK outside a
// transaction only warns) and returns err; when the ROLLBACK fails, the
// connection is closed instead of returned to the pool.
func endSimple(ctx context.Context, c sqlhandle.Conn, err error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, rerr := c.ExecContext(ctx, "ROLLBACK"); rerr != nil {
		_ = c.Raw(func(any) error { return driver.ErrBadConn })
	}
	return err
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
// conn, or (conn nil) savepoint in the caller's tx. several: conn's driver
// sends a statement without arguments as one simple query
// ([sqlhandle.SeveralStatements]).
type sqlTxn struct {
	tx        *sql.Tx
	conn      sqlhandle.Conn
	savepoint sqlhandle.Savepoint
	several   bool
}

func (t sqlTxn) handle() *sql.Tx { return t.tx }

// exec runs query in the transaction. When traced and ctx carries a trace
// id, the id is first set for the transaction (pgfence.fences stores it with
// the accepted token): database/sql cannot pipeline, so tracing costs a
// round trip here, except on a driver that sends several statements as one
// simple query (lib/pq), which gets both at once, its arguments as literals.
func (t sqlTxn) exec(ctx context.Context, traced bool, query string, args ...any) error {
	if t.several {
		if q, ok := literalStatements(ctx, traced, statement{query, args}); ok {
			_, err := t.tx.ExecContext(ctx, q)
			return err
		}
	}
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
