package leases

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/pgfence"
)

// Client grants, renews and releases leases on one database. It is safe for
// concurrent use. Create it with [New]; [Client.Close] stops its LISTEN
// connection.
type Client struct {
	pool *pgxpool.Pool
	cfg  Config
	tel  *instruments

	bg sync.WaitGroup // the LISTEN connection, keep-alives, background read-backs of lost grant replies

	// lifetime ends when the client is closed (Close calls stop, under mu):
	// the keep-alives, the LISTEN connection, waits and watches stop, and
	// nothing new starts.
	lifetime context.Context
	stop     context.CancelFunc

	// seenEpoch is the highest token epoch (timeline, token >> 40) of any
	// grant this client received. A grant from a lower epoch comes from a
	// server on an older timeline: a demoted primary that still accepts writes.
	seenEpoch atomic.Int64

	// clockOffset shifts the wall clock the client reads (now) against the
	// database's. It is zero except in tests (SetClockOffset in
	// export_test.go), which show that no trust window or hold time depends
	// on the client's wall clock.
	clockOffset time.Duration

	// listenUp: the LISTEN connection is up, and releases are announced.
	listenUp atomic.Bool

	mu        sync.Mutex
	queues    map[string][]*waiter     // waiting Acquire calls per key, in arrival order
	windows   map[string]time.Duration // hold-back window after a wake-up, per contended key
	listening bool                     // the LISTEN connection's goroutine was started, by the first waiting Acquire or Watch
	watchers  map[string][]*Watcher    // running watches per key
	taskWakes map[*taskWake]struct{}   // WakeOnTasks subscribers

	onEvent func(event) // tests observe transitions (export_test.go)
}

// New returns a client on pool. A nil cfg uses the defaults. The pool is the
// caller's: Close does not close it.
func New(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, invalid("pool", "must not be nil")
	}
	resolved, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	lifetime, stop := context.WithCancel(context.Background())
	return &Client{
		pool:      pool,
		cfg:       resolved,
		tel:       newTelemetry(&resolved),
		lifetime:  lifetime,
		stop:      stop,
		queues:    make(map[string][]*waiter),
		watchers:  make(map[string][]*Watcher),
		taskWakes: make(map[*taskWake]struct{}),
		windows:   make(map[string]time.Duration),
	}, nil
}

// Pool is the pool the client was made with.
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// Close stops the client's LISTEN connection and makes waiting Acquire calls
// and watches end with [ErrClosed]; every later call of the client's methods
// returns [ErrClosed] without sending anything. It stops the keep-alives of
// the leases the client granted (and waits for them): a lease not released
// first then expires after its TTL. Those leases' own methods
// ([Lease.Renew], [Lease.Release], [Lease.SetHolderInfo]) keep working, so
// that a lease can still be released; release them first.
// It waits for the background read-backs of lost grant replies that started
// before it was called, and for the release of a grant one of them finds
// that nobody received, each bounded by [Config.ResolveTimeout], and for
// fair waiters that gave up to leave the database queue (2 s at most).
func (c *Client) Close() error {
	c.mu.Lock()
	c.stop()
	c.mu.Unlock()
	c.bg.Wait() // bounded by Config.ResolveTimeout
	return nil
}

// exec sends stmts on one connection of the pool in one round trip (one
// implicit transaction) and scans the last one's row into dest. Its error is
// classified. Every statement of the client takes its connection with
// [driver.Conn]: when that fails, nothing was sent, for certain, and the
// error is the context's cause when ctx ended (the caller's deadline, not an
// outage), else it wraps [pgfence.ErrUnavailable] (the database could not be
// reached, or the pool is closed).
func (c *Client) exec(ctx context.Context, dest []any, stmts ...driver.Stmt) error {
	conn, release, err := driver.Conn(ctx, c.pool)
	if err != nil {
		return err
	}
	defer release()
	return classify(driver.QueryRow(ctx, conn, stmts, dest...))
}

// now reads the client's clock: time.Now (shifted by clockOffset in tests).
// Its times carry the monotonic reading, and trust windows and hold times are
// computed only from differences of such times (until, since), never
// against a database time.
func (c *Client) now() time.Time { return time.Now().Add(c.clockOffset) }

// until is the time from now to t, a time read with now.
func (c *Client) until(t time.Time) time.Duration { return t.Sub(c.now()) }

// since is the time from t, a time read with now, to now.
func (c *Client) since(t time.Time) time.Duration { return c.now().Sub(t) }

func (c *Client) isClosed() bool { return c.lifetime.Err() != nil }

// Check reports what [Client.Acquire] (or [Client.Do]) would refuse for
// key, ttl and opts before anything is sent, including what only the
// keep-alive would meet after the grant (a renewal interval the TTL leaves no
// room for): the error wraps [pgfence.ErrInvalid] and names the argument.
// Helpers that take a lease later (an election, a job runner) call it when
// they are built.
func (c *Client) Check(key string, ttl time.Duration, opts *AcquireOptions) error {
	_, _, err := c.args(key, ttl, opts)
	return err
}

// args checks key, ttl and opts, and returns the safety margin to use and
// the options with their defaults.
func (c *Client) args(key string, ttl time.Duration, opts *AcquireOptions) (time.Duration, AcquireOptions, error) {
	if err := validateKey(key); err != nil {
		return 0, AcquireOptions{}, err
	}
	margin, err := c.validateTTL(ttl)
	if err != nil {
		return 0, AcquireOptions{}, err
	}
	o, err := opts.check(ttl, margin)
	return margin, o, err
}

// TryAcquire makes one attempt to get the lease on key for ttl: it is
// [Client.Acquire] with [AcquireOptions.TryOnce]. When another holder has
// it, the error is a [*HeldError] (errors.Is(err, [pgfence.ErrLeaseHeld]))
// with the time it has left.
func (c *Client) TryAcquire(ctx context.Context, key string, ttl time.Duration, opts *AcquireOptions) (*Lease, error) {
	o := deref(opts)
	o.TryOnce = true
	return c.Acquire(ctx, key, ttl, &o)
}

// background runs f in a goroutine that Close waits for. Once Close has been
// called, f runs all the same, but Close does not wait for it: adding to
// c.bg from zero while Close waits would be a misuse of the WaitGroup (a
// data race, or a panic).
func (c *Client) background(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isClosed() {
		go f()
		return
	}
	c.bg.Go(f)
}

// Acquire gets the lease on key for ttl, waiting while another holder has it
// until ctx ends (or opts.MaxWait passes; with opts.TryOnce it makes one
// attempt), and keeps it alive as opts says: renewed in the background until
// it is released or lost, for at most [AcquireOptions.MaxHold], one hour by
// default: a holder that means to hold the key for longer (a singleton
// worker) sets it, or [NoMaxHold]. Release it when done. Waiting is cheap:
// within a client, only the first waiter for a key polls (the others queue
// behind it in FIFO order; fair waiters each poll, see
// [AcquireOptions.Fair]); it retries with capped exponential backoff and
// full jitter, right after the holder's expiry, and when a release
// notification arrives. Waiters in different clients do not all try at once
// after a release: each holds back a random moment in a window (at most
// 64 ms) that grows while it loses races for the key and shrinks while it
// wins (zero when it waits alone), and skips its attempt if another waiter's
// grant is announced meanwhile ([AcquireOptions.Announce]).
//
// While an operator has paused new grants for the key's prefix
// ([Client.PauseGrants]), it waits the same way and is woken by the resume;
// if its deadline comes first, the error usually wraps [pgfence.ErrGrantsPaused].
//
// When it gives up, the error wraps the context's error and the last attempt's
// (usually a [*HeldError]).
func (c *Client) Acquire(ctx context.Context, key string, ttl time.Duration, opts *AcquireOptions) (l *Lease, err error) {
	ctx, done := c.tel.startAcquire(ctx, key, ttl, opts == nil || !opts.TryOnce)
	defer func() { done(l, err) }()
	margin, o, err := c.args(key, ttl, opts)
	switch {
	case err != nil:
		return nil, err
	case c.isClosed():
		return nil, ErrClosed
	case o.TryOnce:
		l, err = c.tryAcquire(ctx, key, ttl, margin, o.HolderInfo, o.Announce)
	default:
		l, err = c.acquire(ctx, key, ttl, margin, o)
	}
	if err != nil {
		return nil, err
	}
	if !o.NoKeepAlive {
		c.background(func() {
			reason, err := l.renewLoop(c.lifetime, o)
			c.tel.keepAliveStopped(l, reason, err)
		})
	}
	return l, nil
}

func (c *Client) acquire(ctx context.Context, key string, ttl, margin time.Duration, o AcquireOptions) (l *Lease, err error) {
	if o.MaxWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.MaxWait)
		defer cancel()
	}
	c.startListener()
	w := c.enqueue(key, o.Fair)
	defer c.dequeue(key, w)

	waiter := newHolderID()
	// atHead: this fair waiter's last turn found nobody ahead of it.
	atHead := false
	// turns: the queue turn statements still in flight (see queueTurn).
	var turns sync.WaitGroup
	if o.Fair {
		defer func() {
			if l != nil {
				c.leaveQueue(ctx, key, waiter, false)
				return
			}
			// Given up: the caller's context bounds the wait, so the queue
			// row goes in the background (Close waits for it), after the
			// last turn: a turn the server ran after the leave would put
			// the waiter back in the queue, in the others' way for a whole
			// patience.
			c.background(func() { turns.Wait(); c.leaveQueue(ctx, key, waiter, atHead) })
		}()
	}

	var last error
	select {
	case <-w.turn:
	case <-ctx.Done():
		return nil, fmt.Errorf("leases: acquire %q: gave up waiting behind other waiters: %w", key, context.Cause(ctx))
	case <-c.lifetime.Done():
		return nil, ErrClosed
	}
	// woken: the last wait ended with a release of the key, or at the
	// holder's expiry: every waiting client tries now.
	woken := false
	for attempt := 0; ; attempt++ {
		var (
			remaining time.Duration
			heard     bool
		)
		if woken && !o.Fair {
			// Every client waiting for the key heard the release (or saw
			// the expiry). Hold back a moment; if another waiter's grant is
			// announced meanwhile, the key is taken and an attempt would
			// only cost a statement.
			if remaining, heard = c.holdBack(ctx, key, w); c.isClosed() {
				return nil, ErrClosed
			} else if heard {
				c.tel.attempt(ctx, outcomeSkipped)
			}
		}
		if !heard {
			select {
			case <-w.wake: // this attempt covers it
			default:
			}
			if o.Fair {
				err = c.queueTurn(ctx, key, waiter, &turns)
				atHead = err == nil
			}
			if !o.Fair || atHead {
				l, err = c.tryAcquire(ctx, key, ttl, margin, o.HolderInfo, o.Announce)
			}
			var held *HeldError
			isHeld := errors.As(err, &held)
			if woken && (err == nil || isHeld) {
				c.adapt(key, err == nil) // won, or lost the race that followed a release or expiry
			}
			switch {
			case err == nil:
				return l, nil
			case ctx.Err() != nil:
				if last != nil && errors.Is(err, context.Cause(ctx)) && !errors.Is(err, pgfence.ErrOutcomeUnknown) {
					// This attempt ended with the context and says nothing
					// about the key: report the last one that got an answer.
					err = last
				}
				return nil, fmt.Errorf("leases: acquire %q: gave up waiting: %w (last attempt: %w)", key, context.Cause(ctx), err)
			case isHeld:
				remaining = held.Remaining
			case errors.Is(err, pgfence.ErrUnavailable), errors.Is(err, pgfence.ErrOutcomeUnknown):
				// Transient: retry with backoff until the deadline.
			case errors.Is(err, pgfence.ErrGrantsPaused):
				// A kill switch is temporary too: wait for the resume like for
				// a holder, until the deadline (the error then wraps it).
			default:
				return nil, err
			}
			last = err
		}
		var stop error
		if woken, stop = c.waitTurn(ctx, w, attempt, remaining); stop != nil {
			if errors.Is(stop, ErrClosed) {
				return nil, stop
			}
			return nil, fmt.Errorf("leases: acquire %q: gave up waiting: %w (last attempt: %w)", key, stop, last)
		}
	}
}

// waitTurn sleeps after the head waiter's attempt-th failed try (remaining:
// the holder's time left, 0 when unknown) until the delay passes or a
// release of the key is announced. It reports whether every waiting client
// tries now (a release, or the holder's expiry), or why waiting ended: the
// context's cause, or ErrClosed.
func (c *Client) waitTurn(ctx context.Context, w *waiter, attempt int, remaining time.Duration) (woken bool, stop error) {
	d, atExpiry := c.delay(attempt, remaining)
	timer := time.NewTimer(d)
	defer timer.Stop()
	due := time.Now().Add(d)
	for {
		select {
		case <-ctx.Done():
			return false, context.Cause(ctx)
		case <-c.lifetime.Done():
			return false, ErrClosed
		case <-w.wake:
			return true, nil
		case lease := <-w.granted:
			// Another waiter got the key (announced): its expiry is the next
			// chance if it never releases. A waiter that lost to the
			// contention filter knows no expiry until now.
			if e := lease + fullJitter(c.cfg.BackoffMin); time.Now().Add(e).Before(due) {
				timer.Reset(e)
				due, atExpiry = time.Now().Add(e), true
			}
		case <-timer.C:
			return atExpiry, nil
		}
	}
}

// queueTimeout bounds a fair waiter's queue statements once its caller has
// stopped waiting for them.
const queueTimeout = 2 * time.Second

// sqlQueueTurn and sqlQueueLeave run a fair waiter's queue (pgfence.lease_queue_turn).
const (
	sqlQueueTurn  = `SELECT pgfence.lease_queue_turn($1, $2::uuid, $3::bigint * interval '1 microsecond')`
	sqlQueueLeave = `SELECT pgfence.lease_queue_leave($1, $2::uuid)`
	// sqlQueueLeaveWake leaves and wakes the key's other waiters, as a
	// release does (the notification is a hint: they try, the database
	// decides).
	sqlQueueLeaveWake = `SELECT pgfence.lease_queue_leave($1, $2::uuid), pg_catalog.pg_notify($3, $1)`
)

// queueTurn refreshes waiter's place in key's queue; it returns a *HeldError
// while other fair waiters are ahead. A waiter keeps its place without
// polling for longer than the longest pause between two polls of a waiting
// Acquire. It returns when ctx ends, but the statement runs on in turns
// (bounded by queueTimeout) rather than being cut: a statement cut on the
// client may still run on the server, after the waiter has left the queue.
func (c *Client) queueTurn(ctx context.Context, key, waiter string, turns *sync.WaitGroup) error {
	var ahead int64
	patience := 2*max(c.cfg.PollInterval, c.cfg.BackoffMax) + time.Second
	done := make(chan error, 1)
	turns.Go(func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queueTimeout)
		defer cancel()
		done <- c.exec(tctx, []any{&ahead}, driver.Stmt{SQL: sqlQueueTurn, Args: []any{key, waiter, patience.Microseconds()}})
	})
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("leases: acquire %q: %w", key, context.Cause(ctx))
	case err != nil:
		return fmt.Errorf("leases: acquire %q: queue: %w", key, err)
	case ahead > 0:
		return &HeldError{Key: key}
	}
	return nil
}

// leaveQueue removes a fair waiter from key's queue, granted or not. If it
// fails, the row expires after the queue patience. A waiter that gives up at
// the head of the queue wakes the others (locally and through
// notifyChannel): the next one may find the key free, and would otherwise
// sleep until its next poll, as no release is coming to wake it.
func (c *Client) leaveQueue(ctx context.Context, key, waiter string, gaveUpAtHead bool) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queueTimeout)
	defer cancel()
	if !gaveUpAtHead {
		_, _ = c.pool.Exec(lctx, sqlQueueLeave, key, waiter)
		return
	}
	_, _ = c.pool.Exec(lctx, sqlQueueLeaveWake, key, waiter, notifyChannel)
	c.wake(key)
}
