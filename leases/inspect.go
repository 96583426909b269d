package leases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/pgfence"
)

// Status is one lease row as the database sees it now.
type Status struct {
	// Key is the lease key.
	Key string
	// Holder is the current or last grant's holder id.
	Holder string
	// Token is the current or last grant's token.
	Token int64
	// GrantedAt, RenewedAt (zero if never renewed), ExpiresAt and ReleasedAt
	// (zero unless released) are database times of the current or last grant.
	GrantedAt  time.Time
	RenewedAt  time.Time
	ExpiresAt  time.Time
	ReleasedAt time.Time
	// HolderInfo is the holder's self-description.
	HolderInfo string
	// Live is true while the grant is neither released nor expired, by the
	// database clock.
	Live bool
	// Remaining is the time the grant has left by the database clock (0 unless
	// Live).
	Remaining time.Duration
	// ClientVersion is the client library that made the grant
	// ("pgfence-go/" and the module version for this package); empty for clients that do not pass
	// one (plain SQL).
	ClientVersion string
}

// HistoryEntry is one recorded transition of a key.
type HistoryEntry struct {
	// ID orders the entries (larger is later).
	ID int64
	// Key is the lease key.
	Key string
	// Event is acquired, taken_over (granted after the previous grant
	// expired unreleased), released, force_released or info_changed
	// ([Lease.SetHolderInfo]).
	Event string
	// Holder and Token identify the grant the event is about.
	Holder string
	Token  int64
	// At is the database time of the event.
	At time.Time
	// Reason says more: the expired grant for taken_over, the operator's
	// reason for force_released, "released after expiry" for a release that
	// came after the grant had expired.
	Reason string
	// ClientVersion is the granting client's library version on acquired and
	// taken_over entries (see [Status.ClientVersion]); empty otherwise.
	ClientVersion string
}

// ForceReleased reports what [Client.ForceRelease] did.
type ForceReleased struct {
	// Released is true when a grant was ended.
	Released bool
	// Holder and Token identify the grant it ended.
	Holder string
	Token  int64
	// WasLive is true when that grant had not expired yet.
	WasLive bool
}

func scanStatus(row pgx.Row) (Status, error) {
	var (
		s                 Status
		renewed, released *time.Time
		remainingMicros   int64
	)
	err := row.Scan(&s.Key, &s.Holder, &s.Token, &s.GrantedAt, &renewed, &s.ExpiresAt, &released,
		&s.HolderInfo, &s.Live, &remainingMicros, &s.ClientVersion)
	if renewed != nil {
		s.RenewedAt = *renewed
	}
	if released != nil {
		s.ReleasedAt = *released
	}
	s.Remaining = time.Duration(remainingMicros) * time.Microsecond
	return s, err
}

// List returns every lease row (one per key ever leased), ordered by key.
func (c *Client) List(ctx context.Context) ([]Status, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("leases: list: %w", ErrClosed)
	}
	conn, err := c.conn(ctx) // fails only when nothing was sent
	if err != nil {
		return nil, fmt.Errorf("leases: list: %w", err)
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, sqlList)
	if err != nil {
		return nil, fmt.Errorf("leases: list: %w", classifyRead(ctx, err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Status, error) { return scanStatus(row) })
	if err != nil {
		return nil, fmt.Errorf("leases: list: %w", classifyRead(ctx, err))
	}
	return out, nil
}

// Get returns the lease row of key, or an error wrapping [pgfence.ErrNotFound].
func (c *Client) Get(ctx context.Context, key string) (Status, error) {
	if err := validateKey(key); err != nil {
		return Status{}, err
	}
	if c.isClosed() {
		return Status{}, fmt.Errorf("leases: get %q: %w", key, ErrClosed)
	}
	conn, err := c.conn(ctx) // fails only when nothing was sent
	if err != nil {
		return Status{}, fmt.Errorf("leases: get %q: %w", key, err)
	}
	defer conn.Release()
	s, err := scanStatus(conn.QueryRow(ctx, sqlGet, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return Status{}, fmt.Errorf("%w: %q", pgfence.ErrNotFound, key)
	}
	if err != nil {
		return Status{}, fmt.Errorf("leases: get %q: %w", key, classifyRead(ctx, err))
	}
	return s, nil
}

// History returns up to limit recorded transitions of key, newest first. The
// database keeps about the newest 100 per key.
func (c *Client) History(ctx context.Context, key string, limit int) ([]HistoryEntry, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, invalid("limit", "must be positive, got %d", limit)
	}
	if c.isClosed() {
		return nil, fmt.Errorf("leases: history %q: %w", key, ErrClosed)
	}
	conn, err := c.conn(ctx) // fails only when nothing was sent
	if err != nil {
		return nil, fmt.Errorf("leases: history %q: %w", key, err)
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, sqlHistory, key, limit)
	if err != nil {
		return nil, fmt.Errorf("leases: history %q: %w", key, classifyRead(ctx, err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (HistoryEntry, error) {
		var e HistoryEntry
		err := row.Scan(&e.ID, &e.Key, &e.Event, &e.Holder, &e.Token, &e.At, &e.Reason, &e.ClientVersion)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("leases: history %q: %w", key, classifyRead(ctx, err))
	}
	return out, nil
}

// ForceRelease ends the current grant of key whoever holds it, for operators;
// reason (1 to 1000 characters) is recorded in the history. The holder finds
// out at its next renewal (or release), so protect the resource with the token
// as well. Waiters are notified.
func (c *Client) ForceRelease(ctx context.Context, key, reason string) (ForceReleased, error) {
	if err := validateKey(key); err != nil {
		return ForceReleased{}, err
	}
	if err := validateReason(reason, true); err != nil {
		return ForceReleased{}, err
	}
	var (
		r      ForceReleased
		holder *string
		token  *int64
	)
	if c.isClosed() {
		return ForceReleased{}, fmt.Errorf("leases: force release %q: %w", key, ErrClosed)
	}
	conn, err := c.conn(ctx) // fails only when nothing was sent: nothing was released
	if err != nil {
		return ForceReleased{}, fmt.Errorf("leases: force release %q: %w", key, err)
	}
	err = driver.QueryRow(ctx, conn, driver.Traced(ctx, driver.Stmt{SQL: sqlForceRelease, Args: []any{key, reason}}), &r.Released, &holder, &token, &r.WasLive)
	conn.Release()
	if err != nil {
		return ForceReleased{}, fmt.Errorf("leases: force release %q: %w", key, classify(err))
	}
	if holder != nil {
		r.Holder = *holder
	}
	if token != nil {
		r.Token = *token
	}
	if r.Released {
		c.wake(key)
		c.emit(event{Kind: eventForceReleased, Key: key, Holder: r.Holder, Token: r.Token})
	}
	return r, nil
}
