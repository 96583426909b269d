package leases

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The waiting Acquire calls of one client for one key queue in arrival order
// (Client.queues). Only the head polls the database and receives wake-ups,
// so a release wakes one waiter per client, not all of them, and N idle
// waiters cost the statements of one. Fair waiters (AcquireOptions.Fair) are
// the exception: each polls from its arrival, because its place in the
// database queue (pgfence.lease_waiters), shared by every client, counts
// from its first poll; one queued behind another waiter of its own client
// would get its place only after waiters of other clients that arrived later.
type waiter struct {
	turn    chan struct{}      // closed when the waiter starts polling
	wake    chan struct{}      // a release of the key was seen (buffered, 1)
	granted chan time.Duration // an announced grant of the key, its lease length (buffered, 1)
	fair    bool               // polls from its arrival (AcquireOptions.Fair)
	polling bool               // turn is closed; c.mu guards it
}

func (c *Client) enqueue(key string, fair bool) *waiter {
	w := &waiter{turn: make(chan struct{}), wake: make(chan struct{}, 1), granted: make(chan time.Duration, 1), fair: fair}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queues[key] = append(c.queues[key], w)
	handOut(c.queues[key])
	return w
}

func (c *Client) dequeue(key string, w *waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := slices.DeleteFunc(c.queues[key], func(x *waiter) bool { return x == w })
	handOut(q) // the next waiter polls now
	if c.queues[key] = q; len(q) == 0 {
		delete(c.queues, key)
	}
}

// handOut lets the first waiter of q that is not fair, and every fair
// waiter, poll. c.mu is held.
func handOut(q []*waiter) {
	head := true
	for _, w := range q {
		if (head || w.fair) && !w.polling {
			w.polling = true
			close(w.turn)
		}
		head = head && w.fair
	}
}

// pollers calls f, under c.mu, for every waiter of key (of every key when
// key is "") that polls.
func (c *Client) pollers(key string, f func(*waiter)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range ofKey(c.queues, key) {
		if w.polling {
			f(w)
		}
	}
}

// ofKey returns a copy of the entries of key in m, or of every key when key
// is "" (keys are never empty).
func ofKey[T any](m map[string][]T, key string) []T {
	if key == "" {
		return slices.Concat(slices.Collect(maps.Values(m))...)
	}
	return slices.Clone(m[key])
}

// offer sends v on ch unless ch's one-slot buffer is full: a signal already
// pending covers the new one.
func offer[T any](ch chan T, v T) {
	select {
	case ch <- v:
	default:
	}
}

// wake tells the waiters for key (every key when key is "") that poll to
// try now.
func (c *Client) wake(key string) {
	c.pollers(key, func(w *waiter) { offer(w.wake, struct{}{}) })
}

// Hold-back after a wake-up. A release wakes one waiter in every client that
// waits for the key, and all of them would try at once: N waiting clients, N
// attempts, one grant. The same happens when a holder that crashed reaches
// its expiry: every waiter's timer is set to it. Instead each waits a random
// time in [0, window] first, and one that hears the winner's grant announced
// (grantNotifyChannel) in the meantime skips its attempt. The window is per client and key, and adapts
// like Ethernet's backoff: it doubles when an attempt after a wake-up loses
// the race and halves when one wins, so it settles where about one extra
// attempt is made per hand-off; with a single waiting client it stays zero
// and costs no latency.
const (
	holdBackMin = time.Millisecond
	holdBackMax = 64 * time.Millisecond
	maxWindows  = 4096 // keys whose window a client remembers
)

// holdBack waits up to the key's window after a wake-up. It reports whether
// another waiter's grant was announced meanwhile, and that lease's length.
func (c *Client) holdBack(ctx context.Context, key string, w *waiter) (lease time.Duration, heard bool) {
	select {
	case <-w.granted: // announced before this wake-up: stale
	default:
	}
	c.mu.Lock()
	window := c.windows[key]
	c.mu.Unlock()
	if window <= 0 {
		return 0, false
	}
	t := time.NewTimer(fullJitter(window))
	defer t.Stop()
	select {
	case lease := <-w.granted:
		return lease, true
	case <-ctx.Done():
	case <-c.lifetime.Done():
	case <-t.C:
	}
	return 0, false
}

// adapt updates key's hold-back window after an attempt that followed a
// wake-up: it won the key, or lost it to another waiter.
func (c *Client) adapt(key string, won bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w, known := c.windows[key]
	if won {
		if w /= 2; w < holdBackMin {
			delete(c.windows, key)
			return
		}
	} else {
		w = min(max(2*w, holdBackMin), holdBackMax)
	}
	if !known && len(c.windows) >= maxWindows {
		for k := range c.windows { // forget one other key
			delete(c.windows, k)
			break
		}
	}
	c.windows[key] = w
}

// wakeAll wakes the waiters that poll and the watchers of every key:
// notifications may have been missed (the LISTEN connection was down), or
// grants were resumed.
func (c *Client) wakeAll() {
	c.wake("")
	c.watching("", (*Watcher).wake)
	c.wakeTasks("")
}

// delay is how long the head waiter sleeps after its attempt-th failed try.
// remaining is the holder's time left (0 when unknown). atExpiry reports that
// the sleep ends at the holder's expiry, when every waiting client tries.
func (c *Client) delay(attempt int, remaining time.Duration) (d time.Duration, atExpiry bool) {
	if c.listenUp.Load() {
		// Releases are announced: poll rarely, as a safety net.
		d = c.cfg.PollInterval/2 + fullJitter(c.cfg.PollInterval/2)
	} else {
		d = fullJitter(capped(c.cfg.BackoffMin, attempt, c.cfg.BackoffMax))
	}
	if remaining > 0 {
		// Expiry is not announced: be there when it comes.
		if e := remaining + fullJitter(c.cfg.BackoffMin); e < d {
			d, atExpiry = e, true
		}
	}
	return max(d, time.Millisecond), atExpiry
}

// fullJitter returns a random duration in [0, d].
func fullJitter(d time.Duration) time.Duration { return rand.N(max(d, 0) + 1) }

// sleepCtx sleeps for d, or returns false when ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// dispatch hands a notification to the waiters it concerns.
func (c *Client) dispatch(channel, payload string) {
	switch channel {
	case notifyChannel:
		// A key, or "" when grants were resumed: then every key (as for
		// wakeAll; keys are never empty).
		c.wake(payload)
		c.watching(payload, (*Watcher).wake)
	case grantNotifyChannel:
		micros, key, ok := strings.Cut(payload, ":")
		if !ok {
			return
		}
		if n, err := strconv.ParseInt(micros, 10, 64); err == nil && n > 0 {
			c.pollers(key, func(w *waiter) { offer(w.granted, time.Duration(n)*time.Microsecond) })
		}
		c.watching(key, (*Watcher).wake)
	case changeNotifyChannel:
		c.dispatchChange(payload)
	case taskNotifyChannel:
		c.wakeTasks(payload)
	}
}

// startListener starts the client's dedicated LISTEN connection, once. It
// reconnects with backoff until the client closes; while it is down,
// waiters and watchers poll.
func (c *Client) startListener() {
	if c.cfg.DisableWakeups {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.listening && !c.isClosed() { // under c.mu, as in background
		c.listening = true
		c.bg.Go(func() { c.listen(c.lifetime) })
	}
}

const (
	listenerPing       = 15 * time.Second // idle time after which the LISTEN connection is checked
	listenerBackoffMax = 5 * time.Second
)

func (c *Client) listen(ctx context.Context) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		err := c.listenOnce(ctx)
		if c.listenUp.Swap(false) { // it was connected: retry from the shortest delay
			attempt = 0
		}
		if ctx.Err() != nil {
			return
		}
		c.emit(event{Kind: eventListenerDown, Err: err})
		c.wakeAll() // waiters and watchers go back to short polling
		if !sleepCtx(ctx, c.listenerDelay(attempt)) {
			return
		}
	}
}

// listenerDelay is how long the LISTEN connection waits before its
// attempt-th reconnect.
func (c *Client) listenerDelay(attempt int) time.Duration {
	return fullJitter(capped(c.cfg.BackoffMin, attempt, listenerBackoffMax))
}

// capped is min(limit, base·2ⁿ), without overflowing: a long base (BackoffMin
// may be up to MaxTTLLimit) shifted left wraps around to a negative or tiny
// delay.
func capped(base time.Duration, n int, limit time.Duration) time.Duration {
	d := min(base, limit)
	for ; n > 0 && d < limit; n-- {
		d = min(2*d, limit) // d < limit <= MaxTTLLimit: 2*d does not overflow
	}
	return d
}

// listenOnce connects, listens and dispatches notifications until the
// connection fails or ctx ends. listenUp is set while it listens.
func (c *Client) listenOnce(ctx context.Context) error {
	cfg := c.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = listenerApplicationName
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, sqlListen); err != nil {
		return err
	}
	c.listenUp.Store(true)
	c.emit(event{Kind: eventListenerUp})
	c.wakeAll() // releases may have been missed before LISTEN
	for {
		wctx, cancel := context.WithTimeout(ctx, listenerPing)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err == nil {
			c.dispatch(n.Channel, n.Payload)
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed() {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = conn.Ping(pctx)
			cancel()
			if err == nil {
				continue
			}
		}
		return err
	}
}
