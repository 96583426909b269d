package pgfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The fenced and lease-checked writes are written once, here, against a
// session: where the write's statements run. Two adapters implement it,
// pgxSession (a *pgxpool.Pool, *pgx.Conn or pgx.Tx) and sqlSession (a
// *sql.DB, *sql.Conn or *sql.Tx, package sqlfence), so that both drivers give
// the same guarantees, errors and audit. T is what the caller's fn is given
// (pgx.Tx, *sql.Tx), R the result of a statement (pgconn.CommandTag,
// sql.Result).
type session[T, R any] interface {
	// ownCommit reports whether the write commits on its own: false inside
	// the caller's transaction, whose COMMIT is the caller's.
	ownCommit() bool
	// begin starts the write's transaction (a savepoint of the caller's),
	// on a connection it keeps until release. Errors are mapped.
	begin(ctx context.Context) (_ txn[T], release func(), _ error)
	// pipeline runs first (the fence or the lease check; traced: preceded by
	// the statement that names the context's trace), then sql with args, in
	// one transaction: one implicit transaction (one round trip) where the
	// driver pipelines, or the caller's. It returns sql's result. Errors are
	// mapped; a lost COMMIT wraps ErrOutcomeUnknown.
	pipeline(ctx context.Context, first statement, traced bool, sql string, args []any) (R, error)
	// conn returns a connection (or the caller's transaction) to run single
	// statements on, and the function that gives it back. Errors are mapped.
	conn(ctx context.Context) (_ stmtConn, release func(), _ error)
	stmtConn
}

// txn is the transaction of one Write or WriteLeased.
type txn[T any] interface {
	// handle is what the caller's fn gets.
	handle() T
	// exec runs one statement in the transaction (unmapped error); traced
	// sends the statement that names the context's trace first.
	exec(ctx context.Context, traced bool, sql string, args ...any) error
	// endedByFn reports whether the connection is outside any transaction
	// after fn returned (fn sent COMMIT or ROLLBACK as SQL), where the driver
	// can tell without a round trip; false otherwise (COMMIT then decides).
	endedByFn() bool
	// connLost reports whether fnErr, fn's error, came with a lost
	// connection (then it is mapped like the helper's own errors).
	connLost(fnErr error) bool
	// commit commits the transaction (releases the savepoint). Its error is
	// mapped: fnEndedTx when fn ended the transaction itself through the
	// driver's API, ErrOutcomeUnknown in the chain when COMMIT may have been
	// sent on the write's own transaction.
	commit(ctx context.Context) error
	// rollback rolls the transaction back (to the savepoint); a transaction
	// that has already ended is no error.
	rollback(ctx context.Context) error
}

// stmtConn runs single statements.
type stmtConn interface {
	// execRows runs sql and returns the rows it affected (unmapped error).
	execRows(ctx context.Context, sql string, args ...any) (int64, error)
	// queryRow runs sql; its row's Scan returns sql.ErrNoRows (or
	// pgx.ErrNoRows, which matches it) when there is none.
	queryRow(ctx context.Context, sql string, args ...any) rowScanner
}

type rowScanner interface{ Scan(dest ...any) error }

// statement is one statement and its arguments.
type statement struct {
	sql  string
	args []any
}

// noRows reports whether err says a query returned no row, whichever driver
// ran it.
func noRows(err error) bool { return errors.Is(err, sql.ErrNoRows) || errors.Is(err, pgx.ErrNoRows) }

// writeFenced is the fenced write of w (resource, token) in a transaction of
// s: the fence first, then fn, then COMMIT.
func writeFenced[T, R any](ctx context.Context, s session[T, R], w *write, fn func(ctx context.Context, tx T) error) (_ Receipt, err error) {
	resource, token := w.resource, w.token
	if err := validate(resource, token); err != nil {
		return Receipt{}, err
	}
	if fn == nil {
		return Receipt{}, fmt.Errorf("%w: fn is nil", ErrInvalid)
	}
	op := newOpID()
	w.id = op
	tx, release, err := s.begin(ctx)
	if err != nil {
		return Receipt{}, err
	}
	defer release()
	returned := false
	defer endOnPanic(ctx, tx, &returned, &err)
	if err := tx.exec(ctx, true, sqlFence, resource, token, op.String()); err != nil {
		return Receipt{}, rollback(ctx, tx, mapError(err, false))
	}
	ferr := fn(ctx, tx.handle())
	returned = true
	if ferr != nil {
		return Receipt{}, rollback(ctx, tx, mapFnError(tx, ferr))
	}
	if tx.endedByFn() {
		return Receipt{}, unknown(rollback(ctx, tx, fnEndedTx(true)), resource, token, op)
	}
	if err := tx.commit(ctx); err != nil {
		return Receipt{}, unknown(err, resource, token, op)
	}
	return Receipt{Resource: resource, Token: token, Op: op}, nil
}

// execFenced is the fenced write of w with one statement, sent with the
// fence as one pipeline where the driver can.
func execFenced[T, R any](ctx context.Context, s session[T, R], w *write, sql string, args []any) (R, error) {
	resource, token := w.resource, w.token
	if err := validate(resource, token); err != nil {
		var zero R
		return zero, err
	}
	op := newOpID()
	w.id = op
	r, err := s.pipeline(ctx, statement{sqlFence, []any{resource, token, op.String()}}, true, sql, args)
	if err != nil {
		return r, unknown(err, resource, token, op)
	}
	return r, nil
}

// writeLeased is the lease-checked write of w (key, holder, token) in a
// transaction of s: the lease check first, then fn, then COMMIT.
func writeLeased[T, R any](ctx context.Context, s session[T, R], w *write, fn func(ctx context.Context, tx T) error) (err error) {
	if err := w.validateLease(); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: fn is nil", ErrInvalid)
	}
	tx, release, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer release()
	returned := false
	defer endOnPanic(ctx, tx, &returned, &err)
	if err := tx.exec(ctx, false, sqlCheckLease, w.resource, w.holder, w.token); err != nil {
		return rollback(ctx, tx, mapError(err, false))
	}
	ferr := fn(ctx, tx.handle())
	returned = true
	if ferr != nil {
		return rollback(ctx, tx, mapFnError(tx, ferr))
	}
	if tx.endedByFn() {
		return rollback(ctx, tx, fnEndedTx(true))
	}
	return tx.commit(ctx)
}

// execLeased is the lease-checked write of w with one statement.
func execLeased[T, R any](ctx context.Context, s session[T, R], w *write, sql string, args []any) (R, error) {
	if err := w.validateLease(); err != nil {
		var zero R
		return zero, err
	}
	return s.pipeline(ctx, statement{sqlCheckLease, []any{w.resource, w.holder, w.token}}, false, sql, args)
}

// resolve abandons the write behind e in a statement of its own, then probes
// its resource in another: see [Resolve].
func resolve[T, R any](ctx context.Context, s session[T, R], e *OutcomeUnknownError) (Outcome, error) {
	if e == nil {
		return 0, fmt.Errorf("%w: nil *OutcomeUnknownError", ErrInvalid)
	}
	if !s.ownCommit() {
		return 0, fmt.Errorf("%w: Resolve needs a pool or a connection, not a transaction: its abandonment must commit before it probes", ErrInvalid)
	}
	if err := validate(e.Resource, e.Token); err != nil {
		return 0, err
	}
	if e.Op == (OpID{}) {
		return 0, fmt.Errorf("%w: the write has no operation id", ErrInvalid)
	}
	var abandoned bool
	if err := s.queryRow(ctx, sqlAbandon, e.Resource, e.Op.String()).Scan(&abandoned); err != nil {
		return 0, mapError(err, false)
	}
	var token, writes int64
	var op sql.NullString
	if err := s.queryRow(ctx, sqlProbe, e.Resource).Scan(&token, &writes, &op); err != nil {
		return 0, mapError(err, false)
	}
	switch {
	case writes == 0 || token < e.Token:
		return NotApplied, nil
	case token == e.Token && op.Valid && op.String == e.Op.String():
		return Applied, nil
	default:
		return Superseded, nil
	}
}
