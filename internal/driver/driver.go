// Package driver runs pgfence's statements on the handles its callers give
// — a pool, one connection, or the caller's transaction, of pgx or of
// database/sql — with one set of rules for every package:
//
//   - A helper's own transaction runs on one connection it keeps until the
//     transaction ends; in the caller's transaction it is a savepoint.
//   - Every failure is classified once ([pgerr.Classify]): a connection that
//     breaks after something that could commit was sent is an unknown
//     outcome, before that it is "unavailable"; a pool that gives no
//     connection sent nothing.
//   - A transaction the helper leaves is never left open: every way out that
//     did not commit rolls back, within a bounded time, even when the
//     caller's context has ended.
//
// [Pgx] and [SQL] make a [Handle]; T is the transaction handle the caller's
// code is given (pgx.Tx or *sql.Tx).
package driver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/telemetry"
)

// Stmt is one statement and its arguments.
type Stmt struct {
	SQL  string
	Args []any
}

// Row is one row of a query; Scan reports [NoRows] when there is none.
type Row interface{ Scan(dest ...any) error }

// Handle is where a helper runs: what its caller gave it.
type Handle[T any] interface {
	// InTx reports whether the handle is the caller's transaction: the
	// helper joins it (under a savepoint) and its COMMIT is the caller's.
	InTx() bool
	// Begin starts the helper's transaction on a connection it keeps until
	// the transaction ends, READ COMMITTED when readCommitted is set, or a
	// savepoint of the caller's transaction (which keeps its level). The
	// error is classified: nothing that could commit was sent.
	Begin(ctx context.Context, readCommitted bool) (Tx[T], error)
	// Pipeline runs stmts in one transaction and returns the rows the last
	// one affected: one round trip and one implicit transaction where the
	// driver pipelines (pgx, pgx's database/sql driver), else a transaction
	// of its own; in the caller's transaction they join it. The error is
	// classified.
	Pipeline(ctx context.Context, stmts ...Stmt) (int64, error)
	// QueryRow runs one statement on its own, which commits on its own
	// outside the caller's transaction. Scan's error is classified.
	QueryRow(ctx context.Context, sql string, args ...any) Row
	// Read is QueryRow for a statement that changes nothing: a connection
	// lost after it was sent is "unavailable", never an unknown outcome.
	Read(ctx context.Context, sql string, args ...any) Row
}

// Tx is a helper's transaction, or its savepoint in the caller's.
type Tx[T any] interface {
	// Handle is what the caller's code is given to write with.
	Handle() T
	// Exec runs stmts in the transaction, in one round trip where the
	// driver pipelines; Query does too, and scans the last one's row into
	// dest. Their errors are not classified (see [Tx.Classify]).
	Exec(ctx context.Context, stmts ...Stmt) error
	Query(ctx context.Context, dest []any, stmts ...Stmt) error
	// Classify classifies the error of a statement in the transaction, or
	// of the caller's code: a server's answer by its SQLSTATE, a lost
	// connection as "unavailable" (nothing committed); any other error is
	// the caller's own and returned as is.
	Classify(err error) error
	// EndedByCaller reports whether the caller's code ended the
	// transaction itself (COMMIT or ROLLBACK, through the driver's API or as
	// SQL), where the driver tells without a round trip.
	EndedByCaller() bool
	// Commit commits (releases the savepoint), sending last first in the
	// same round trip where the driver can, with its row scanned into
	// dest. The error is classified: on the helper's own transaction a lost
	// connection is an unknown outcome; [ErrEndedByCaller] when the caller's
	// code had ended the transaction.
	Commit(ctx context.Context, last *Stmt, dest ...any) error
	// Rollback rolls back (to the savepoint) unless it committed, and gives
	// the connection back. A transaction that has ended is no error.
	Rollback(ctx context.Context) error
}

// ErrEndedByCaller is the error of a commit whose transaction the caller's
// code had ended itself: the helper cannot tell what committed.
var ErrEndedByCaller = errors.New("the transaction was committed or rolled back by the code given to the helper; it must leave that to the helper")

// EndedByCaller returns the error of a helper whose transaction the caller's
// code ended: an unknown outcome when what it ended may have committed the
// helper's work (the helper's own transaction, or the caller's whole
// transaction that the helper's savepoint was in), else ErrInvalid only (it
// ended the helper's savepoint alone, or left the caller's transaction
// aborted).
func EndedByCaller(mayHaveCommitted bool) error {
	if mayHaveCommitted {
		return fmt.Errorf("%w: %w: %w", pgerr.ErrOutcomeUnknown, pgerr.ErrInvalid, ErrEndedByCaller)
	}
	return fmt.Errorf("%w: %w", pgerr.ErrInvalid, ErrEndedByCaller)
}

// RollbackTimeout bounds a ROLLBACK after a failure, whose context may have
// ended.
const RollbackTimeout = 5 * time.Second

// rollbackContext is the context of a ROLLBACK after a failure: ctx's values
// without its end, bounded by RollbackTimeout, so that a cancelled caller
// still releases the transaction's locks.
func rollbackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), RollbackTimeout)
}

// Abort rolls tx back after a failure and returns cause, joined with the
// rollback's error if it had one.
func Abort[T any](ctx context.Context, tx Tx[T], cause error) error {
	rctx, cancel := rollbackContext(ctx)
	defer cancel()
	if err := tx.Rollback(rctx); err != nil {
		return errors.Join(cause, fmt.Errorf("pgfence: rollback: %w", err))
	}
	return cause
}

// NoRows reports whether err says a query returned no row, whichever driver
// ran it.
func NoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) || errors.Is(err, pgx.ErrNoRows) }

// SetTraceIDSQL names the trace for the rest of the current transaction
// (pgfence.current_trace_id() reads it), so that pgfence's rows record it.
const SetTraceIDSQL = `SELECT pg_catalog.set_config('pgfence.trace_id', $1, true)`

// Traced returns stmts preceded by the statement that names ctx's trace,
// when ctx carries one.
func Traced(ctx context.Context, stmts ...Stmt) []Stmt {
	if id := telemetry.TraceID(ctx); id != "" {
		return append([]Stmt{{SetTraceIDSQL, []any{id}}}, stmts...)
	}
	return stmts
}

// Acquired classifies the failure to get a connection: nothing was sent. A
// context that ended first is the caller's deadline (its cause is returned),
// anything else an outage.
func Acquired(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); !errors.Is(err, cause) {
			return fmt.Errorf("%w: %w", cause, err)
		}
		return err
	}
	if c := pgerr.Classify(err, false); errors.Is(c, pgerr.ErrUnavailable) {
		return c
	}
	return fmt.Errorf("%w: %w", pgerr.ErrUnavailable, err) // a closed pool
}

// errRow is the row of a statement that was not sent.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// classifiedRow classifies its Scan's error.
type classifiedRow struct {
	Row
	sent bool
}

func (r classifiedRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if err == nil || NoRows(err) {
		return err
	}
	return pgerr.Classify(err, r.sent)
}
