package leases

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/pgfence"
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
		acquired  bool
		token     *int64
		expiresAt *time.Time
		remaining time.Duration
	)
	conn, release, err := driver.Conn(ctx, c.pool)
	if err != nil {
		return nil, fmt.Errorf("leases: acquire %q: %w", key, err)
	}
	takenOver, err := c.sendGrant(ctx, conn, key, holder, ttl, info, announce, c.tel.Enabled(ctx),
		&acquired, &token, &expiresAt, &remaining)
	release()
	c.tel.attempted(ctx, err, acquired, takenOver)
	if err != nil {
		classified := classify(err)
		if errors.Is(classified, pgfence.ErrOutcomeUnknown) {
			return c.resolveGrant(ctx, &orphan{key: key, holder: holder, ttl: ttl, margin: margin, start: start}, err)
		}
		return nil, fmt.Errorf("leases: acquire %q: %w", key, classified)
	}
	if !acquired {
		return nil, &HeldError{Key: key, Remaining: remaining, ExpiresAt: deref(expiresAt)}
	}
	if err := c.observeEpoch(key, *token); err != nil {
		return nil, err
	}
	l := c.newLease(key, holder, *token, ttl, margin, start, *expiresAt)
	c.emit(event{Kind: eventAcquired, Key: key, Holder: holder, Token: *token})
	return l, nil
}

// An orphan is a grant attempt whose reply was lost: it may have been
// granted, it may still be on its way to the server, or it may never arrive.
type orphan struct {
	key, holder string
	ttl, margin time.Duration
	start       time.Time // when the attempt was sent, by the client's clock

	// decided is set once, by whichever comes first: the settlement, which
	// then hands its outcome to the waiting caller on result (buffered, 1:
	// the live grant, or nil), or the caller giving up, after which the
	// settlement releases a lease it finds.
	decided atomic.Bool
	result  chan *Lease
}

// resolveGrant settles the grant attempt o whose reply was lost, by its
// holder id, which is unique to the attempt: pgfence.abandon_grant commits
// that the attempt is given up (from then on it is refused if it arrives),
// then pgfence.grant_probe waits for any transaction still holding the key's
// row and reads whether the attempt got there first. Either answer is final:
// the attempt's lease is returned, or nothing (live) was granted. No backend
// pid is involved, so it holds behind a pooler too.
//
// The settlement runs in the background, retried until it gets both answers
// (or Close); the caller waits for it no longer than Config.ResolveTimeout
// and its context. If the caller stops waiting first, it gets
// pgfence.ErrOutcomeUnknown, and the settlement releases a lease it finds
// (waking this client's waiters of the key), so that this client's own lost
// grant never holds the key against it until it expires.
func (c *Client) resolveGrant(ctx context.Context, o *orphan, cause error) (*Lease, error) {
	o.result = make(chan *Lease, 1)
	c.background(func() { c.settle(ctx, o) })
	wait, cancel := context.WithTimeout(ctx, c.cfg.ResolveTimeout)
	defer cancel()
	select {
	case l := <-o.result:
		if l != nil {
			c.emit(event{Kind: eventAcquired, Key: o.key, Holder: o.holder, Token: l.Token()})
			return l, nil
		}
		return nil, fmt.Errorf("leases: acquire %q: the reply was lost and no live grant was found (the attempt of holder %s is abandoned: it is refused if it still arrives): %w: %w",
			o.key, o.holder, pgfence.ErrUnavailable, cause)
	case <-wait.Done():
	case <-c.lifetime.Done():
	}
	if o.decided.CompareAndSwap(false, true) {
		c.cfg.Logger.Debug("pgfence lease: a lost grant reply is settled in the background", "key", o.key, "holder", o.holder)
	} else if l := <-o.result; l != nil { // settled just now
		if c.isClosed() {
			// Close may have stopped waiting for background work: release
			// it here, before this call returns.
			c.releaseNow(ctx, l)
		} else {
			c.background(func() { c.releaseNow(ctx, l) })
		}
	}
	err := fmt.Errorf("leases: acquire %q: the reply was lost and the grant to holder %s could not be settled yet (it is settled in the background, and a lease it finds is released): %w: %w",
		o.key, o.holder, pgfence.ErrOutcomeUnknown, cause)
	if c.isClosed() {
		// Close waits for the settlement, which releases a grant it finds.
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return nil, err
}

// settle settles o (see resolveGrant), retrying with capped backoff until
// the abandonment and the probe both answered, or the client closes. It
// gives the outcome to the waiting caller, or releases a lease it found.
func (c *Client) settle(ctx context.Context, o *orphan) {
	bg := context.WithoutCancel(ctx)
	for attempt := 0; ; attempt++ {
		l, err := c.settleOnce(bg, o)
		if err == nil {
			if o.decided.CompareAndSwap(false, true) {
				o.result <- l
			} else if l != nil {
				// The caller gave up. Released here, not in another
				// goroutine: Close waits for this settlement, release
				// included.
				c.releaseNow(bg, l)
			}
			return
		}
		c.cfg.Logger.Debug("pgfence lease: settling a lost grant reply failed; retrying", "key", o.key, "holder", o.holder, "err", err)
		if !sleepCtx(c.lifetime, fullJitter(capped(c.cfg.BackoffMin, attempt, c.cfg.BackoffMax))) {
			c.cfg.Logger.Warn("pgfence lease: client closed before a lost grant reply was settled; if it was granted, the lease expires on its own",
				"key", o.key, "holder", o.holder, "ttl", o.ttl)
			return
		}
	}
}

// settleOnce abandons o's attempt and probes for its grant, each statement
// its own transaction, bounded by Config.ResolveTimeout. It returns the
// attempt's lease, or nil when nothing was granted, the grant has ended, or
// this client may no longer trust it (then it is released).
func (c *Client) settleOnce(ctx context.Context, o *orphan) (*Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ResolveTimeout)
	defer cancel()
	var (
		abandoned, granted, live bool
		token                    *int64
		expires                  *time.Time
	)
	if err := c.pool.QueryRow(ctx, sqlAbandonGrant, o.key, o.holder).Scan(&abandoned); err != nil {
		return nil, err
	}
	if err := c.pool.QueryRow(ctx, sqlGrantProbe, o.key, o.holder).Scan(&granted, &token, &expires, &live); err != nil || !granted {
		return nil, err
	}
	if !live || c.until(o.start.Add(o.ttl-o.margin)) <= 0 {
		if live { // granted, but this client may no longer trust it
			c.releaseNow(ctx, c.newLease(o.key, o.holder, *token, o.ttl, o.margin, o.start, *expires))
		}
		return nil, nil
	}
	if c.observeEpoch(o.key, *token) != nil {
		return nil, nil
	}
	return c.newLease(o.key, o.holder, *token, o.ttl, o.margin, o.start, *expires), nil
}

// releaseNow releases l, bounded by Config.ResolveTimeout. A release that
// fails is logged: the grant nobody received then holds its key until it
// expires.
func (c *Client) releaseNow(ctx context.Context, l *Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ResolveTimeout)
	defer cancel()
	if err := l.Release(rctx); err != nil && !errors.Is(err, pgfence.ErrLeaseLost) {
		c.cfg.Logger.Warn("pgfence lease: a grant nobody received could not be released; it holds the key until it expires",
			"key", l.key, "holder", l.holder, "token", l.token, "expires_at", l.ExpiresAt(), "err", err)
	}
}

// sendGrant runs one grant attempt (pgfence.try_acquire) and scans its row
// into dest. When ctx carries a trace id, the id is set for the grant's
// transaction in the same pipeline (it is stored in the lease event); with
// countTakeovers, the event the grant recorded is read back in the same
// pipeline too (takenOver). Neither costs a round trip.
func (c *Client) sendGrant(ctx context.Context, conn *pgx.Conn, key, holder string, ttl time.Duration, info string, announce, countTakeovers bool,
	dest ...any) (takenOver bool, err error) {
	stmts := driver.Traced(ctx, driver.Stmt{SQL: sqlTryAcquire, Args: []any{key, ttl.Microseconds(), info, holder, clientVersion(), announce}})
	if !countTakeovers {
		return false, driver.QueryRow(ctx, conn, stmts, dest...)
	}
	b := &pgx.Batch{}
	for _, s := range append(stmts, driver.Stmt{SQL: sqlGrantEvent, Args: []any{key, holder}}) {
		b.Queue(s.SQL, s.Args...)
	}
	br := conn.SendBatch(ctx, b)
	if len(stmts) > 1 { // the trace id
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	if err == nil {
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
	return takenOver, err
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
				key, token, epoch, seen, pgfence.ErrNotPrimary)
		}
		if epoch == seen || c.seenEpoch.CompareAndSwap(seen, epoch) {
			return nil
		}
	}
}
