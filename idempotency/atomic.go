package idempotency

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/telemetry"
)

const (
	claimAtomicSQL = `SELECT outcome, coalesce(status, ''), result, coalesce(failure_code, ''), coalesce(failure_message, ''), expires_at,
       (extract(epoch FROM retry_after) * 1e6)::bigint
  FROM pgfence.idempotency_claim_atomic($1, $2, $3, $4 * interval '1 microsecond', $5 * interval '1 microsecond')`

	completeAtomicSQL = `SELECT pgfence.idempotency_complete_atomic($1, $2, $3, $4, $5)`
)

// Do applies an atomic intent once: the claim on req's key, fn's writes and
// fn's result commit in one READ COMMITTED transaction on db.
//
// fn does the business work inside tx, the transaction that holds the
// claim. It returns the result to store and replay (nil is stored as
// empty), a [*Failure] to store a permanent failure (its writes are rolled
// back), or any other error for a transient failure (nothing is stored, the
// key stays free; Do returns it, an error of fn's own statements mapped to
// pgfence's sentinels as pgfence.MapError maps it). It must do all its
// writes through tx; it may run again after a rolled-back attempt, never
// after a committed one.
//
//   - fn ran and committed: Result (or Failure) is what it produced.
//   - [Outcome.Replayed]: an earlier attempt committed; its stored answer is
//     returned and fn does not run. A duplicate that arrives while the first
//     attempt's transaction is open waits for it (at most
//     [Config.WaitTimeout] and ctx), then replays its result, or runs fn if
//     the first attempt rolled back.
//   - An [*InProgressError] (errors.Is [ErrInProgress]): the first attempt
//     did not finish within the wait.
//   - [ErrMismatch]: the key was used with another payload.
//
// When db is a [pgx.Tx] the work runs under a savepoint of the caller's
// transaction, and only the caller's COMMIT makes it durable; the caller's
// transaction must be READ COMMITTED ([ErrIsolation] otherwise). With a pool or
// connection Do commits itself; a broken connection during that commit returns
// [ErrOutcomeUnknown]: call Do again with the same request to learn the answer.
//
// On a pool or a connection a new key costs BEGIN with the claim in one
// message, fn's statements, and the result with COMMIT in one pipeline; a
// duplicate costs four round trips (see the package documentation).
// [Store.Begin] is the same claim for a caller that drives the work itself (a
// middleware, an interceptor).
func (s *Store) Do(ctx context.Context, db DB, req Request, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (*Outcome, error) {
	return doAtomic(ctx, s, req, pgxOpener(db), fn)
}

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
func (s *Store) DoSQL(ctx context.Context, db SQLDB, req Request, fn func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (*Outcome, error) {
	return doAtomic(ctx, s, req, func(ctx context.Context, _ *claimArgs) (driver.Tx[*sql.Tx], error) {
		h, err := driver.SQL(db)
		if err != nil {
			return nil, err
		}
		return h.Begin(ctx, true)
	}, fn)
}

// opener opens the transaction of an atomic claim: on a pool or a
// connection a READ COMMITTED transaction of its own, inside the caller's
// transaction a savepoint. An opener that can send the claim in its BEGIN's
// message does so and sets c.claimed. T is what the work is given.
type opener[T any] func(ctx context.Context, c *claimArgs) (driver.Tx[T], error)

// doAtomic is Do and DoSQL on the transactions open opens: fn's writes, the
// claim and the result commit together; a [*Failure] from fn is stored in a
// transaction of its own, unless a concurrent attempt completed the key
// meanwhile.
func doAtomic[T any](ctx context.Context, s *Store, req Request, open opener[T], fn func(context.Context, T) ([]byte, error)) (o *Outcome, err error) {
	ctx, done := s.tel.start(ctx, modeAtomic, req)
	defer func() { done(o, err) }()
	c, err := s.check(req)
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: fn is nil", ErrInvalid)
	}
	out, err := runAtomic(ctx, c, open, fn, nil)
	if failure := (*Failure)(nil); errors.As(err, &failure) {
		if err := failure.check(); err != nil {
			return nil, err
		}
		return runAtomic(ctx, c, open, fn, failure)
	}
	return out, err
}

// runAtomic claims c's key and, for a new key, commits fn's writes and
// result, or failure without running fn.
func runAtomic[T any](ctx context.Context, c claimArgs, open opener[T], fn func(context.Context, T) ([]byte, error), failure *Failure) (*Outcome, error) {
	out, a, err := beginAtomic(ctx, c, open)
	if err != nil || out.Replayed {
		return out, err
	}
	defer a.end() // rolls back unless committed
	var result []byte
	if failure == nil {
		if result, err = fn(ctx, a.tx.Handle()); err != nil {
			return nil, a.tx.Classify(err) // transient (its own statements' errors mapped), or a *Failure for doAtomic
		}
		result = nonNil(result)
	}
	expiresAt, err := a.settle(ctx, result, failure)
	if err != nil {
		return nil, err
	}
	return &Outcome{Result: result, Failure: failure, ExpiresAt: expiresAt}, nil
}

// Begin claims req's key for atomic work that the caller drives itself: a
// READ COMMITTED transaction on db is opened, the key is claimed in it as
// [Store.Do] claims it, and the transaction stays open for the caller.
//
//   - Not replayed: [Outcome.Attempt] holds the claim. Do the work through its
//     [Attempt.Tx], then end it with [Attempt.Complete] or [Attempt.Fail]
//     (the answer is stored and commits together with the work) or
//     [Attempt.Release] (the work is rolled back, the key is free). Until
//     then the transaction holds a connection and the key: a duplicate
//     waits for it (see [Config.WaitTimeout]). Like a [pgx.Tx], the attempt
//     is not safe for concurrent use.
//   - Replayed, in progress, mismatch: as for Do; no transaction stays open.
//
// On a pool or a connection a new key costs one round trip (BEGIN and the
// claim in one message), a duplicate four. db may be a [pgx.Tx] (the work
// runs under a savepoint of it, as with Do).
func (s *Store) Begin(ctx context.Context, db DB, req Request) (o *Outcome, err error) {
	ctx, done := s.tel.start(ctx, modeAtomic, req)
	defer func() { done(o, err) }()
	c, err := s.check(req)
	if err != nil {
		return nil, err
	}
	out, a, err := beginAtomic(ctx, c, pgxOpener(db))
	if a != nil {
		out.Attempt = &Attempt{store: s, scope: req.Scope, key: req.Key, atomic: a}
	}
	return out, err
}

// beginAtomic opens a transaction and claims c's key in it. For a new key
// it returns the open attempt; otherwise the transaction has ended.
func beginAtomic[T any](ctx context.Context, c claimArgs, open opener[T]) (*Outcome, *attempt[T], error) {
	tx, err := open(ctx, &c)
	if err != nil {
		return nil, nil, err
	}
	out := &Outcome{}
	if !c.claimed {
		out, err = claimAtomic(ctx, tx, &c)
		if err != nil || out.Replayed {
			_ = driver.Abort(ctx, tx, nil)
			return out, nil, err
		}
	}
	return out, &attempt[T]{store: c.store, scope: c.scope, key: c.key, tx: tx}, nil
}

// attempt is an open atomic claim on a transaction of any driver.
type attempt[T any] struct {
	store      *Store
	scope, key string
	tx         driver.Tx[T]
	ended      bool
}

// settle stores result, or f, and commits. A result over the limit is
// refused before anything is sent, and the attempt stays open.
func (a *attempt[T]) settle(ctx context.Context, result []byte, f *Failure) (time.Time, error) {
	if a.ended {
		return time.Time{}, fmt.Errorf("idempotency: atomic attempt on %s/%s: %w", a.scope, a.key, pgx.ErrTxClosed)
	}
	var code, message *string
	if f != nil {
		result, code, message = f.Data, &f.Code, &f.Message
	} else if err := checkSize("result", result, MaxResultBytes); err != nil {
		return time.Time{}, err
	}
	defer a.end()
	var expiresAt time.Time
	if err := a.tx.Commit(ctx, &driver.Stmt{SQL: completeAtomicSQL, Args: []any{a.scope, a.key, result, code, message}}, &expiresAt); err != nil {
		return time.Time{}, err
	}
	a.store.tel.log.DebugContext(ctx, "idempotency: atomic key applied", "scope", a.scope, "key", a.key, "failed", f != nil)
	return expiresAt, nil
}

// end rolls back unless the attempt committed; again, it does nothing.
func (a *attempt[T]) end() {
	a.ended = true
	_ = driver.Abort(context.Background(), a.tx, nil)
}

// pgxOpener opens atomic claims on db: on a pool or a connection with the
// claim in BEGIN's message (see beginClaim), in a transaction a savepoint.
// A nil db is refused when it opens.
func pgxOpener(db DB) opener[pgx.Tx] {
	return func(ctx context.Context, c *claimArgs) (driver.Tx[pgx.Tx], error) {
		h, err := driver.Pgx(db)
		if err != nil {
			return nil, err
		}
		conn, release, err := driver.Conn(ctx, db)
		if err != nil {
			return nil, err
		}
		if conn == nil { // the caller's transaction
			return h.Begin(ctx, true)
		}
		tx, err := beginClaim(ctx, conn, c)
		if err != nil {
			release()
			return nil, pgerr.Classify(err, false)
		}
		return driver.BeginPgx(tx, true, release), nil
	}
}

// beginClaim begins a READ COMMITTED transaction on conn and claims c's key
// in the same message (pgfence.idempotency_claim_atomic_new), so that a new
// key costs one round trip instead of two. Any other outcome aborts that
// transaction: it is rolled back and a fresh one begun in one more round
// trip, without the claim, which the caller then sends alone to learn the
// outcome. An in-progress key was waited for already: that claim waits the
// least it can.
func beginClaim(ctx context.Context, conn *pgx.Conn, c *claimArgs) (pgx.Tx, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: c.beginSQL(telemetry.TraceID(ctx))})
	if err == nil {
		c.claimed = true
		return tx, nil
	}
	switch pgerr.Code(err) {
	case pgerr.CodeKeyInProgress:
		c.wait = minWait
		fallthrough
	case pgerr.CodeKeyDone, pgerr.CodeKeyMismatch:
		return conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: "rollback; begin isolation level read committed"})
	}
	// Refused (a standby, a role not granted the scope, …) or the
	// connection broke: leave no aborted transaction on a connection that
	// goes back to its pool.
	if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), driver.RollbackTimeout)
		defer cancel()
		if _, rerr := conn.Exec(rctx, "rollback"); rerr != nil {
			conn.Close(rctx)
		}
	}
	return nil, err
}

// minWait is the shortest wait idempotency_claim_atomic accepts.
const minWait = time.Millisecond

// beginSQL is BEGIN and the claim as one simple-protocol message (pgx sends
// a BeginQuery as is, without parameters). Every value is spelled in hex or
// as an integer, so nothing in a key can change the statement.
func (c *claimArgs) beginSQL(traceID string) string {
	var b strings.Builder
	b.WriteString("begin isolation level read committed; ")
	if traceID != "" {
		b.WriteString("select pg_catalog.set_config('pgfence.trace_id', ")
		writeText(&b, traceID)
		b.WriteString(", true); ")
	}
	b.WriteString("select pgfence.idempotency_claim_atomic_new(")
	writeText(&b, c.scope)
	b.WriteString(", ")
	writeText(&b, c.key)
	b.WriteString(", ")
	writeBytea(&b, c.fingerprint)
	fmt.Fprintf(&b, ", %d * interval '1 microsecond', %d * interval '1 microsecond')", c.wait.Microseconds(), c.retention.Microseconds())
	return b.String()
}

// writeBytea writes p as a bytea expression.
func writeBytea(b *strings.Builder, p []byte) {
	b.WriteString("pg_catalog.decode('")
	b.WriteString(hex.EncodeToString(p))
	b.WriteString("', 'hex')")
}

// writeText writes s (valid UTF-8, checked before) as a text expression of
// the default collation. convert_from's result would otherwise take the
// collation "C" of its encoding argument (type name), a PL/pgSQL function
// given it compares with that collation, and the key's index (default
// collation) cannot serve the lookup: every claim would scan the table.
func writeText(b *strings.Builder, s string) {
	b.WriteString("pg_catalog.convert_from(")
	writeBytea(b, []byte(s))
	b.WriteString(`, 'UTF8') COLLATE pg_catalog."default"`)
}

// claimAtomic claims the key in tx or reports what holds it. The claim
// travels with the statement that names the context's trace, in one round
// trip where the driver pipelines.
func claimAtomic[T any](ctx context.Context, tx driver.Tx[T], c *claimArgs) (*Outcome, error) {
	var (
		outcome, status, code, message string
		result                         []byte
		expiresAt                      *time.Time
		retryAfter                     *int64
	)
	err := tx.Query(ctx, []any{&outcome, &status, &result, &code, &message, &expiresAt, &retryAfter},
		driver.Traced(ctx, driver.Stmt{SQL: claimAtomicSQL, Args: []any{c.scope, c.key, c.fingerprint, c.wait.Microseconds(), c.retention.Microseconds()}})...)
	switch {
	case err != nil:
		return nil, classify(tx.Classify(err), false)
	case outcome == "new":
		return &Outcome{}, nil
	case outcome == "replayed":
		return replayed(status, result, code, message, expiresAt), nil
	case outcome == "mismatch":
		return nil, ErrMismatch
	}
	return nil, c.inProgress(retryAfter)
}

// inProgress is the error of a key another attempt holds, with the rest of
// its lease as the hint, or the store's [Config.RetryAfter] when there is
// none.
func (c *claimArgs) inProgress(retryAfter *int64) error {
	return &InProgressError{Scope: c.scope, Key: c.key, RetryAfter: cmp.Or(fromMicros(retryAfter), c.store.retryAfter)}
}

// replayed is the stored answer of a completed key.
func replayed(status string, result []byte, code, message string, expiresAt *time.Time) *Outcome {
	if status == "failed" {
		return &Outcome{Replayed: true, Failure: &Failure{Code: code, Message: message, Data: result}, ExpiresAt: orZero(expiresAt)}
	}
	return &Outcome{Replayed: true, Result: nonNil(result), ExpiresAt: orZero(expiresAt)}
}
