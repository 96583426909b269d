package leases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// Sentinels. Test with [errors.Is]; the errors returned carry details (key,
// holder, token, the database's message) around them.
var (
	// ErrLeaseHeld: another holder has a live lease on the key. A
	// [*HeldError] carries the time it has left.
	ErrLeaseHeld = errors.New("leases: lease held by another holder")
	// ErrLeaseLost: the lease ended without a Release by its holder: it expired,
	// was taken over or force-released, the local trust window ran out, or
	// keep-alive gave up. Work done under it is no longer protected.
	ErrLeaseLost = errors.New("leases: lease lost")
	// ErrReleased: the lease was released by its holder; it is the cause of the
	// lease's context after a [Lease.Release] that was confirmed.
	ErrReleased = errors.New("leases: lease released")
	// ErrMaxHold: keep-alive reached its maximum total hold time
	// ([KeepAliveOptions.MaxHold]) and stopped; the lease's context ends with it.
	ErrMaxHold = errors.New("leases: maximum hold time reached")
	// ErrClosed: the [Client] was closed.
	ErrClosed = errors.New("leases: client closed")

	// ErrOutcomeUnknown: the connection broke around a change (a grant,
	// renewal or release, or an operator's ForceRelease, PauseGrants or
	// ResumeGrants) and the client could not read back what happened; Get,
	// History and Pauses tell. Reads never return it. It is pgerr's shared
	// sentinel.
	ErrOutcomeUnknown = pgerr.ErrOutcomeUnknown
	// ErrUnavailable: the database could not be reached; nothing was done.
	ErrUnavailable = pgerr.ErrUnavailable
	// ErrInvalid: an argument or option was rejected; the message names it.
	ErrInvalid = pgerr.ErrInvalid
	// ErrNotPrimary: the server is a standby; leases are granted by a primary.
	ErrNotPrimary = pgerr.ErrNotPrimary
	// ErrGrantsPaused: an operator paused new grants for a prefix of the key
	// ([Client.PauseGrants], SQLSTATE PF011); nothing was granted. Current
	// holders keep renewing and releasing. [Client.TryAcquire] returns it at
	// once; [Client.Acquire] keeps waiting (as if the key were held) until the
	// pause is lifted or its deadline passes. It is pgerr's shared sentinel.
	ErrGrantsPaused = pgerr.ErrGrantsPaused
	// ErrAbandoned: a grant attempt arrived after its client had given it up
	// (its reply was lost and the attempt was settled as not granted,
	// SQLSTATE PF013); the server refused it. Only SQL clients that settle
	// their own attempts with pgfence.abandon_grant meet it.
	ErrAbandoned = pgerr.ErrAbandoned
	// ErrNotGranted: the database role may not use this key: no prefix of it
	// is granted to the role (SQLSTATE PF014; an operator grants prefixes
	// with pgfence.grant_prefix). Nothing was done.
	ErrNotGranted = pgerr.ErrNotGranted
)

// HeldError is returned by [Client.TryAcquire] (and, wrapped, by
// [Client.Acquire] when it gives up) when another holder has the lease.
// errors.Is(err, ErrLeaseHeld) is true.
type HeldError struct {
	// Key is the lease key.
	Key string
	// Remaining is the time the current holder has left by the database clock
	// when it was read. The holder may renew or release it meanwhile.
	Remaining time.Duration
	// ExpiresAt is the current grant's expiry by the database clock.
	ExpiresAt time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("leases: lease %q held by another holder for another %s", e.Key, e.Remaining)
}

// Unwrap returns [ErrLeaseHeld].
func (e *HeldError) Unwrap() error { return ErrLeaseHeld }

// invalid returns an ErrInvalid error naming the field.
func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
}

// classify maps a database error of a statement that was sent.
func classify(err error) error { return pgerr.Classify(err, true) }

// classifyRead maps a database error of a read-only statement. A read changes
// nothing, so it has no outcome to be unknown, sent or not: a broken
// connection is [ErrUnavailable], and a context that ended is the caller's
// (its cause, with the error it caused).
func classifyRead(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && pgerr.PgError(err) == nil {
		if cause := context.Cause(ctx); !errors.Is(err, cause) {
			return fmt.Errorf("%w: %w", cause, err)
		}
		return err
	}
	return pgerr.Classify(err, false)
}

// lost returns an ErrLeaseLost error for l with the given reason.
func (l *Lease) lostError(reason string, cause error) error {
	if cause != nil {
		return fmt.Errorf("%w: lease %q (holder %s, token %d): %s: %w", ErrLeaseLost, l.key, l.holder, l.token, reason, cause)
	}
	return fmt.Errorf("%w: lease %q (holder %s, token %d): %s", ErrLeaseLost, l.key, l.holder, l.token, reason)
}
