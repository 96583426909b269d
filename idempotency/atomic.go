package idempotency

import (
	"context"
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
	claimAtomicSQL = `SELECT outcome, status, result, failure_code, failure_message, expires_at,
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
func (s *Store) Do(ctx context.Context, db DB, req Request, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (o *Outcome, err error) {
	ctx, done := s.tel.start(ctx, modeAtomic, req)
	defer func() { done(o, err) }()
	fp, retention, err := s.check(req)
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: fn is nil", ErrInvalid)
	}
	open, err := pgxOpener(db)
	if err != nil {
		return nil, err
	}
	return doAtomic(ctx, s, open, req, fp, retention, fn)
}

// opener opens the transaction of an atomic claim: on a pool or a
// connection a READ COMMITTED transaction of its own, inside the caller's
// transaction a savepoint. An opener that can send the claim in its BEGIN's
// message does so and sets c.claimed. T is what the work is given.
type opener[T any] func(ctx context.Context, c *claimArgs) (driver.Tx[T], error)

// claimArgs are the arguments of one atomic claim.
type claimArgs struct {
	scope, key      string
	fingerprint     []byte
	wait, retention time.Duration
	// claimed: the opener claimed the key (outcome new) with its BEGIN.
	claimed bool
}

// doAtomic is Do on the transactions open opens: fn's writes, the claim and
// the result commit together; a [*Failure] from fn is stored in a
// transaction of its own, unless a concurrent attempt completed the key
// meanwhile.
func doAtomic[T any](ctx context.Context, s *Store, open opener[T], req Request, fp []byte, retention time.Duration, fn func(context.Context, T) ([]byte, error)) (*Outcome, error) {
	out, err := runAtomic(ctx, s, open, req, fp, retention, fn, nil)
	if failure := (*Failure)(nil); errors.As(err, &failure) {
		if err := failure.check(); err != nil {
			return nil, err
		}
		return runAtomic(ctx, s, open, req, fp, retention, nil, failure)
	}
	return out, err
}

// runAtomic claims req's key and, for a new key, commits fn's writes and
// result, or failure without running fn.
func runAtomic[T any](ctx context.Context, s *Store, open opener[T], req Request, fp []byte, retention time.Duration, fn func(context.Context, T) ([]byte, error), failure *Failure) (*Outcome, error) {
	out, a, err := beginAtomic(ctx, s, open, req, fp, retention)
	if err != nil || out.Replayed {
		return out, err
	}
	defer a.end() // rolls back unless committed
	var result []byte
	if failure == nil {
		if result, err = fn(ctx, a.tx.Handle()); err != nil {
			return nil, a.tx.Classify(err) // transient (its own statements' errors mapped), or a *Failure for doAtomic
		}
		if err := checkSize("result", result, MaxResultBytes); err != nil {
			return nil, err
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
	fp, retention, err := s.check(req)
	if err != nil {
		return nil, err
	}
	open, err := pgxOpener(db)
	if err != nil {
		return nil, err
	}
	out, a, err := beginAtomic(ctx, s, open, req, fp, retention)
	if a != nil {
		out.Attempt = &Attempt{store: s, scope: req.Scope, key: req.Key, atomic: a}
	}
	return out, err
}

// beginAtomic opens a transaction and claims req's key in it. For a new key
// it returns the open attempt; otherwise the transaction has ended.
func beginAtomic[T any](ctx context.Context, s *Store, open opener[T], req Request, fp []byte, retention time.Duration) (*Outcome, *attempt[T], error) {
	c := &claimArgs{scope: req.Scope, key: req.Key, fingerprint: fp, wait: s.wait, retention: retention}
	tx, err := open(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	out := &Outcome{}
	if !c.claimed {
		out, err = claimAtomic(ctx, s, tx, req, c)
		if err != nil || out.Replayed {
			_ = driver.Abort(ctx, tx, nil)
			return out, nil, err
		}
	}
	return out, &attempt[T]{store: s, scope: req.Scope, key: req.Key, tx: tx}, nil
}

// attempt is an open atomic claim on a transaction of any driver.
type attempt[T any] struct {
	store      *Store
	scope, key string
	tx         driver.Tx[T]
	ended      bool
}

// settle stores result, or f, and commits.
func (a *attempt[T]) settle(ctx context.Context, result []byte, f *Failure) (time.Time, error) {
	if a.ended {
		return time.Time{}, fmt.Errorf("idempotency: atomic attempt on %s/%s: %w", a.scope, a.key, pgx.ErrTxClosed)
	}
	defer a.end()
	var code, message *string
	if f != nil {
		result, code, message = f.Data, &f.Code, &f.Message
	}
	var expiresAt time.Time
	if err := a.tx.Commit(ctx, &driver.Stmt{SQL: completeAtomicSQL, Args: []any{a.scope, a.key, result, code, message}}, &expiresAt); err != nil {
		return time.Time{}, err
	}
	a.store.tel.log.DebugContext(ctx, "idempotency: atomic key applied", "scope", a.scope, "key", a.key, "failed", f != nil)
	return expiresAt, nil
}

func (a *attempt[T]) end() {
	if !a.ended {
		a.ended = true
		_ = driver.Abort(context.Background(), a.tx, nil)
	}
}

// pgxOpener opens atomic claims on db: on a pool or a connection with the
// claim in BEGIN's message (see beginClaim), in a transaction a savepoint.
func pgxOpener(db DB) (opener[pgx.Tx], error) {
	h, err := driver.Pgx(db)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, c *claimArgs) (driver.Tx[pgx.Tx], error) {
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
	}, nil
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
func claimAtomic[T any](ctx context.Context, s *Store, tx driver.Tx[T], req Request, c *claimArgs) (*Outcome, error) {
	var (
		outcome               string
		status, code, message *string
		result                []byte
		expiresAt             *time.Time
		retryAfter            *int64
	)
	err := tx.Query(ctx, []any{&outcome, &status, &result, &code, &message, &expiresAt, &retryAfter},
		driver.Traced(ctx, driver.Stmt{SQL: claimAtomicSQL, Args: []any{c.scope, c.key, c.fingerprint, c.wait.Microseconds(), c.retention.Microseconds()}})...)
	if err != nil {
		return nil, classify(tx.Classify(err), false)
	}
	switch outcome {
	case "new":
		return &Outcome{}, nil
	case "replayed":
		return replayed(*status, result, code, message, expiresAt), nil
	case "mismatch":
		return nil, ErrMismatch
	default:
		return nil, s.inProgress(req.Scope, req.Key, retryAfter)
	}
}

func (s *Store) inProgress(scope, key string, retryAfter *int64) error {
	d := s.retryAfter
	if retryAfter != nil {
		d = fromMicros(retryAfter)
	}
	return &InProgressError{Scope: scope, Key: key, RetryAfter: d}
}

func replayed(status string, result []byte, code, message *string, expiresAt *time.Time) *Outcome {
	out := &Outcome{Replayed: true}
	if expiresAt != nil {
		out.ExpiresAt = *expiresAt
	}
	if status == "failed" {
		out.Failure = &Failure{Data: result}
		if code != nil {
			out.Failure.Code = *code
		}
		if message != nil {
			out.Failure.Message = *message
		}
		return out
	}
	if result == nil {
		result = []byte{}
	}
	out.Result = result
	return out
}
