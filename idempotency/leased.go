package idempotency

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/internal/pgerr"
)

const (
	claimSQL = `SELECT outcome, coalesce(owner::text, ''), epoch, recovery_point, recovery_data,
       coalesce(status, ''), result, coalesce(failure_code, ''), coalesce(failure_message, ''), expires_at
  FROM pgfence.idempotency_claim($1, $2, $3, $4 * interval '1 microsecond', $5 * interval '1 microsecond',
                                 $6 * interval '1 microsecond')`

	// retryAfterSQL reads the rest of the lease after a PF007 refusal.
	retryAfterSQL = `SELECT (extract(epoch FROM greatest(lease_expires_at - pg_catalog.clock_timestamp(), interval '0')) * 1e6)::bigint
  FROM pgfence.idempotency_keys WHERE scope = $1 AND key = $2 AND status = 'in_progress'`

	heartbeatSQL = `SELECT pgfence.idempotency_heartbeat($1, $2, $3::uuid, $4 * interval '1 microsecond')`
	advanceSQL   = `SELECT pgfence.idempotency_advance($1, $2, $3::uuid, $4, $5, $6 * interval '1 microsecond')`
	completeSQL  = `SELECT pgfence.idempotency_complete($1, $2, $3::uuid, $4, $5, $6)`
	releaseSQL   = `SELECT pgfence.idempotency_release($1, $2, $3::uuid)`
)

// Claim claims req's key for leased work: an intent whose effect is outside
// the database (a payment provider, an e-mail, a device command), so it cannot
// commit together with the claim.
//
//   - Not replayed: [Outcome.Attempt] owns the key until its lease ends. It
//     may be a takeover of an attempt whose lease expired (or that released
//     the key); then [Attempt.RecoveryPoint] says where that attempt got to.
//   - [Outcome.Replayed]: the stored result or failure.
//   - An [*InProgressError] (errors.Is [ErrInProgress]): another attempt's
//     lease is live.
//   - [ErrMismatch]: the key was used with another payload.
//
// The claim is one statement; db should not be a transaction (the claim must
// be visible before the external call is made). When db's sessions default
// to another isolation level than READ COMMITTED, the claim runs in a READ
// COMMITTED transaction of its own.
func (s *Store) Claim(ctx context.Context, db DB, req Request) (o *Outcome, err error) {
	ctx, done := s.tel.start(ctx, modeLeased, req)
	defer func() { done(o, err) }()
	c, err := s.check(req)
	if err != nil {
		return nil, err
	}
	if err := driver.NilHandle(db); err != nil {
		return nil, err
	}
	return c.claim(ctx, db)
}

// claim claims c's key for leased work: a new key, a key free again, or a
// takeover of an expired or released lease.
func (c *claimArgs) claim(ctx context.Context, db DB) (*Outcome, error) {
	var (
		outcome, owner, recoveryPoint, status, code, message string
		epoch                                                int64
		recoveryData, result                                 []byte
		expiresAt                                            *time.Time
	)
	conn, release, err := acquire(ctx, db) // db stays the attempt's
	if err != nil {
		return nil, err
	}
	defer release()
	s, start := c.store, time.Now()
	claim := func(db DB) error {
		return driver.QueryRow(ctx, db, driver.Traced(ctx, driver.Stmt{SQL: claimSQL,
			Args: []any{c.scope, c.key, c.fingerprint, s.lease.Microseconds(), c.retention.Microseconds(), c.wait.Microseconds()}}),
			&outcome, &owner, &epoch, &recoveryPoint, &recoveryData, &status, &result, &code, &message, &expiresAt)
	}
	err = claim(conn)
	if _, inTx := db.(pgx.Tx); !inTx && pgerr.Code(err) == pgerr.CodeIsolation {
		// The session's default isolation is not READ COMMITTED, and the
		// caller has no transaction of its own (PF010 is raised before
		// anything is written): claim in a READ COMMITTED transaction.
		err = inReadCommitted(ctx, conn, claim)
	}
	switch err = classify(err, true); {
	case errors.Is(err, ErrInProgress):
		// The hint is best effort. A lease that is over while the row is
		// locked (its owner completing in a transaction, or another claim
		// taking it over) gives none: the default applies.
		var us *int64
		_ = conn.QueryRow(ctx, retryAfterSQL, c.scope, c.key).Scan(&us) // us stays nil when it fails
		return nil, c.inProgress(us)
	case err != nil:
		return nil, err
	case outcome == "replayed":
		return replayed(status, result, code, message, expiresAt), nil
	}
	a := &Attempt{store: s, db: db, scope: c.scope, key: c.key, owner: owner, epoch: epoch, turn: make(chan struct{}, 1),
		recoveryPoint: recoveryPoint, recoveryData: recoveryData, trustedUntil: start.Add(s.lease)}
	s.tel.log.DebugContext(ctx, "idempotency: leased key claimed", "scope", c.scope, "key", c.key,
		"epoch", epoch, "recovery_point", recoveryPoint)
	return &Outcome{Attempt: a}, nil
}

// inReadCommitted runs fn in a READ COMMITTED transaction on db and commits.
func inReadCommitted(ctx context.Context, db DB, fn func(DB) error) error {
	h, err := driver.Pgx(db)
	if err != nil {
		return err
	}
	tx, err := h.Begin(ctx, true)
	if err != nil {
		return err
	}
	if err := fn(tx.Handle()); err != nil {
		return driver.Abort(ctx, tx, err)
	}
	return tx.Commit(ctx, nil)
}

// Attempt is one claim's ownership of a key, the [Outcome.Attempt] of a
// claim that was not replayed; end it with exactly one of Complete, Fail or
// Release.
//
// An atomic attempt ([Store.Begin]) holds the key through an open READ
// COMMITTED transaction, [Attempt.Tx]: the writes made through it commit
// together with the stored answer, or not at all. It holds a database
// connection until it ends and, like a [pgx.Tx], is not safe for
// concurrent use. It has no lease: Heartbeat, Advance, AdvanceTx and
// CompleteTx refuse it with [ErrInvalid].
//
// A leased attempt ([Store.Claim]) holds the key through a lease that its
// calls extend. Its methods are accepted only while it is the key's current
// owner; afterwards they return [ErrLeaseLost]. It is safe for concurrent
// use (a heartbeat goroutine next to the work); claimed on one connection
// (*pgx.Conn) rather than a pool, its statements take turns on it.
type Attempt struct {
	store      *Store
	scope, key string
	atomic     *attempt[pgx.Tx] // the open transaction of an atomic attempt; nil for a leased one
	db         DB
	owner      string
	epoch      int64
	turn       chan struct{} // held while a statement runs on a db that is not a pool

	mu            sync.Mutex
	recoveryPoint string
	recoveryData  []byte
	trustedUntil  time.Time
}

// Scope returns the key's scope.
func (a *Attempt) Scope() string { return a.scope }

// Key returns the key.
func (a *Attempt) Key() string { return a.key }

// Tx is the transaction that holds an atomic attempt's claim (nil for a
// leased one): do the intent's writes through it. Do not commit or roll it
// back yourself: a COMMIT without the stored answer is refused by the
// database (the claim must be completed in its transaction), and either
// leaves the attempt unable to complete. A [pgx.Tx.Begin] on it is a
// savepoint, as usual. Once the attempt has ended (Complete, Fail,
// Release), every call on it answers [pgx.ErrTxClosed] and sends nothing.
func (a *Attempt) Tx() pgx.Tx {
	if a.atomic == nil {
		return nil
	}
	return a.atomic.tx.Handle()
}

// Epoch returns a leased key's ownership counter: 1 for the first claim, one more
// for every later one, a takeover or a new intent on the key after its
// retention ended. A downstream system that accepts a fencing token can be
// given it. Above 1, the key had an owner before this claim: an earlier
// attempt whose lease expired or that released the key (then
// [Attempt.RecoveryPoint] says where it got to), or an earlier intent whose
// retention ended (then there is no recovery point).
func (a *Attempt) Epoch() int64 { return a.epoch }

// RecoveryPoint returns the last recovery point recorded for the key, by this
// attempt or a previous owner ("" if none): where the work resumes.
func (a *Attempt) RecoveryPoint() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.recoveryPoint
}

// RecoveryData returns the data stored with [Attempt.RecoveryPoint].
func (a *Attempt) RecoveryData() []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.recoveryData
}

// TrustedUntil is the local (monotonic) time until which this attempt may
// assume it still owns the key: the send time of the last claim, heartbeat or
// recovery point plus the lease. The database decides expiry; this is the
// conservative client-side bound to stop starting new external calls.
func (a *Attempt) TrustedUntil() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.trustedUntil
}

// DerivedKey returns the idempotency key to hand to a downstream system for
// one step of this intent. It is the same for every attempt and takeover, so
// the downstream system deduplicates a step that a crashed owner already
// sent, and it differs for every other scope, key or step: the downstream
// system sees only this string, and the same key in two scopes (two
// principals of the HTTP middleware, say) is two intents. It is a UUID
// (RFC 9562 version 8) made of the SHA-256 of scope, key and step, so it
// fits the limits of common providers and does not disclose the scope.
func (a *Attempt) DerivedKey(step string) string {
	h := sha256.New()
	fmt.Fprintf(h, "pgfence.idempotency.derived_key\x00%d:%s%d:%s%d:%s", len(a.scope), a.scope, len(a.key), a.key, len(step), step)
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // variant 10
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Heartbeat extends the lease to now + [Config.Lease] (database clock).
func (a *Attempt) Heartbeat(ctx context.Context) error {
	return a.call(ctx, "heartbeat", a.db, heartbeatSQL, []any{a.store.lease.Microseconds()}, new(time.Time))
}

// Advance records that the work reached point (at most 256 bytes of UTF-8
// without NUL) with optional data (at most 1 MiB; for example the id a
// payment provider returned) and extends the lease. An attempt that takes
// the key over after a crash resumes from the last point.
//
// Advance commits on its own. When the phase that reached point also wrote
// to the database, use [Attempt.AdvanceTx] in that transaction instead: a
// crash between two commits would otherwise leave the writes without the
// recovery point (and the next owner would do the phase again) or the point
// without the writes.
func (a *Attempt) Advance(ctx context.Context, point string, data []byte) error {
	return a.AdvanceTx(ctx, a.db, point, data)
}

// AdvanceTx is [Attempt.Advance] through db, normally the transaction that
// also holds the phase's business writes: the recovery point, the lease
// extension and those writes commit together or not at all. Only the
// current owner can advance: if the lease expired and another attempt took
// the key over, AdvanceTx returns [ErrLeaseLost] and db's transaction is
// aborted, so the phase's writes cannot commit either. The row lock taken by
// AdvanceTx holds any takeover back until db's transaction ends.
//
// [Attempt.RecoveryPoint] reports point at once. In a transaction,
// [Attempt.TrustedUntil] is not extended: the attempt cannot tell whether
// db's transaction commits. Call [Attempt.Heartbeat] after the commit when
// the next phase needs the longer window.
func (a *Attempt) AdvanceTx(ctx context.Context, db DB, point string, data []byte) error {
	if err := errors.Join(checkText("recovery point", point, 0, maxRecoveryPointBytes), checkSize("recovery data", data, maxRecoveryDataBytes)); err != nil {
		return err
	}
	if err := a.call(ctx, "advance", db, advanceSQL, []any{point, data, a.store.lease.Microseconds()}, new(time.Time)); err != nil {
		return err
	}
	a.mu.Lock()
	a.recoveryPoint, a.recoveryData = point, data
	a.mu.Unlock()
	return nil
}

// Complete stores result (at most [MaxResultBytes]; nil is stored as
// empty) as the key's answer and ends the claim. It returns when the stored
// result expires.
//
// An atomic attempt commits the result together with the writes made
// through Tx. A broken connection while the COMMIT was on its way returns
// [ErrOutcomeUnknown]: claim the same request again to learn whether it
// committed. Any other error means nothing was stored and the key is free;
// the attempt has ended.
//
// A leased attempt that was replaced as owner gets [ErrLeaseLost] and
// stores nothing.
//
// A result over the limit is refused with [ErrInvalid] before anything is
// sent, and the attempt stays open (an atomic one with its writes): complete
// it with a result that fits, Fail or Release.
func (a *Attempt) Complete(ctx context.Context, result []byte) (time.Time, error) {
	if a.atomic == nil {
		return a.CompleteTx(ctx, a.db, result)
	}
	return a.atomic.settle(ctx, nonNil(result), nil)
}

// CompleteTx is [Attempt.Complete] through db, for example the transaction
// that also records the effect in business tables: the result is stored only
// if that transaction commits.
func (a *Attempt) CompleteTx(ctx context.Context, db DB, result []byte) (expires time.Time, err error) {
	if err := checkSize("result", result, MaxResultBytes); err != nil {
		return time.Time{}, err
	}
	return expires, a.call(ctx, "complete", db, completeSQL, []any{nonNil(result), nil, nil}, &expires)
}

// Fail stores a permanent failure as the key's answer, replayed to every
// duplicate, and ends the claim; an atomic attempt commits it together with
// the writes made through Tx (unlike a [*Failure] returned from the work of
// [Store.Do], which rolls them back). Transient errors are not failures: Release
// the key instead. Errors as for [Attempt.Complete]: a nil or invalid f is
// refused with [ErrInvalid] and the attempt stays open.
func (a *Attempt) Fail(ctx context.Context, f *Failure) (expires time.Time, err error) {
	if err := f.check(); err != nil {
		return time.Time{}, err
	}
	if a.atomic != nil {
		return a.atomic.settle(ctx, nil, f)
	}
	return expires, a.call(ctx, "fail", a.db, completeSQL, []any{f.Data, f.Code, f.Message}, &expires)
}

// Release gives the key up after a transient error without storing a
// result. An atomic attempt rolls back the writes made through Tx and
// returns the error of the ROLLBACK, if any (the connection is then closed,
// which rolls back too); on an atomic attempt that has ended it does nothing
// and returns nil, so a deferred Release is harmless. A leased attempt keeps
// its recovery point, and the next claim takes the key over at once and
// resumes from it.
func (a *Attempt) Release(ctx context.Context) error {
	if a.atomic != nil {
		a.atomic.ended = true
		return a.atomic.tx.Rollback(ctx) // nil once the transaction has ended
	}
	return a.call(ctx, "release", a.db, releaseSQL, nil, new(any))
}

// call runs op, one statement of a leased attempt, on db with the key, the
// owner and args, and scans its row into dest. A heartbeat or recovery
// point that commits on its own extends the trust window.
func (a *Attempt) call(ctx context.Context, op string, db DB, sql string, args []any, dest ...any) (err error) {
	ctx, done := a.store.tel.owned(ctx, op, a)
	defer func() { done(err) }()
	start := time.Now()
	conn, release, err := a.use(ctx, db)
	if err == nil {
		defer release()
		err = classify(conn.QueryRow(ctx, sql, append([]any{a.scope, a.key, a.owner}, args...)...).Scan(dest...), true)
	}
	if err != nil {
		return fmt.Errorf("idempotency: %s %s/%s (epoch %d): %w", op, a.scope, a.key, a.epoch, err)
	}
	if _, inTx := db.(pgx.Tx); !inTx && (op == "heartbeat" || op == "advance") {
		a.mu.Lock()
		if t := start.Add(a.store.lease); t.After(a.trustedUntil) {
			a.trustedUntil = t
		}
		a.mu.Unlock()
	}
	return nil
}

// use returns what one of the attempt's statements runs on: for a pool one
// of its connections (see acquire); for one connection, or a transaction,
// db itself once the attempt's other statements on it are done, as pgx's
// connections are not safe for concurrent use. Its error is classified:
// nothing was sent.
func (a *Attempt) use(ctx context.Context, db DB) (DB, func(), error) {
	if a.atomic != nil {
		return nil, nil, fmt.Errorf("%w: an atomic attempt has no lease and no recovery points: its transaction holds the key until Complete, Fail or Release", ErrInvalid)
	}
	if err := driver.NilHandle(db); err != nil {
		return nil, nil, err
	}
	if _, pool := db.(*pgxpool.Pool); pool {
		return acquire(ctx, db)
	}
	select {
	case a.turn <- struct{}{}:
		return db, func() { <-a.turn }, nil
	case <-ctx.Done():
		return nil, nil, context.Cause(ctx)
	}
}
