package leases

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgfence/pgfence/internal/driver"
)

// Pause is one kill switch: new grants of every key that starts with Prefix
// are refused with [pgfence.ErrGrantsPaused] until it is lifted.
type Pause struct {
	// Prefix is the paused key prefix; "" pauses every key.
	Prefix string
	// PausedBy is the database role (session_user) that paused it.
	PausedBy string
	// Reason is the operator's reason.
	Reason string
	// PausedAt is the database time the prefix was first paused: pausing it
	// again replaces Reason and PausedBy only (every pause is recorded in
	// pgfence.grant_pause_events).
	PausedAt time.Time
}

// PauseGrants stops new grants of every key that starts with prefix ("" is
// every key), for a rollout or an incident: [Client.TryAcquire] fails with
// [pgfence.ErrGrantsPaused], waiting [Client.Acquire] calls keep waiting. Current
// holders keep renewing, releasing and writing with their tokens until they
// finish (or until [Client.ForceRelease] ends them, after which their fenced
// writes are refused). The prefix is matched literally (no pattern). reason
// (1 to 1000 characters) and the database role are recorded in
// pgfence.grant_pause_events. It reports whether the prefix was not paused
// yet; pausing it again replaces the reason. It needs the pgfence_operator
// role (see the package documentation).
func (c *Client) PauseGrants(ctx context.Context, prefix, reason string) (bool, error) {
	if len(prefix) > MaxKeyBytes {
		return false, invalid("prefix", "must be at most %d bytes, got %d", MaxKeyBytes, len(prefix))
	}
	if err := validText("prefix", prefix); err != nil {
		return false, err
	}
	if err := validateReason(reason, true); err != nil {
		return false, err
	}
	if c.isClosed() {
		return false, fmt.Errorf("leases: pause grants %q: %w", prefix, ErrClosed)
	}
	conn, err := c.conn(ctx) // fails only when nothing was sent: nothing was paused
	if err != nil {
		return false, fmt.Errorf("leases: pause grants %q: %w", prefix, err)
	}
	defer conn.Release()
	var added bool
	if err := driver.QueryRow(ctx, conn, driver.Traced(ctx, driver.Stmt{SQL: sqlPause, Args: []any{prefix, reason}}), &added); err != nil {
		return false, fmt.Errorf("leases: pause grants %q: %w", prefix, classify(err))
	}
	return added, nil
}

// ResumeGrants lifts the pause of exactly prefix (a pause of a shorter prefix
// stays) and reports whether there was one. reason is optional ("" for none)
// and recorded with the role in pgfence.grant_pause_events. Waiting
// [Client.Acquire] calls of every client are woken at once (within their
// poll interval when wake-ups are off or missed). It needs the
// pgfence_operator role.
func (c *Client) ResumeGrants(ctx context.Context, prefix, reason string) (bool, error) {
	if len(prefix) > MaxKeyBytes {
		return false, invalid("prefix", "must be at most %d bytes, got %d", MaxKeyBytes, len(prefix))
	}
	if err := validText("prefix", prefix); err != nil {
		return false, err
	}
	if err := validateReason(reason, false); err != nil {
		return false, err
	}
	var r *string
	if reason != "" {
		r = &reason
	}
	if c.isClosed() {
		return false, fmt.Errorf("leases: resume grants %q: %w", prefix, ErrClosed)
	}
	conn, err := c.conn(ctx) // fails only when nothing was sent: nothing was resumed
	if err != nil {
		return false, fmt.Errorf("leases: resume grants %q: %w", prefix, err)
	}
	var removed bool
	err = driver.QueryRow(ctx, conn, driver.Traced(ctx, driver.Stmt{SQL: sqlResume, Args: []any{prefix, r}}), &removed)
	conn.Release()
	if err != nil {
		return false, fmt.Errorf("leases: resume grants %q: %w", prefix, classify(err))
	}
	if removed {
		c.wakeAll()
	}
	return removed, nil
}

// Pauses returns the paused prefixes, ordered by prefix.
func (c *Client) Pauses(ctx context.Context) ([]Pause, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("leases: pauses: %w", ErrClosed)
	}
	conn, err := c.conn(ctx) // fails only when nothing was sent
	if err != nil {
		return nil, fmt.Errorf("leases: pauses: %w", err)
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, sqlPauses)
	if err != nil {
		return nil, fmt.Errorf("leases: pauses: %w", classifyRead(ctx, err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Pause, error) {
		var p Pause
		err := row.Scan(&p.Prefix, &p.PausedBy, &p.Reason, &p.PausedAt)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("leases: pauses: %w", classifyRead(ctx, err))
	}
	return out, nil
}
