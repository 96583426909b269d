package leases

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/telemetry"
	"github.com/pgfence/pgfence/internal/tracesql"
)

// sqlGrantEvent reads, in the grant's own transaction, which event the grant
// recorded: the holder id is fresh per attempt, so the key's newest event with
// it is this grant's.
const sqlGrantEvent = `SELECT event = 'taken_over' FROM pgfence.lease_events
 WHERE key = $1 AND holder = $2::uuid ORDER BY id DESC LIMIT 1`

func (c *Client) tryAcquire(ctx context.Context, key string, ttl, margin time.Duration, info string, announce bool) (*Lease, error) {
	holder := newHolderID()
	start := c.now()
	var (
		acquired           bool
		gotHolder          *string
		token              *int64
		granted, expiresAt *time.Time
		remainingMicros    int64
	)
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("leases: acquire %q: %w", key, err)
	}
	pid := conn.Conn().PgConn().PID() // the backend that runs the grant
	err = c.sendGrant(ctx, conn, key, holder, ttl, info, announce, &acquired, &gotHolder, &token, &granted, &expiresAt, &remainingMicros)
	conn.Release()
	if err != nil {
		classified := classify(err)
		if errors.Is(classified, ErrOutcomeUnknown) {
			return c.resolveGrant(ctx, key, holder, pid, ttl, margin, start, err)
		}
		return nil, fmt.Errorf("leases: acquire %q: %w", key, classified)
	}
	if !acquired {
		held := &HeldError{Key: key, Remaining: time.Duration(remainingMicros) * time.Microsecond}
		if expiresAt != nil {
			held.ExpiresAt = *expiresAt
		}
		return nil, held
	}
	if err := c.observeEpoch(key, *token); err != nil {
		return nil, err
	}
	l := c.newLease(key, holder, *token, ttl, margin, start, *granted, *expiresAt)
	c.emit(Event{Kind: EventAcquired, Key: key, Holder: holder, Token: *token, Duration: c.since(start)})
	return l, nil
}

// resolveGrant reads back the grant of an attempt whose reply was lost. The
// holder id is unique to the attempt, so a row carrying it is our grant. The
// absence of the row is conclusive only once the backend that ran the attempt
// (pid, on the connection the client has already given up) has exited: until
// then it may still commit. So it terminates that backend first.
//
// The read-back runs in the background for up to Config.ResolveTimeout, but
// the caller waits no longer than its context: if that ends first, the call
// returns ErrOutcomeUnknown at once and the background read-back releases the
// grant if there was one, so it does not block the key until it expires.
func (c *Client) resolveGrant(ctx context.Context, key, holder string, pid uint32, ttl, margin time.Duration, start time.Time, cause error) (*Lease, error) {
	type result struct {
		l   *Lease
		err error
	}
	done := make(chan result, 1)
	c.background(func() {
		l, err := c.readBackGrant(ctx, key, holder, pid, ttl, margin, start, cause)
		done <- result{l, err}
	})
	// releaseLater settles a grant the caller will not receive.
	releaseLater := func() {
		c.background(func() {
			if r := <-done; r.l != nil {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ResolveTimeout)
				defer cancel()
				_ = r.l.Release(rctx)
			}
		})
	}
	select {
	case r := <-done:
		if r.l != nil && ctx.Err() != nil {
			// The caller gave up meanwhile; do not leave the lease to expire on its own.
			done <- r
			releaseLater()
			return nil, fmt.Errorf("leases: acquire %q: %w", key, context.Cause(ctx))
		}
		if r.err == nil {
			c.emit(Event{Kind: EventAcquired, Key: key, Holder: holder, Token: r.l.Token(), Duration: c.since(start)})
		}
		return r.l, r.err
	case <-ctx.Done():
		releaseLater()
		return nil, fmt.Errorf("leases: acquire %q: the reply was lost and the caller's context ended before the grant to holder %s could be read back (if it was granted, it is released in the background): %w: %w",
			key, holder, ErrOutcomeUnknown, context.Cause(ctx))
	}
}

// sendGrant runs one grant attempt (pgfence.try_acquire) and scans its row
// into acquired and rest. When ctx carries a trace id, the id is set for the
// grant's transaction in the same pipeline (it is stored in the lease event);
// when takeovers are counted, the event the grant recorded is read back in
// the same pipeline too. Neither costs a round trip.
func (c *Client) sendGrant(ctx context.Context, conn *pgxpool.Conn, key, holder string, ttl time.Duration, info string, announce bool, acquired *bool, rest ...any) error {
	countTakeovers := c.tel.takeovers.Enabled(ctx)
	traceID := telemetry.TraceID(ctx)
	dest := append([]any{acquired}, rest...)
	var (
		err       error
		takenOver bool
	)
	if traceID == "" && !countTakeovers {
		err = conn.QueryRow(ctx, sqlTryAcquire, key, ttl.Microseconds(), info, holder, ClientVersion(), announce).Scan(dest...)
	} else {
		b := &pgx.Batch{}
		if traceID != "" {
			b.Queue(tracesql.SetTraceIDSQL, traceID)
		}
		b.Queue(sqlTryAcquire, key, ttl.Microseconds(), info, holder, ClientVersion(), announce)
		if countTakeovers {
			b.Queue(sqlGrantEvent, key, holder)
		}
		br := conn.SendBatch(ctx, b)
		if traceID != "" {
			_, err = br.Exec()
		}
		if err == nil {
			err = br.QueryRow().Scan(dest...)
		}
		if err == nil && countTakeovers {
			// No row when nothing was granted. An error here aborts the
			// implicit transaction, grant included: it is the attempt's error.
			if err = br.QueryRow().Scan(&takenOver); errors.Is(err, pgx.ErrNoRows) {
				err = nil
			}
		}
		// The grant commits at the end of the pipeline: an error closing it
		// (a lost reply) leaves the outcome unknown even after the row came.
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	c.tel.attempted(ctx, err, *acquired, takenOver)
	return err
}

// readBackGrant is resolveGrant's background part, bounded by
// Config.ResolveTimeout.
func (c *Client) readBackGrant(ctx context.Context, key, holder string, pid uint32, ttl, margin time.Duration, start time.Time, cause error) (*Lease, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ResolveTimeout)
	defer cancel()
	var (
		token              int64
		granted, expiresAt time.Time
		live, gone         bool
		err                error
	)
	for attempt := 0; ; attempt++ {
		err = c.pool.QueryRow(rctx, sqlSettleBackend, pid).Scan(&gone)
		if err == nil && !gone {
			err = errBackendRunning
		}
		if err == nil {
			err = c.pool.QueryRow(rctx, sqlReadBack, key, holder).Scan(&token, &granted, &expiresAt, &live)
			if err == nil || errors.Is(err, pgx.ErrNoRows) {
				break
			}
		}
		if rctx.Err() != nil || !sleepCtx(rctx, fullJitter(c.cfg.BackoffMin<<min(attempt, 6))) {
			break
		}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows) || (err == nil && !live):
		return nil, fmt.Errorf("leases: acquire %q: the reply was lost and no live grant to holder %s was found: %w: %w", key, holder, ErrUnavailable, cause)
	case err != nil:
		return nil, fmt.Errorf("leases: acquire %q: the reply was lost and the grant to holder %s could not be read back (%v): %w", key, holder, err, classify(cause))
	}
	if err := c.observeEpoch(key, token); err != nil {
		return nil, err
	}
	return c.newLease(key, holder, token, ttl, margin, start, granted, expiresAt), nil
}

// newHolderID returns a random (version 4) UUID in its text form.
func newHolderID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// tokenEpochShift is where the timeline sits in a token (see
// pgfence.next_token): token = timeline << 40 | counter.
const tokenEpochShift = 40

// observeEpoch remembers the highest token epoch seen and refuses a grant from
// a lower one: after a failover, an old primary that was not shut
// down can still grant leases on its old timeline, with tokens below the new
// primary's; the client must not act on them.
func (c *Client) observeEpoch(key string, token int64) error {
	epoch := token >> tokenEpochShift
	for {
		seen := c.seenEpoch.Load()
		if epoch < seen {
			return fmt.Errorf("leases: acquire %q: the grant's token %d is from timeline %d, but this client already saw timeline %d: the server is an old primary: %w",
				key, token, epoch, seen, ErrNotPrimary)
		}
		if epoch == seen || c.seenEpoch.CompareAndSwap(seen, epoch) {
			return nil
		}
	}
}
