package pgfence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// Sentinels of this package. Match them with [errors.Is].
var (
	// ErrStaleToken: a write presented a token older than one already accepted
	// for its resource (SQLSTATE PF001). The write did not happen. Errors that
	// match it are *[StaleTokenError] values.
	ErrStaleToken = errors.New("pgfence: stale token")
	// ErrLeaseNotHeld: a lease-checked write's lease is expired, released or
	// taken over (SQLSTATE PF002). The write did not happen. Errors that match it
	// are *[LeaseNotHeldError] values.
	ErrLeaseNotHeld = errors.New("pgfence: lease not held")
	// ErrUnfencedWrite: a protected table was written in a transaction that did
	// not present an accepted token for the row's resource (SQLSTATE PF006).
	ErrUnfencedWrite = errors.New("pgfence: unfenced write to a protected table")
	// ErrFloorLowered: [RaiseTokenFloor] was asked to lower the token floor
	// (SQLSTATE PF009). Nothing changed.
	ErrFloorLowered = errors.New("pgfence: the token floor may only be raised")
	// ErrTokenNotIssued: a fenced write presented a token that the lease
	// named by its resource has not issued (SQLSTATE PF012): a token of
	// another key's lease, or of a grant that has not committed, rolled back
	// or was lost in a failover. The write did not happen. Errors that match
	// it are *[TokenNotIssuedError] values.
	ErrTokenNotIssued = errors.New("pgfence: token not issued for this resource")
	// ErrNotFound: the row or resource does not exist.
	ErrNotFound = errors.New("pgfence: not found")
)

// Shared sentinels, the same values as in every pgfence package.
var (
	// ErrOutcomeUnknown: the connection broke after COMMIT was sent; the write may
	// or may not have committed. Errors that match it from [Write] and [Exec] are
	// *[OutcomeUnknownError] values: resolve them with [Resolve].
	ErrOutcomeUnknown = pgerr.ErrOutcomeUnknown
	// ErrUnavailable: the database could not be reached; nothing was done.
	ErrUnavailable = pgerr.ErrUnavailable
	// ErrNotPrimary: the server is a standby (in recovery); nothing was written.
	ErrNotPrimary = pgerr.ErrNotPrimary
	// ErrIsolation: the transaction is REPEATABLE READ or SERIALIZABLE and a
	// concurrent writer changed the fence row; fenced writes need READ COMMITTED.
	ErrIsolation = pgerr.ErrIsolation
	// ErrLockTimeout: lock_timeout expired waiting for the fence or lease row.
	ErrLockTimeout = pgerr.ErrLockTimeout
	// ErrStatementTimeout: statement_timeout expired.
	ErrStatementTimeout = pgerr.ErrStatementTimeout
	// ErrIdleInTransactionTimeout: the server ended the session after it idled
	// in a transaction for longer than idle_in_transaction_session_timeout.
	ErrIdleInTransactionTimeout = pgerr.ErrIdleInTransactionTimeout
	// ErrInvalid: an argument was rejected (SQLSTATE PF008 or a Go-side check).
	ErrInvalid = pgerr.ErrInvalid
	// ErrAbandoned: the write arrived after [Resolve] had given it up (SQLSTATE
	// PF013): the server refused it, so Resolve's NotApplied stays true.
	ErrAbandoned = pgerr.ErrAbandoned
	// ErrNotGranted: the database role may not use this resource or lease
	// key: no prefix of it is granted to the role (SQLSTATE PF014; an
	// operator grants prefixes with pgfence.grant_prefix). Nothing was done.
	ErrNotGranted = pgerr.ErrNotGranted
)

// StaleTokenError is the rejection of a write whose token is older than the
// accepted one. errors.Is(err, [ErrStaleToken]) is true.
type StaleTokenError struct {
	// Resource is the fenced resource (for [UpdateRow]: the table and key).
	Resource string
	// Presented is the writer's token.
	Presented int64
	// Accepted is the newer token already accepted (0 if unknown). For a
	// token retired by a floor it is the token floor, or, for a superseded
	// token at or below the retention floor, the newest token the lease has
	// issued since (which may not have written yet).
	Accepted int64

	err error  // the database error, if any
	msg string // the database's message, which names the case exactly
}

func (e *StaleTokenError) Error() string {
	if e.msg != "" {
		return e.msg
	}
	return fmt.Sprintf("pgfence: stale token %d for resource %q: token %d was accepted", e.Presented, e.Resource, e.Accepted)
}

// Is reports whether target is [ErrStaleToken].
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// Unwrap returns the underlying database error (the driver's: a
// *pgconn.PgError, lib/pq's *pq.Error), if any.
func (e *StaleTokenError) Unwrap() error { return e.err }

// TokenNotIssuedError is the rejection of a fenced write whose token the
// resource's lease has not issued. errors.Is(err, [ErrTokenNotIssued]) is
// true.
type TokenNotIssuedError struct {
	// Resource is the fenced resource, and the key of the lease that must
	// have issued the token.
	Resource string
	// Presented is the writer's token.
	Presented int64
	// Issued is the newest token the lease has issued (0: the key was never
	// granted).
	Issued int64

	err error
}

func (e *TokenNotIssuedError) Error() string {
	if e.Issued == 0 {
		return fmt.Sprintf("pgfence: token %d was not issued for resource %q: no lease of that key was ever granted (fence a resource with a token of the lease whose key is the resource)", e.Presented, e.Resource)
	}
	return fmt.Sprintf("pgfence: token %d was not issued for resource %q: its lease has issued tokens up to %d", e.Presented, e.Resource, e.Issued)
}

// Is reports whether target is [ErrTokenNotIssued].
func (e *TokenNotIssuedError) Is(target error) bool { return target == ErrTokenNotIssued }

// Unwrap returns the underlying database error.
func (e *TokenNotIssuedError) Unwrap() error { return e.err }

// LeaseNotHeldError is the rejection of a lease-checked write.
// errors.Is(err, [ErrLeaseNotHeld]) is true.
type LeaseNotHeldError struct {
	// Key is the lease key.
	Key string
	// Reason is "missing", "taken_over", "released" or "expired".
	Reason string
	// Current is the lease's current token when Reason is "taken_over".
	Current int64

	err error
}

func (e *LeaseNotHeldError) Error() string {
	if e.Reason == "taken_over" {
		return fmt.Sprintf("pgfence: lease %q not held: taken over (token %d)", e.Key, e.Current)
	}
	return fmt.Sprintf("pgfence: lease %q not held: %s", e.Key, e.Reason)
}

// Is reports whether target is [ErrLeaseNotHeld].
func (e *LeaseNotHeldError) Is(target error) bool { return target == ErrLeaseNotHeld }

// Unwrap returns the underlying database error.
func (e *LeaseNotHeldError) Unwrap() error { return e.err }

// OutcomeUnknownError reports a fenced write whose COMMIT was sent but whose
// answer was lost. errors.Is(err, [ErrOutcomeUnknown]) is true. Pass it to
// [Resolve] to learn whether the write committed.
type OutcomeUnknownError struct {
	// Resource and Token are the fenced write's.
	Resource string
	Token    int64
	// Op is the write's operation id, recorded with its token.
	Op OpID

	err error
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("pgfence: outcome of write %s (resource %q, token %d) unknown: %v", e.Op, e.Resource, e.Token, e.err)
}

// Unwrap returns the classified error chain (it contains [ErrOutcomeUnknown]).
func (e *OutcomeUnknownError) Unwrap() error { return e.err }

// MapError converts an error from a statement the caller ran itself (for
// example a plain UPDATE of a protected table, or SELECT pgfence.fence(...)) into
// this package's errors: PF001 becomes a *[StaleTokenError], PF002 a
// *[LeaseNotHeldError], PF012 a *[TokenNotIssuedError], PF006
// [ErrUnfencedWrite], PF009 [ErrFloorLowered], PF013 [ErrAbandoned], and
// the rest is classified like the helpers' own errors, with the original
// error kept in the chain; nil stays nil. It does not guess: a connection
// lost before the statement was sent is [ErrUnavailable], one lost after it
// may have been sent is [ErrOutcomeUnknown] (a statement on a pool may have
// committed: re-read before retrying; inside your own transaction the
// transaction is gone and nothing of it committed). An error that is already
// one of this package's (a helper's error) is returned unchanged.
func MapError(err error) error { return mapError(err, true) }

// ownCommit reports whether a statement sent on db commits on its own (db is
// a pool or a connection, not the caller's transaction): a connection lost
// after sending it leaves its outcome unknown. Inside the caller's
// transaction, a lost connection aborts the transaction.
func ownCommit(db DB) bool {
	_, inTx := db.(pgx.Tx)
	return !inTx
}

// mapError turns a database error into this package's errors: pgfence
// SQLSTATEs become typed errors; the rest is classified by internal/pgerr.
// sent reports whether a COMMIT (or an implicit one) may have reached the server.
func mapError(err error, sent bool) error {
	if err == nil || mapped(err) {
		return err
	}
	if se, ok := pgerr.Server(err); ok {
		switch se.Code {
		case pgerr.CodeStaleToken:
			d := details(se.Detail)
			e := &StaleTokenError{Resource: d["resource"], err: err, msg: se.Message}
			e.Accepted, _ = strconv.ParseInt(d["accepted"], 10, 64)
			e.Presented, _ = strconv.ParseInt(d["presented"], 10, 64)
			return e
		case pgerr.CodeLeaseNotHeld:
			d := details(se.Detail)
			e := &LeaseNotHeldError{Key: d["key"], Reason: d["reason"], err: err}
			e.Current, _ = strconv.ParseInt(d["token"], 10, 64)
			return e
		case pgerr.CodeTokenNotIssued:
			d := details(se.Detail)
			e := &TokenNotIssuedError{Resource: d["resource"], err: err}
			e.Issued, _ = strconv.ParseInt(d["issued"], 10, 64)
			e.Presented, _ = strconv.ParseInt(d["presented"], 10, 64)
			return e
		case pgerr.CodeUnfencedWrite:
			return fmt.Errorf("%w: %w", ErrUnfencedWrite, err)
		case pgerr.CodeFloorNotRaised:
			return fmt.Errorf("%w: %w", ErrFloorLowered, err)
		}
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return err // the server answered ROLLBACK: nothing committed
	}
	// pgx prepares a batch's statements new to the connection in a round trip
	// of their own, and encodes the arguments, before it sends the batch's
	// Sync (requests left without it are aborted when pgx closes the
	// connection): a failure reported as preprocessing committed nothing.
	var pre pgx.ErrPreprocessingBatch
	if errors.As(err, &pre) {
		sent = false
		err = pre.Unwrap() // the cause; pgx's wrapper only says when it failed
	}
	return pgerr.Classify(err, sent)
}

// mapFnError maps the error fn returned. Errors of fn's own statements are
// mapped like the helper's (a pgfence SQLSTATE to its sentinel, a lost
// connection to [ErrUnavailable]); any other error, such as a failed HTTP
// call, is fn's and is returned unchanged, even when it is a network error.
func mapFnError[T any](tx txn[T], err error) error {
	if pgerr.Code(err) != "" || tx.connLost(err) {
		return mapError(err, false)
	}
	return err
}

// mapped reports whether err is already one of this package's errors (a
// helper's, or MapError's): mapping it again must not change it.
func mapped(err error) bool {
	var (
		stale     *StaleTokenError
		lost      *LeaseNotHeldError
		notIssued *TokenNotIssuedError
	)
	return errors.As(err, &stale) || errors.As(err, &lost) || errors.As(err, &notIssued) || errors.Is(err, ErrUnfencedWrite) ||
		errors.Is(err, ErrFloorLowered) || pgerr.Classified(err)
}

// details parses the DETAIL of pgfence's own errors: space-separated
// name=value pairs; a "resource=" or "key=" pair runs to the end of the text
// (resources may contain spaces).
func details(detail string) map[string]string {
	out := map[string]string{}
	for detail != "" {
		name, rest, ok := strings.Cut(detail, "=")
		if !ok {
			break
		}
		if name == "resource" || name == "key" {
			out[name] = rest
			break
		}
		value, next, _ := strings.Cut(rest, " ")
		out[name] = value
		detail = next
	}
	return out
}

// checkDB refuses a nil db (or a nil pointer in it) with ErrInvalid instead
// of a nil dereference somewhere inside.
func checkDB(db DB) error { return pgerr.NilHandle(db) }

// endOnPanic is deferred by a helper right after it begins tx, with returned
// set once the caller's fn has returned. If fn panics (returned is still
// false, and no error was returned), it rolls tx back while the panic goes
// on, so the connection does not stay in an open transaction that holds the
// fence row's (or the lease row's) lock, and the helper's telemetry records a
// failure. It does not recover: the panic keeps its stack.
func endOnPanic[T any](ctx context.Context, tx txn[T], returned *bool, err *error) {
	if *returned || *err != nil {
		return
	}
	*err = errors.Join(errFnPanicked, rollback(ctx, tx, nil))
}

// errFnPanicked is the error the telemetry of a helper records when the
// caller's fn panicked; the panic itself goes on to the caller.
var errFnPanicked = errors.New("pgfence: fn panicked")

// fnEndedTx is the error of a helper whose fn committed or rolled back the
// transaction itself (tx.Commit then reports pgx.ErrTxClosed): the helper
// cannot tell which, so on its own transaction the outcome is unknown.
func fnEndedTx(own bool) error {
	const msg = "fn committed or rolled back the transaction itself; it must leave that to the helper"
	if own {
		return fmt.Errorf("%w: %w: %s", ErrOutcomeUnknown, ErrInvalid, msg)
	}
	return fmt.Errorf("%w: %s", ErrInvalid, msg)
}

// rollbackTimeout bounds a ROLLBACK after a failure, whose context may have
// ended.
const rollbackTimeout = 5 * time.Second

// rollback ends tx after a failure. A rollback error (other than the
// transaction having ended already) is joined to cause; the rollback gets its
// own short deadline so a cancelled ctx still releases the connection's
// locks.
func rollback[T any](ctx context.Context, tx txn[T], cause error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if err := tx.rollback(rctx); err != nil {
		return errors.Join(cause, fmt.Errorf("pgfence: rollback: %w", err))
	}
	return cause
}
