package leases

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
func (c *Client) PauseGrants(ctx context.Context, prefix, reason string) (added bool, err error) {
	if err := validatePrefix(prefix, reason, true); err != nil {
		return false, err
	}
	return added, c.write(ctx, fmt.Sprintf("pause grants %q", prefix), sqlPause, []any{prefix, reason}, &added)
}

// ResumeGrants lifts the pause of exactly prefix (a pause of a shorter prefix
// stays) and reports whether there was one. reason is optional ("" for none)
// and recorded with the role in pgfence.grant_pause_events. Waiting
// [Client.Acquire] calls of every client are woken at once (within their
// poll interval when wake-ups are off or missed). It needs the
// pgfence_operator role.
func (c *Client) ResumeGrants(ctx context.Context, prefix, reason string) (removed bool, err error) {
	if err := validatePrefix(prefix, reason, false); err != nil {
		return false, err
	}
	r := pgtype.Text{String: reason, Valid: reason != ""} // "": none
	if err := c.write(ctx, fmt.Sprintf("resume grants %q", prefix), sqlResume, []any{prefix, r}, &removed); err != nil {
		return false, err
	}
	if removed {
		c.wakeAll()
	}
	return removed, nil
}

// validatePrefix checks a paused prefix and the operator's reason.
func validatePrefix(prefix, reason string, reasonRequired bool) error {
	if err := checkText("prefix", prefix, MaxKeyBytes, false); err != nil {
		return err
	}
	return validateReason(reason, reasonRequired)
}

// Pauses returns the paused prefixes, ordered by prefix: every one for an
// operator, for a pgfence_app member those that pause names it may use
// (row-level security).
func (c *Client) Pauses(ctx context.Context) ([]Pause, error) {
	return read(ctx, c, "pauses", func(row pgx.CollectableRow) (p Pause, err error) {
		return p, row.Scan(&p.Prefix, &p.PausedBy, &p.Reason, &p.PausedAt)
	}, sqlPauses)
}
