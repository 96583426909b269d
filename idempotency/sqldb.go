package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/internal/sqlhandle"
	"github.com/pgfence/pgfence/internal/telemetry"
	"github.com/pgfence/pgfence/internal/tracesql"
)

// SQLDB is what [Store.DoSQL] runs on: a [*sql.DB] (or a type that embeds
// one, such as *sqlx.DB), a [*sql.Conn], or the caller's [*sql.Tx], from any
// PostgreSQL driver (lib/pq, pgx's stdlib). An ORM's transaction is passed as
// the *sql.Tx it wraps (sqlx and bun: tx.Tx; GORM:
// tx.Statement.ConnPool.(*sql.Tx)).
type SQLDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ SQLDB = (*sql.DB)(nil)
	_ SQLDB = (*sql.Conn)(nil)
	_ SQLDB = (*sql.Tx)(nil)
)

// SQLFunc is a [Func] for database/sql: it does the intent's writes through
// tx, the transaction that holds the claim, and returns the result to store,
// a [*Failure], or a transient error, as a Func does.
type SQLFunc func(ctx context.Context, tx *sql.Tx) ([]byte, error)

// DoSQL is [Store.Do] on database/sql: the claim on req's key, fn's writes
// and fn's result commit in one READ COMMITTED transaction, with the same
// outcomes, errors and guarantees.
//
// When db is a *sql.Tx, the claim and fn's writes run under a savepoint of
// the caller's transaction and fn is given that *sql.Tx: the key, the
// intent's writes and everything else the caller writes in the transaction
// (a fenced write of package sqlfence, say) commit together when the caller
// commits, or not at all; the caller's transaction must be READ COMMITTED
// ([ErrIsolation] otherwise). On a *sql.DB or a *sql.Conn, DoSQL runs a READ
// COMMITTED transaction of its own and commits it; a connection lost while
// the COMMIT was on its way returns [ErrOutcomeUnknown] (with lib/pq too,
// whose driver.ErrBadConn does not say whether the COMMIT was sent): call
// DoSQL again with the same request to learn the answer.
//
// A new key costs BEGIN, the claim, fn's statements, the stored result and
// COMMIT; database/sql cannot send the result with the COMMIT in one
// pipeline as [Store.Do] does on pgx, so it is one round trip more. fn must
// not commit or roll back tx.
func (s *Store) DoSQL(ctx context.Context, db SQLDB, req Request, fn SQLFunc) (o *Outcome, err error) {
	ctx, done := s.tel.start(ctx, modeAtomic, req)
	defer func() { done(o, err) }()
	fp, retention, err := s.check(req)
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: fn is nil", ErrInvalid)
	}
	h, err := sqlhandle.Of(db)
	if err != nil {
		return nil, err
	}
	return doAtomic(ctx, s, sqlOpener(h), req, fp, retention, fn)
}

// sqlOpener opens atomic claims on the database/sql handle h.
func sqlOpener(h sqlhandle.Handle) opener[*sql.Tx] {
	return func(ctx context.Context, _ *claimArgs) (claimTx[*sql.Tx], error) {
		if h.Tx != nil {
			sp := sqlhandle.NewSavepoint()
			if _, err := h.Tx.ExecContext(ctx, sp.Create()); err != nil {
				return nil, err
			}
			return &sqlClaimTx{tx: h.Tx, savepoint: sp}, nil
		}
		c, release, err := h.Own(ctx)
		if err != nil {
			return nil, err
		}
		tx, err := c.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			release()
			return nil, err
		}
		return &sqlClaimTx{tx: tx, release: release}, nil
	}
}

// sqlClaimTx is the transaction of one atomic attempt on database/sql: its
// own (on a connection it holds until release), or a savepoint of the
// caller's.
type sqlClaimTx struct {
	tx        *sql.Tx
	savepoint sqlhandle.Savepoint // in the caller's tx ("": its own transaction)
	release   func()              // gives back a connection taken from a pool
	committed bool
	ended     bool
}

func (t *sqlClaimTx) handle() *sql.Tx { return t.tx }

// claim runs the claim; when ctx carries a trace id, the id is first set for
// the transaction in a statement of its own (database/sql cannot pipeline).
func (t *sqlClaimTx) claim(ctx context.Context, query string, args ...any) rowScanner {
	if id := telemetry.TraceID(ctx); id != "" {
		if _, err := t.tx.ExecContext(ctx, tracesql.SetTraceIDSQL, id); err != nil {
			return errRow{err}
		}
	}
	return t.tx.QueryRowContext(ctx, query, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func (t *sqlClaimTx) completeAndCommit(ctx context.Context, scope, key string, result []byte, code, message *string) (time.Time, error) {
	var expiresAt time.Time
	if err := t.tx.QueryRowContext(ctx, completeAtomicSQL, scope, key, result, code, message).Scan(&expiresAt); err != nil {
		return time.Time{}, classify(err, false)
	}
	if t.savepoint != "" {
		if _, err := t.tx.ExecContext(ctx, t.savepoint.Release()); err != nil {
			// The caller's transaction cannot commit: nothing was stored.
			return time.Time{}, classify(err, false)
		}
		t.committed = true
		return expiresAt, nil
	}
	err := t.tx.Commit()
	switch {
	case err == context.Canceled || err == context.DeadlineExceeded: // the bare value, not wrapped
		// database/sql found the context ended before it sent COMMIT, and
		// rolls the transaction back.
		return time.Time{}, err
	case err != nil:
		return time.Time{}, classify(err, true)
	}
	t.committed = true
	return expiresAt, nil
}

// end rolls back an attempt that did not commit and gives back its
// connection.
func (t *sqlClaimTx) end() {
	if t.ended {
		return
	}
	if !t.committed {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = t.rollbackTx(ctx)
	}
	t.done()
}

func (t *sqlClaimTx) rollback(ctx context.Context) error {
	if t.ended {
		return nil
	}
	err := t.rollbackTx(ctx)
	t.done()
	return err
}

// rollbackTx rolls the transaction (the savepoint) back; one that has ended
// already is no error.
func (t *sqlClaimTx) rollbackTx(ctx context.Context) error {
	var err error
	if t.savepoint != "" {
		_, err = t.tx.ExecContext(ctx, t.savepoint.RollbackTo())
	} else {
		err = t.tx.Rollback()
	}
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

func (t *sqlClaimTx) done() {
	t.ended = true
	if t.release != nil {
		t.release()
	}
}
