package pgfence

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/tracesql"
)

// pgxSession runs the writes on a [DB]: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx.
type pgxSession struct{ db DB }

var _ session[pgx.Tx, pgconn.CommandTag] = pgxSession{}

func (s pgxSession) ownCommit() bool { return ownCommit(s.db) }

func (s pgxSession) begin(ctx context.Context) (txn[pgx.Tx], func(), error) {
	tx, release, err := begin(ctx, s.db)
	if err != nil {
		return nil, nil, err
	}
	return pgxTxn{tx: tx, own: ownCommit(s.db)}, release, nil
}

func (s pgxSession) pipeline(ctx context.Context, first statement, traced bool, sql string, args []any) (pgconn.CommandTag, error) {
	conn, release, err := acquire(ctx, s.db)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer release()
	tag, err := pipelineBatch(ctx, conn, first, traced, sql, args)
	if err != nil {
		return tag, mapError(err, ownCommit(s.db))
	}
	return tag, nil
}

// pipelineBatch sends first (after the trace statement, when traced and ctx
// carries a trace) and sql as one batch on db: one round trip, one implicit
// transaction on a connection. The error is not mapped.
func pipelineBatch(ctx context.Context, db DB, first statement, traced bool, sql string, args []any) (pgconn.CommandTag, error) {
	b := &pgx.Batch{}
	if traced {
		tracesql.Queue(ctx, b)
	}
	b.Queue(first.sql, first.args...)
	b.Queue(sql, args...)
	return execBatch(ctx, db, b)
}

func (s pgxSession) conn(ctx context.Context) (stmtConn, func(), error) {
	conn, release, err := acquire(ctx, s.db)
	if err != nil {
		return nil, nil, err
	}
	return pgxSession{conn}, release, nil
}

func (s pgxSession) execRows(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := s.db.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (s pgxSession) queryRow(ctx context.Context, sql string, args ...any) rowScanner {
	return s.db.QueryRow(ctx, sql, args...)
}

// pgxTxn is the transaction of a Write on a [DB]: the helper's own, or a
// savepoint of the caller's pgx.Tx.
type pgxTxn struct {
	tx  pgx.Tx
	own bool // the helper's own transaction, not a savepoint
}

func (t pgxTxn) handle() pgx.Tx { return t.tx }

// exec runs sql in the transaction. When traced and ctx carries a trace id,
// the id is set for the transaction in the same pipeline (pgfence.fences
// stores it with the accepted token), so tracing adds no round trip.
func (t pgxTxn) exec(ctx context.Context, traced bool, sql string, args ...any) error {
	b := &pgx.Batch{}
	if !traced || !tracesql.Queue(ctx, b) {
		_, err := t.tx.Exec(ctx, sql, args...)
		return err
	}
	b.Queue(sql, args...)
	_, err := execBatch(ctx, t.tx, b)
	return err
}

// endedByFn reports whether the connection of tx is outside any transaction
// after fn returned: fn ended the transaction itself, with tx.Commit or
// tx.Rollback, or with SQL (COMMIT or ROLLBACK through tx.Exec), which pgx's
// tx does not notice: a COMMIT sent then succeeds with a mere warning, for a
// fence that may have been rolled back. Reading the status costs no round
// trip. A pgx.Tx of another implementation without a connection reports
// false (its Commit then decides, as before).
func (t pgxTxn) endedByFn() bool {
	c := t.tx.Conn()
	return c != nil && c.PgConn() != nil && c.PgConn().TxStatus() == 'I'
}

func (t pgxTxn) connLost(error) bool {
	c := t.tx.Conn()
	return c != nil && c.PgConn() != nil && c.PgConn().IsClosed()
}

func (t pgxTxn) commit(ctx context.Context) error {
	err := t.tx.Commit(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrTxClosed):
		return fnEndedTx(t.own)
	case !t.own:
		// A lost RELEASE SAVEPOINT kills the caller's transaction: nothing
		// can commit, so the outcome is known.
		return mapError(err, false)
	}
	return mapError(err, true)
}

func (t pgxTxn) rollback(ctx context.Context) error {
	if err := t.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// acquire returns what a helper whose statement commits on its own runs it
// on: db itself, or for a pool one of its connections, with the function that
// gives it back. A pool that gives no connection (the context ended while the
// pool was exhausted, or before the call; the pool is closed) has sent
// nothing, so that error is never an unknown outcome, which it would be if
// the pool's own Exec or SendBatch reported it after the statement was
// handed over.
func acquire(ctx context.Context, db DB) (DB, func(), error) {
	p, ok := db.(*pgxpool.Pool)
	if !ok {
		return db, func() {}, nil
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil, nil, mapError(err, false)
	}
	return c, c.Release, nil
}

// begin starts the transaction of [Write] or [WriteLeased] on db. On a pool
// it first acquires a connection that it keeps until release, so that the
// connection stays the helper's even if fn commits or rolls back tx itself
// (see pgxTxn.endedByFn).
func begin(ctx context.Context, db DB) (pgx.Tx, func(), error) {
	conn, release, err := acquire(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		release()
		return nil, nil, mapError(err, false)
	}
	return tx, release, nil
}

// execBatch sends b and returns the last statement's command tag.
func execBatch(ctx context.Context, db DB, b *pgx.Batch) (pgconn.CommandTag, error) {
	br := db.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	var err error
	for range b.Len() {
		if tag, err = br.Exec(); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}
