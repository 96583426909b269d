package pgfence

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// The failures of every pgfence package, one error value each: whichever
// package returns one, errors.Is matches it with these names. The table in
// the package README lists them with their SQLSTATEs.
var (
	// ErrStaleToken: a write presented a token older than one already
	// accepted for its resource (PF001). Nothing was written. Errors of
	// [Write] and [Exec] that match it are *[StaleTokenError] values.
	ErrStaleToken = pgerr.ErrStaleToken
	// ErrLeaseLost: the lease is no longer held by the grant that asked:
	// it expired, was released, taken over or force-released (PF002), or the
	// client found so (its trust window ran out, its renewals failed).
	// Errors of lease-checked writes that match it are *[LeaseLostError]
	// values.
	ErrLeaseLost = pgerr.ErrLeaseLost
	// ErrLeaseHeld: another holder has the lease (PF003); package leases
	// returns a *leases.HeldError with the holder's remaining time.
	ErrLeaseHeld = pgerr.ErrLeaseHeld
	// ErrNotPrimary: the server is a standby (PF005, 25006); nothing was
	// done.
	ErrNotPrimary = pgerr.ErrNotPrimary
	// ErrUnfencedWrite: a protected table was written in a transaction that
	// had no accepted token for the row's resource (PF006).
	ErrUnfencedWrite = pgerr.ErrUnfencedWrite
	// ErrInvalid: an argument was refused, by the client before anything
	// was sent or by the server (PF008); the error names it.
	ErrInvalid = pgerr.ErrInvalid
	// ErrFloorLowered: [RaiseTokenFloor] was asked to lower the token floor
	// (PF009). Nothing changed.
	ErrFloorLowered = pgerr.ErrFloorLowered
	// ErrIsolation: the transaction is REPEATABLE READ or SERIALIZABLE
	// (PF010, 40001); pgfence's claims and fences need READ COMMITTED.
	ErrIsolation = pgerr.ErrIsolation
	// ErrGrantsPaused: an operator paused new grants for a prefix of the key
	// (PF011); nothing was granted, current holders are not affected.
	ErrGrantsPaused = pgerr.ErrGrantsPaused
	// ErrTokenNotIssued: the lease named by the resource has not issued the
	// token (PF012): a token of another key, or of a grant that did not
	// commit, rolled back or was lost in a failover. Errors of [Write] and
	// [Exec] that match it are *[TokenNotIssuedError] values.
	ErrTokenNotIssued = pgerr.ErrTokenNotIssued
	// ErrAbandoned: the request arrived after its client had given it up
	// (PF013), so the client's "not applied" stays true.
	ErrAbandoned = pgerr.ErrAbandoned
	// ErrNotGranted: the database role may not use this lease key,
	// resource or idempotency scope (PF014): no prefix of it is granted to
	// the role (pgfence.grant_prefix). Nothing was done.
	ErrNotGranted = pgerr.ErrNotGranted
	// ErrBacklogFull: a task key has as many open tasks as its bound
	// (PF016, package leases/tasks); nothing was enqueued. Try again later.
	ErrBacklogFull = pgerr.ErrBacklogFull
	// ErrOutcomeUnknown: the connection failed after something that could
	// commit was sent; it may or may not have committed. Read back before
	// retrying: [Resolve] for [Write] and [Exec] (their errors are
	// *[OutcomeUnknownError] values), the same request again for an
	// idempotency key.
	ErrOutcomeUnknown = pgerr.ErrOutcomeUnknown
	// ErrUnavailable: the database could not be reached, or the connection
	// failed before anything that could commit was sent; nothing was done.
	ErrUnavailable = pgerr.ErrUnavailable
	// ErrLockTimeout: lock_timeout expired waiting for a row lock (55P03).
	ErrLockTimeout = pgerr.ErrLockTimeout
	// ErrStatementTimeout: statement_timeout expired, or the statement was
	// cancelled (57014).
	ErrStatementTimeout = pgerr.ErrStatementTimeout
	// ErrIdleInTransactionTimeout: the server ended the session after it
	// idled in a transaction for longer than
	// idle_in_transaction_session_timeout (25P03).
	ErrIdleInTransactionTimeout = pgerr.ErrIdleInTransactionTimeout
	// ErrNotFound: the lease, resource or key asked for does not exist.
	ErrNotFound = pgerr.ErrNotFound
)

// StaleTokenError is the rejection of a write whose token is older than the
// accepted one. errors.Is(err, [ErrStaleToken]) is true.
type StaleTokenError struct {
	// Resource is the fenced resource.
	Resource string
	// Presented is the writer's token.
	Presented int64
	// Accepted is the newer token already accepted (0 if unknown). For a
	// token retired by a floor it is the token floor, or, for a superseded
	// token at or below the retention floor, the newest token the lease has
	// issued since (which may not have written yet).
	Accepted int64

	err error  // the classified database error
	msg string // the database's message, which names the case exactly
}

func (e *StaleTokenError) Error() string { return e.msg }

// Unwrap returns the database error, which wraps [ErrStaleToken].
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

// Unwrap returns the database error, which wraps [ErrTokenNotIssued].
func (e *TokenNotIssuedError) Unwrap() error { return e.err }

// LeaseLostError is the rejection of a lease-checked write ([Checked]), or a
// renewal, by the database. errors.Is(err, [ErrLeaseLost]) is true.
type LeaseLostError struct {
	// Key is the lease key.
	Key string
	// Reason is "missing", "taken_over", "released" or "expired".
	Reason string
	// Current is the lease's current token when Reason is "taken_over".
	Current int64

	err error
}

func (e *LeaseLostError) Error() string {
	if e.Reason == "taken_over" {
		return fmt.Sprintf("pgfence: lease %q lost: taken over (token %d)", e.Key, e.Current)
	}
	return fmt.Sprintf("pgfence: lease %q lost: %s", e.Key, e.Reason)
}

// Unwrap returns the database error, which wraps [ErrLeaseLost].
func (e *LeaseLostError) Unwrap() error { return e.err }

// OutcomeUnknownError reports a fenced write whose COMMIT was sent but whose
// answer was lost. errors.Is(err, [ErrOutcomeUnknown]) is true. Pass it to
// [Resolve] to learn whether the write committed.
type OutcomeUnknownError struct {
	// Resource and Token are the fenced write's.
	Resource string
	Token    int64
	// Op is the write's operation id, recorded with its token (zero for a
	// lease-checked write, which records none: re-read what it wrote).
	Op OpID

	err error
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("pgfence: outcome of write %s (resource %q, token %d) unknown: %v", e.Op, e.Resource, e.Token, e.err)
}

// Unwrap returns the classified error chain (it contains [ErrOutcomeUnknown]).
func (e *OutcomeUnknownError) Unwrap() error { return e.err }

// MapError turns the error of a statement the caller ran itself (a plain
// UPDATE of a protected table, or SELECT pgfence.fence(...)) into pgfence's
// errors, keeping the original in the chain: each pgfence SQLSTATE becomes
// its sentinel (PF001 a *[StaleTokenError], PF002 a *[LeaseLostError], PF012
// a *[TokenNotIssuedError]), a connection failure [ErrOutcomeUnknown] (the
// statement may have committed: re-read before retrying; inside your own
// transaction nothing of it committed) unless nothing was sent
// ([ErrUnavailable]). nil stays nil; an error mapped already is returned
// unchanged.
func MapError(err error) error { return detail(pgerr.Classify(err, true)) }

// detail adds the details the server sent with PF001, PF002 and PF012 to a
// classified error.
func detail(err error) error {
	se, ok := pgerr.Server(err)
	if !ok {
		return err
	}
	var (
		stale     *StaleTokenError
		lost      *LeaseLostError
		notIssued *TokenNotIssuedError
	)
	if errors.As(err, &stale) || errors.As(err, &lost) || errors.As(err, &notIssued) {
		return err
	}
	d := details(se.Detail)
	n := func(name string) int64 { v, _ := strconv.ParseInt(d[name], 10, 64); return v }
	switch se.Code {
	case pgerr.CodeStaleToken:
		return &StaleTokenError{Resource: d["resource"], Presented: n("presented"), Accepted: n("accepted"), err: err, msg: se.Message}
	case pgerr.CodeLeaseNotHeld:
		return &LeaseLostError{Key: d["key"], Reason: d["reason"], Current: n("token"), err: err}
	case pgerr.CodeTokenNotIssued:
		return &TokenNotIssuedError{Resource: d["resource"], Presented: n("presented"), Issued: n("issued"), err: err}
	}
	return err
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
