package leases

import (
	"context"
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

// statusColumns are the columns of a lease row (pgfence.lease_status AS s),
// coalesced so that a missing row (of a LEFT JOIN) scans as a zero Status.
const statusColumns = `coalesce(s.key, ''), coalesce(s.holder::text, ''), coalesce(s.token, 0),
       coalesce(s.granted_at, 'epoch'), s.renewed_at, coalesce(s.expires_at, 'epoch'), s.released_at,
       coalesce(s.holder_info, ''), coalesce(s.live, false),
       coalesce(s.remaining, interval '0'), coalesce(s.client_version, '')`

// eventColumns are the columns of an event (pgfence.lease_events AS e),
// coalesced so that a missing one (of a LEFT JOIN) scans with ID 0.
const eventColumns = `coalesce(e.id, 0), coalesce(e.key, ''), coalesce(e.event, ''), coalesce(e.holder::text, ''),
       coalesce(e.token, 0), coalesce(e.at, 'epoch'), coalesce(e.reason, ''), coalesce(e.holder_info, ''),
       coalesce(e.client_version, '')`

// statusRow scans statusColumns.
type statusRow struct {
	Status
	renewed, released *time.Time
}

func (r *statusRow) dest() []any {
	return []any{&r.Key, &r.Holder, &r.Token, &r.GrantedAt, &r.renewed, &r.ExpiresAt, &r.released,
		&r.HolderInfo, &r.Live, &r.Remaining, &r.ClientVersion}
}

// status is the row scanned: zero when there was none.
func (r *statusRow) status() Status {
	if r.Key == "" {
		return Status{}
	}
	s := r.Status
	s.RenewedAt, s.ReleasedAt = deref(r.renewed), deref(r.released)
	return s
}

func scanStatus(row pgx.CollectableRow) (Status, error) {
	var r statusRow
	err := row.Scan(r.dest()...)
	return r.status(), err
}

func (e *Event) dest() []any {
	return []any{&e.ID, &e.Key, &e.Kind, &e.Holder, &e.Token, &e.At, &e.Reason, &e.HolderInfo, &e.ClientVersion}
}

// read runs one read-only statement and collects its rows with scan; op
// names the call in errors.
func read[T any](ctx context.Context, c *Client, op string, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("leases: %s: %w", op, ErrClosed)
	}
	conn, release, err := driver.Conn(ctx, c.pool) // fails only when nothing was sent
	if err != nil {
		return nil, fmt.Errorf("leases: %s: %w", op, err)
	}
	defer release()
	rows, err := conn.Query(ctx, sql, args...)
	var out []T
	if err == nil {
		out, err = pgx.CollectRows(rows, scan)
	}
	if err != nil {
		return nil, fmt.Errorf("leases: %s: %w", op, classifyRead(ctx, err))
	}
	return out, nil
}

// write sends one statement that changes something, with the context's
// trace id, and scans its row into dest; op names the call in errors.
func (c *Client) write(ctx context.Context, op, sql string, args []any, dest ...any) error {
	if c.isClosed() {
		return fmt.Errorf("leases: %s: %w", op, ErrClosed)
	}
	if err := c.exec(ctx, dest, driver.Traced(ctx, driver.Stmt{SQL: sql, Args: args})...); err != nil {
		return fmt.Errorf("leases: %s: %w", op, err)
	}
	return nil
}

// List returns every lease row (one per key ever leased), ordered by key.
func (c *Client) List(ctx context.Context) ([]Status, error) {
	return read(ctx, c, "list", scanStatus, sqlStatus+` ORDER BY s.key`)
}

// Get returns the lease row of key, or an error wrapping [pgfence.ErrNotFound].
func (c *Client) Get(ctx context.Context, key string) (Status, error) {
	if err := validateKey(key); err != nil {
		return Status{}, err
	}
	out, err := read(ctx, c, fmt.Sprintf("get %q", key), scanStatus, sqlStatus+` WHERE s.key = $1`, key)
	switch {
	case err != nil:
		return Status{}, err
	case len(out) == 0:
		return Status{}, fmt.Errorf("%w: %q", pgfence.ErrNotFound, key)
	}
	return out[0], nil
}

// History returns up to limit recorded transitions of key, newest first. The
// database keeps about the newest 100 per key.
func (c *Client) History(ctx context.Context, key string, limit int) ([]Event, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, invalid("limit", "must be positive, got %d", limit)
	}
	return read(ctx, c, fmt.Sprintf("history %q", key), func(row pgx.CollectableRow) (e Event, err error) {
		return e, row.Scan(e.dest()...)
	}, sqlHistory, key, limit)
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
	var r ForceReleased
	if err := c.write(ctx, fmt.Sprintf("force release %q", key), sqlForceRelease, []any{key, reason},
		&r.Released, &r.Holder, &r.Token, &r.WasLive); err != nil {
		return ForceReleased{}, err
	}
	if r.Released {
		c.wake(key)
		c.emit(event{Kind: eventForceReleased, Key: key, Holder: r.Holder, Token: r.Token})
	}
	return r, nil
}

// Counts is how many lease rows are in each state, by the database clock.
type Counts struct {
	// Keys counts every lease row: one per key ever leased.
	Keys int64
	// Live counts grants neither released nor expired.
	Live int64
	// Expired counts grants past their expiry and never released: their
	// holders died or lost the database; the next acquire takes them over.
	Expired int64
	// Released counts grants their holder (or an operator) released.
	Released int64
}

// Count counts the lease rows by state in one statement, without reading
// them: for health checks on a table too large for [Client.List].
func (c *Client) Count(ctx context.Context) (Counts, error) {
	n, err := read(ctx, c, "count", func(row pgx.CollectableRow) (n Counts, err error) {
		return n, row.Scan(&n.Keys, &n.Live, &n.Expired, &n.Released)
	}, sqlCount)
	if err != nil {
		return Counts{}, err
	}
	return n[0], nil
}
