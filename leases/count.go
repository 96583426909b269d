package leases

import (
	"context"
	"fmt"
)

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

// sqlCount counts the rows of pgfence.lease_status by state; immune to
// search_path (the view's own body was bound when it was created).
const sqlCount = `SELECT pg_catalog.count(*),
       pg_catalog.count(*) FILTER (WHERE live),
       pg_catalog.count(*) FILTER (WHERE NOT live AND released_at IS NULL),
       pg_catalog.count(*) FILTER (WHERE released_at IS NOT NULL)
  FROM pgfence.lease_status`

// Count counts the lease rows by state in one statement, without reading
// them: for health checks on a table too large for [Client.List].
func (c *Client) Count(ctx context.Context) (Counts, error) {
	if c.isClosed() {
		return Counts{}, fmt.Errorf("leases: count: %w", ErrClosed)
	}
	conn, err := c.conn(ctx) // fails only when nothing was sent
	if err != nil {
		return Counts{}, fmt.Errorf("leases: count: %w", err)
	}
	defer conn.Release()
	var n Counts
	if err := conn.QueryRow(ctx, sqlCount).Scan(&n.Keys, &n.Live, &n.Expired, &n.Released); err != nil {
		return Counts{}, fmt.Errorf("leases: count: %w", classifyRead(ctx, err))
	}
	return n, nil
}
