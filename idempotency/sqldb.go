package idempotency

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pgfence/pgfence/internal/driver"
)

// SQLDB is what [Store.DoSQL] runs on: a [*sql.DB] (or a type that embeds
// one, such as *sqlx.DB), a [*sql.Conn], or the caller's [*sql.Tx], from any
// PostgreSQL driver (lib/pq, pgx's stdlib). An ORM's transaction is passed as
// the *sql.Tx it wraps (sqlx and bun: tx.Tx; GORM:
// tx.Statement.ConnPool.(*sql.Tx)).
type SQLDB = driver.SQLDB

// DoSQL is [Store.Do] on database/sql: the claim on req's key, fn's writes
// and fn's result commit in one READ COMMITTED transaction, with the same
// outcomes, errors and guarantees. fn does the intent's writes through tx,
// the transaction that holds the claim, and returns the result to store, a
// [*Failure], or a transient error, as Do's does.
//
// When db is a *sql.Tx, the claim and fn's writes run under a savepoint of
// the caller's transaction and fn is given that *sql.Tx: the key, the
// intent's writes and everything else the caller writes in the transaction
// (a fenced write of pgfence.WriteSQL, say) commit together when the caller
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
func (s *Store) DoSQL(ctx context.Context, db SQLDB, req Request, fn func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (o *Outcome, err error) {
	ctx, done := s.tel.start(ctx, modeAtomic, req)
	defer func() { done(o, err) }()
	fp, retention, err := s.check(req)
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: fn is nil", ErrInvalid)
	}
	h, err := driver.SQL(db)
	if err != nil {
		return nil, err
	}
	return doAtomic(ctx, s, func(ctx context.Context, _ *claimArgs) (driver.Tx[*sql.Tx], error) {
		return h.Begin(ctx, true)
	}, req, fp, retention, fn)
}
