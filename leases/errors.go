package leases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence"
)

// The lease client's own states. Its failures are pgfence's sentinels
// (package github.com/pgfence/pgfence/pgfence): [pgfence.ErrLeaseHeld],
// [pgfence.ErrLeaseLost], [pgfence.ErrOutcomeUnknown],
// [pgfence.ErrUnavailable], [pgfence.ErrInvalid], [pgfence.ErrNotPrimary],
// [pgfence.ErrGrantsPaused], [pgfence.ErrNotGranted] and
// [pgfence.ErrNotFound]; test with [errors.Is]. The errors returned carry
// details (key, holder, token, the database's message) around them.
var (
	// ErrReleased: the lease was released by its holder; it is the cause of the
	// lease's context after a [Lease.Release] that was confirmed.
	ErrReleased = errors.New("leases: lease released")
	// ErrMaxHold: the keep-alive reached the lease's maximum hold time
	// ([AcquireOptions.MaxHold]) and stopped; the lease's context ends with it.
	ErrMaxHold = errors.New("leases: maximum hold time reached")
	// ErrClosed: the [Client] was closed.
	ErrClosed = errors.New("leases: client closed")
)

// HeldError is returned by [Client.TryAcquire] (and, wrapped, by
// [Client.Acquire] when it gives up) when another holder has the lease.
// errors.Is(err, pgfence.ErrLeaseHeld) is true.
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

// Unwrap returns [pgfence.ErrLeaseHeld].
func (e *HeldError) Unwrap() error { return pgfence.ErrLeaseHeld }

// invalid returns an pgfence.ErrInvalid error naming the field.
func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", pgfence.ErrInvalid, field, fmt.Sprintf(format, args...))
}

// classify maps a database error of a statement that was sent.
func classify(err error) error { return pgerr.Classify(err, true) }

// classifyRead maps a database error of a read-only statement. A read changes
// nothing, so it has no outcome to be unknown, sent or not: a broken
// connection is [pgfence.ErrUnavailable], and a context that ended is the caller's
// (its cause, with the error it caused, as for a connection that could not
// be had: [driver.Acquired]).
func classifyRead(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && pgerr.PgError(err) == nil {
		return driver.Acquired(ctx, err)
	}
	return pgerr.Classify(err, false)
}

// lostError returns a pgfence.ErrLeaseLost error for l with the given
// reason, wrapping cause if any.
func (l *Lease) lostError(reason string, cause error) error {
	err := fmt.Errorf("%w: lease %s: %s", pgfence.ErrLeaseLost, l.id(), reason)
	if cause != nil {
		err = fmt.Errorf("%w: %w", err, cause)
	}
	return err
}
