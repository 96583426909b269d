package election

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// backoff is the pause before the attempt after n failures in a row: full
// jitter, from 10 ms up to the renewal interval.
func (e *Election) backoff(n int) time.Duration {
	d := 10 * time.Millisecond
	for ; n > 1 && d < e.cfg.RenewInterval; n-- {
		d *= 2
	}
	return rand.N(min(d, e.cfg.RenewInterval) + 1)
}

// Run takes part in the election until ctx ends: it campaigns, and while
// this replica leads it keeps the term's lease alive and runs
// OnStartedLeading; when the term ends (resigned or lost) it waits for
// OnStartedLeading to return, releases the lease, calls OnStoppedLeading and
// campaigns again. Every change of leadership it observes goes to OnLeader.
// When ctx ends it resigns (the same way) and returns nil: a stop asked for
// is not a failure. It returns earlier only with an error no retry can fix
// ([pgfence.ErrNotGranted], [pgfence.ErrInvalid], [leases.ErrClosed]).
//
// Followers send nothing while the leader is healthy and wake-ups work (an
// election without a leader is read every [Config.PollInterval]): they read the election when
// a term ends or a new one is announced, and when the leader's lease runs
// out by the expiry its announced renewals gave. A leader that dies is
// replaced right after its lease expires by the database clock; one that
// resigns at once.
func (e *Election) Run(ctx context.Context) error {
	e.mu.Lock()
	if e.running {
		e.mu.Unlock()
		return ErrRunning
	}
	e.running, e.health = true, nil
	select {
	case <-e.resign: // a Resign that came when nobody led
	default:
	}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running, e.watch = false, nil
		e.mu.Unlock()
	}()

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w, err := e.client.Watch(wctx, e.key, &leases.WatchOptions{PollInterval: e.cfg.PollInterval})
	switch {
	case err != nil && ctx.Err() != nil:
		return nil // stopped before it began
	case err != nil:
		return fmt.Errorf("election %q: %w", e.key, err)
	}
	e.mu.Lock()
	e.watch = w
	e.mu.Unlock()
	r := &runner{e: e, w: w, tryAt: time.Now()}
	err = r.loop(ctx)
	// This replica resigns (its context ended, or the client was closed):
	// its term ends before OnStartedLeading is waited for.
	r.stepDown(ctx, fmt.Errorf("%w: %w", ErrResigned, cmp.Or(context.Cause(ctx), leases.ErrClosed)))
	if r.campaign != nil { // a campaign still runs: stop it, and release a lease it won meanwhile
		r.stopCampaign()
		if c := <-r.campaign; c.l != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leases.ReleaseTimeoutDefault)
			_ = c.l.Release(rctx)
			cancel()
		}
	}
	stopWatch()
	for range w.Events() {
	}
	return err
}

// runner is the state of one Run.
type runner struct {
	e        *Election
	w        *leases.Watcher
	leader   Leader        // as observed
	term     *Term         // this replica's, while it leads
	cbDone   chan struct{} // closed when OnStartedLeading returned
	tryAt    time.Time     // when to make the next attempt; zero: on the next vacancy
	holdOff  time.Time     // after a resignation: no attempt before, unless another leader was elected
	lastTerm int64         // the token of this replica's latest term (0: none yet)
	failures int           // failed attempts in a row
	// campaign receives the end of a campaign while one runs; nil
	// otherwise.
	campaign     chan campaign
	stopCampaign context.CancelFunc
}

// campaign is how a campaign ended: elected (l), or why not.
type campaign struct {
	l   *leases.Lease
	err error
}

func (r *runner) loop(ctx context.Context) error {
	e := r.e
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.maybeAttempt(ctx)
		var termDone <-chan struct{}
		if r.term != nil {
			termDone = r.term.ctx.Done()
		}
		timer.Reset(r.nextWake())
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-r.w.Events():
			if !ok { // the watch ends with ctx (the watcher may see it first) or with the client
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("election %q: %w", e.key, leases.ErrClosed)
			}
			r.observe(ev)
		case c := <-r.campaign:
			r.campaign = nil
			r.stopCampaign()
			if err := r.attempted(ctx, c.l, c.err); err != nil {
				return err
			}
		case <-termDone:
			r.stepDown(ctx, nil)
		case <-e.resign:
			if r.term != nil {
				r.term.cancel(fmt.Errorf("%w (term %d)", ErrResigned, r.term.Token()))
			}
		case <-timer.C:
		}
	}
}

// nextWake is how long the loop may sleep without a wake-up.
func (r *runner) nextWake() time.Duration {
	if r.term != nil || r.campaign != nil || r.tryAt.IsZero() {
		return time.Hour
	}
	return max(time.Until(r.tryAt), time.Until(r.holdOff), 0)
}

// maybeAttempt campaigns when an attempt is due: in a goroutine, whose
// end the loop receives, one grant attempt, or with Fair a waiting Acquire
// in the database's queue of candidates.
func (r *runner) maybeAttempt(ctx context.Context) {
	e := r.e
	now := time.Now()
	if r.term != nil || r.campaign != nil || r.tryAt.IsZero() || now.Before(r.tryAt) || now.Before(r.holdOff) || ctx.Err() != nil {
		return
	}
	r.tryAt = time.Time{}
	cctx, cancel := context.WithCancel(ctx)
	r.campaign, r.stopCampaign = make(chan campaign, 1), cancel
	go func(ch chan campaign) {
		l, err := e.client.Acquire(cctx, e.key, e.cfg.TTL, &e.cfg.AcquireOptions)
		ch <- campaign{l, err}
	}(r.campaign)
}

// attempted takes in the end of a campaign: this replica leads (l), the
// election is led by someone else, or an error: transient ones
// (unreachable, outcome unknown, grants paused, not a primary) are retried
// with backoff; others are final.
func (r *runner) attempted(ctx context.Context, l *leases.Lease, err error) error {
	e := r.e
	switch {
	case l == nil && ctx.Err() != nil:
		return nil
	case errors.Is(err, pgfence.ErrUnavailable), errors.Is(err, pgfence.ErrOutcomeUnknown),
		errors.Is(err, pgfence.ErrGrantsPaused), errors.Is(err, pgfence.ErrNotPrimary):
		r.failures++
		r.tryAt = time.Now().Add(e.backoff(r.failures))
		e.setHealth(fmt.Errorf("election %q: campaign: %w", e.key, err))
		e.cfg.Logger.Warn("pgfence election: attempt failed; retrying", "key", e.key, "err", err)
		return nil
	case err != nil && !errors.Is(err, pgfence.ErrLeaseHeld):
		return fmt.Errorf("election %q: campaign: %w", e.key, err)
	}
	r.failures = 0
	e.setHealth(nil)
	if l == nil {
		return nil // held: the leader's end is announced, or read at its expiry
	}
	t := newTerm(l)
	e.mu.Lock()
	e.term = t
	e.mu.Unlock()
	e.cfg.Logger.Info("pgfence election: elected", "key", e.key, "term", l.Token(), "holder", l.Holder())
	r.term, r.cbDone, r.lastTerm = t, make(chan struct{}), t.Token()
	go func(done chan struct{}) {
		defer close(done)
		if e.cfg.OnStartedLeading != nil {
			e.cfg.OnStartedLeading(t.ctx, t)
		}
	}(r.cbDone)
	return nil
}

// observe takes in one event of the election's key.
func (r *runner) observe(ev leases.Event) {
	e := r.e
	if next, changed := r.leader.apply(ev); changed {
		r.leader = next
		if e.cfg.OnLeader != nil {
			e.cfg.OnLeader(next)
		}
	}
	switch {
	case ev.Granted() && ev.Token > r.lastTerm:
		// Someone else leads: the next vacancy is fair game, and a fair
		// candidate queues behind those who waited. (The grant of this
		// replica's own term may be seen after that term ended: it does
		// not lift the hold-off of its resignation.)
		r.holdOff = time.Time{}
		if e.cfg.Fair && r.term == nil {
			r.tryAt = time.Now()
		}
	case (ev.Ended() || ev.Kind == "gap") && r.term == nil: // a vacancy, or events missed
		r.tryAt = time.Now()
	}
}

// stepDown ends this replica's term, if it has one: it ends the term's
// context with cause (when the term has not ended by itself), waits for
// OnStartedLeading to return, releases the lease and calls
// OnStoppedLeading. After a resignation it holds back from the next
// campaign for a TTL, unless another leader is elected first.
func (r *runner) stepDown(ctx context.Context, cause error) {
	t := r.term
	if t == nil {
		return
	}
	e := r.e
	if cause != nil {
		t.cancel(cause)
	}
	<-r.cbDone
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leases.ReleaseTimeoutDefault)
	err := t.lease.Release(rctx)
	cancel()
	why := context.Cause(t.ctx)
	if errors.Is(err, pgfence.ErrLeaseLost) && !errors.Is(why, ErrResigned) {
		err = nil // lost before: the term already says so
	}
	e.cfg.Logger.Info("pgfence election: term ended", "key", e.key, "term", t.Token(), "why", why, "release", err)
	e.mu.Lock()
	if e.term == t {
		e.term = nil
	}
	select {
	case <-e.resign: // a resignation of the term that has just ended
	default:
	}
	e.mu.Unlock()
	r.term, r.cbDone, r.tryAt = nil, nil, time.Time{}
	if e.cfg.OnStoppedLeading != nil {
		e.cfg.OnStoppedLeading(t, why)
	}
	t.releaseErr = err
	close(t.stepped)
	// Lost: campaign again when the lease's end is seen (its expiry by the
	// database clock, or the release above).
	if errors.Is(why, ErrResigned) {
		r.holdOff = time.Now().Add(e.cfg.TTL)
		r.tryAt = r.holdOff
	} else if err == nil {
		r.tryAt = time.Now()
	}
}

func (e *Election) setHealth(err error) {
	e.mu.Lock()
	e.health = err
	e.mu.Unlock()
}
