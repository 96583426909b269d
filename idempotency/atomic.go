package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/tracesql"
)

// Func does the business work of an atomic intent inside tx, the transaction
// that holds the claim. It returns the result to store and replay (nil is
// stored as empty), a [*Failure] to store a permanent failure (its writes are
// rolled back), or any other error for a transient failure (nothing is stored,
// the key stays free). It must do all its writes through tx; it may run again
// after a rolled-back attempt, never after a committed one.
type Func func(ctx context.Context, tx pgx.Tx) ([]byte, error)

const (
	claimAtomicSQL = `SELECT outcome, status, result, failure_code, failure_message, expires_at,
       (extract(epoch FROM retry_after) * 1e6)::bigint
  FROM pgfence.idempotency_claim_atomic($1, $2, $3, $4 * interval '1 microsecond', $5 * interval '1 microsecond')`

	completeAtomicSQL = `SELECT pgfence.idempotency_complete_atomic($1, $2, $3, $4, $5)`
)

// Do applies an atomic intent once: the claim on req's key, fn's writes and
// fn's result commit in one READ COMMITTED transaction on db.
//
//   - New: fn ran and committed; Result (or Failure) is what it produced.
//   - Replayed: an earlier attempt committed; its stored answer is returned and
//     fn does not run. A duplicate that arrives while the first attempt's
//     transaction is open waits for it (at most [Config.WaitTimeout] and ctx),
//     then replays its result, or runs fn if the first attempt rolled back.
//   - InProgress (with an [*InProgressError]): the first attempt did not finish
//     within the wait.
//   - Mismatch (with [ErrMismatch]): the key was used with another payload.
//
// When db is a [pgx.Tx] the work runs under a savepoint of the caller's
// transaction, and only the caller's COMMIT makes it durable; the caller's
// transaction must be READ COMMITTED ([ErrIsolation] otherwise). With a pool or
// connection Do commits itself; a broken connection during that commit returns
// [ErrOutcomeUnknown]: call Do again with the same request to learn the answer.
//
// On a pool or a connection a new key costs BEGIN, the claim, fn's
// statements, and the result with COMMIT in one pipeline; a duplicate costs
// BEGIN, the claim and ROLLBACK. [Store.Begin] is the same claim for a
// caller that drives the work itself (a middleware, an interceptor).
func (s *Store) Do(ctx context.Context, db DB, req Request, fn Func) (o *Outcome, err error) {
	ctx, done := s.tel.start(ctx, modeAtomic, req)
	defer func() { done(o, err) }()
	fp, retention, err := s.check(req)
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: fn is nil", ErrInvalid)
	}
	out, err := s.runAtomic(ctx, db, req, fp, retention, fn)
	var failure *Failure
	if errors.As(err, &failure) {
		if err := failure.check(); err != nil {
			return nil, err
		}
		// fn's writes were rolled back; store the failure in a transaction of
		// its own, unless a concurrent attempt completed the key meanwhile.
		return s.runAtomic(ctx, db, req, fp, retention, func(context.Context, pgx.Tx) ([]byte, error) {
			return nil, &storeFailure{failure}
		})
	}
	return out, err
}

// storeFailure asks runAtomic to store a failure instead of a result.
type storeFailure struct{ *Failure }

func (s *Store) runAtomic(ctx context.Context, db DB, req Request, fp []byte, retention time.Duration, fn Func) (*Outcome, error) {
	out, err := s.beginAtomic(ctx, db, req, fp, retention)
	if err != nil || out.Status != New {
		return out, err
	}
	a := out.Atomic
	defer a.end() // rolls back unless committed

	result, err := fn(ctx, a.tx.Tx)
	var stored *storeFailure
	switch {
	case errors.As(err, &stored):
		expiresAt, err := a.settle(ctx, stored.Data, stored.Failure)
		if err != nil {
			return nil, err
		}
		return &Outcome{Status: New, Failure: stored.Failure, ExpiresAt: expiresAt}, nil
	case err != nil:
		return nil, err // transient, or a *Failure for Do to store
	}
	expiresAt, err := a.Complete(ctx, result)
	if err != nil {
		return nil, err
	}
	if result == nil {
		result = []byte{}
	}
	return &Outcome{Status: New, Result: result, ExpiresAt: expiresAt}, nil
}

// Begin claims req's key for atomic work that the caller drives itself: a
// READ COMMITTED transaction on db is opened, the key is claimed in it as
// [Store.Do] claims it, and the transaction stays open for the caller.
//
//   - New: [Outcome.Atomic] holds the claim. Do the work through its
//     [AtomicAttempt.Tx], then end it with [AtomicAttempt.Complete] or
//     [AtomicAttempt.Fail] (the answer is stored and commits together with
//     the work) or [AtomicAttempt.Rollback] (nothing happened, the key is
//     free). Until then the transaction holds a connection and the key: a
//     duplicate waits for it (see [Config.WaitTimeout]).
//   - Replayed, InProgress, Mismatch: as for Do; no transaction stays open.
//
// A new key costs BEGIN and the claim, a duplicate BEGIN, the claim and
// ROLLBACK. db may be a [pgx.Tx] (the work runs under a savepoint of it, as
// with Do).
func (s *Store) Begin(ctx context.Context, db DB, req Request) (o *Outcome, err error) {
	ctx, done := s.tel.start(ctx, modeAtomic, req)
	defer func() { done(o, err) }()
	fp, retention, err := s.check(req)
	if err != nil {
		return nil, err
	}
	return s.beginAtomic(ctx, db, req, fp, retention)
}

func (s *Store) beginAtomic(ctx context.Context, db DB, req Request, fp []byte, retention time.Duration) (*Outcome, error) {
	tx, err := beginAtomic(ctx, db)
	if err != nil {
		return nil, classify(err, false)
	}
	out, err := s.claimAtomic(ctx, tx, req, fp, retention)
	if err != nil || out.Status != New {
		tx.end()
		return out, err
	}
	out.Atomic = &AtomicAttempt{store: s, scope: req.Scope, key: req.Key, tx: tx}
	return out, nil
}

// AtomicAttempt is an atomic claim that [Store.Begin] left open: a READ
// COMMITTED transaction that holds the key. Everything written through
// [AtomicAttempt.Tx] commits together with the stored answer, or not at all.
// End it with exactly one of Complete, Fail or Rollback; until then it holds
// a database connection. Like a [pgx.Tx] it is not safe for concurrent use.
type AtomicAttempt struct {
	store      *Store
	scope, key string
	tx         *atomicTx
	ended      bool
}

// Scope returns the key's scope.
func (a *AtomicAttempt) Scope() string { return a.scope }

// Key returns the key.
func (a *AtomicAttempt) Key() string { return a.key }

// Tx is the transaction that holds the claim: do the intent's writes through
// it. Do not commit or roll it back yourself: a COMMIT without the stored
// answer is refused by the database (the claim must be completed in its
// transaction), and either leaves the attempt unable to complete. A
// [pgx.Tx.Begin] on it is a savepoint, as usual.
func (a *AtomicAttempt) Tx() pgx.Tx { return a.tx.Tx }

// Complete stores result (at most [MaxResultBytes]; nil is stored as empty)
// as the key's answer and commits it together with the writes made through
// Tx. It returns when the stored result expires. A broken connection while
// the COMMIT was on its way returns [ErrOutcomeUnknown]: claim the same
// request again to learn whether it committed. Any other error means nothing
// was stored and the key is free. The attempt has ended either way.
func (a *AtomicAttempt) Complete(ctx context.Context, result []byte) (time.Time, error) {
	if len(result) > MaxResultBytes {
		a.end()
		return time.Time{}, fmt.Errorf("%w: result must be at most %d bytes, got %d", ErrInvalid, MaxResultBytes, len(result))
	}
	if result == nil {
		result = []byte{}
	}
	return a.settle(ctx, result, nil)
}

// Fail stores f as the key's permanent answer, replayed to every duplicate,
// and commits it together with the writes made through Tx (unlike a
// [*Failure] returned from a [Func], which rolls them back). Errors as for
// [AtomicAttempt.Complete].
func (a *AtomicAttempt) Fail(ctx context.Context, f *Failure) (time.Time, error) {
	if f == nil {
		a.end()
		return time.Time{}, fmt.Errorf("%w: failure is nil", ErrInvalid)
	}
	if err := f.check(); err != nil {
		a.end()
		return time.Time{}, err
	}
	return a.settle(ctx, f.Data, f)
}

// Rollback abandons the attempt: the writes made through Tx are rolled back,
// nothing is stored and the key is free for the next claim. It returns the
// error of the ROLLBACK, if any (the connection is then closed, which rolls
// back too); on an attempt that has ended it does nothing and returns nil.
func (a *AtomicAttempt) Rollback(ctx context.Context) error {
	if a.ended {
		return nil
	}
	a.ended = true
	err := a.tx.Rollback(ctx)
	if a.tx.release != nil {
		a.tx.release()
	}
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}

func (a *AtomicAttempt) settle(ctx context.Context, result []byte, f *Failure) (time.Time, error) {
	if a.ended {
		return time.Time{}, fmt.Errorf("idempotency: atomic attempt on %s/%s: %w", a.scope, a.key, pgx.ErrTxClosed)
	}
	defer a.end()
	var code, message *string
	if f != nil {
		code, message = &f.Code, &f.Message
	}
	expiresAt, err := a.tx.completeAndCommit(ctx, a.scope, a.key, result, code, message)
	if err != nil {
		return time.Time{}, err
	}
	a.store.logger.DebugContext(ctx, "idempotency: atomic key applied", "scope", a.scope, "key", a.key, "failed", f != nil)
	return expiresAt, nil
}

func (a *AtomicAttempt) end() {
	if !a.ended {
		a.ended = true
		a.tx.end()
	}
}

// atomicTx is the transaction of one atomic attempt. On a pool or a
// connection it holds the connection itself, so that the stored result and
// the COMMIT travel in one pipeline (one round trip instead of two); in a
// caller's transaction it is a savepoint, released the ordinary way.
type atomicTx struct {
	pgx.Tx
	conn      *pgx.Conn // nil: commit through Tx
	release   func()    // returns a connection acquired from a pool
	committed bool
}

func beginAtomic(ctx context.Context, db DB) (*atomicTx, error) {
	opts := pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
	switch db := db.(type) {
	case *pgxpool.Pool:
		c, err := db.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		tx, err := c.Conn().BeginTx(ctx, opts)
		if err != nil {
			c.Release()
			return nil, err
		}
		return &atomicTx{Tx: tx, conn: c.Conn(), release: c.Release}, nil
	case *pgx.Conn:
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		return &atomicTx{Tx: tx, conn: db}, nil
	}
	tx, err := begin(ctx, db)
	if err != nil {
		return nil, err
	}
	return &atomicTx{Tx: tx}, nil
}

// completeAndCommit stores the attempt's result (or failure) and commits,
// returning when the stored result expires.
func (t *atomicTx) completeAndCommit(ctx context.Context, scope, key string, result []byte, code, message *string) (time.Time, error) {
	var expiresAt time.Time
	if t.conn == nil {
		if err := t.QueryRow(ctx, completeAtomicSQL, scope, key, result, code, message).Scan(&expiresAt); err != nil {
			return time.Time{}, classify(err, false)
		}
		if err := t.Commit(ctx); err != nil {
			return time.Time{}, classify(err, true)
		}
		t.committed = true
		return expiresAt, nil
	}
	// One pipeline: if the completion fails, the server skips the COMMIT and
	// the transaction is rolled back by end. Once the batch is sent, a lost
	// connection leaves the outcome unknown: the COMMIT may have run.
	b := &pgx.Batch{}
	b.Queue(completeAtomicSQL, scope, key, result, code, message)
	b.Queue("commit")
	br := t.conn.SendBatch(ctx, b)
	err := br.QueryRow().Scan(&expiresAt)
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return time.Time{}, classify(err, true)
	}
	if tag.String() != "COMMIT" {
		return time.Time{}, pgx.ErrTxCommitRollback // the server answered ROLLBACK: nothing committed
	}
	t.committed = true
	return expiresAt, nil
}

// end rolls back an attempt that did not commit and returns a pooled
// connection.
func (t *atomicTx) end() {
	if !t.committed {
		rollback(t.Tx)
	}
	if t.release != nil {
		t.release()
	}
}

// claimAtomic claims the key inside tx or reports what holds it.
func (s *Store) claimAtomic(ctx context.Context, tx pgx.Tx, req Request, fp []byte, retention time.Duration) (*Outcome, error) {
	var (
		outcome               string
		status, code, message *string
		result                []byte
		expiresAt             *time.Time
		retryAfter            *int64
	)
	err := tracesql.QueryRow(ctx, tx, claimAtomicSQL, req.Scope, req.Key, fp, micros(s.wait), micros(retention)).
		Scan(&outcome, &status, &result, &code, &message, &expiresAt, &retryAfter)
	if err != nil {
		return nil, classify(err, false)
	}
	switch outcome {
	case "new":
		return &Outcome{Status: New}, nil
	case "replayed":
		return replayed(*status, result, code, message, expiresAt), nil
	case "mismatch":
		return &Outcome{Status: Mismatch}, ErrMismatch
	default:
		return s.inProgress(req, retryAfter)
	}
}

func (s *Store) inProgress(req Request, retryAfter *int64) (*Outcome, error) {
	d := s.retryAfter
	if retryAfter != nil {
		d = fromMicros(retryAfter)
	}
	return &Outcome{Status: InProgress, RetryAfter: d}, &InProgressError{Scope: req.Scope, Key: req.Key, RetryAfter: d}
}

func replayed(status string, result []byte, code, message *string, expiresAt *time.Time) *Outcome {
	out := &Outcome{Status: Replayed}
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
