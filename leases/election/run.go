package election

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// attempt makes one grant attempt. It returns the term, or whether the
// election is led by someone else (held), or an error: transient ones
// (unreachable, outcome unknown, grants paused, not a primary) are for the
// caller to retry; others are final.
func (e *Election) attempt(ctx context.Context) (t *Term, held bool, err error) {
	l, err := e.client.TryAcquire(ctx, e.key, e.cfg.TTL, &e.cfg.AcquireOptions)
	if err != nil {
		return nil, errors.Is(err, pgfence.ErrLeaseHeld), err
	}
	t = newTerm(l)
	e.mu.Lock()
	e.term = t
	e.mu.Unlock()
	e.cfg.Logger.Info("pgfence election: elected", "key", e.key, "term", l.Token(), "holder", l.Holder())
	return t, false, nil
}

// transient reports whether a failed attempt may succeed later.
func transient(err error) bool {
	for _, e := range []error{pgfence.ErrUnavailable, pgfence.ErrOutcomeUnknown, pgfence.ErrGrantsPaused, pgfence.ErrNotPrimary} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

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

	wctx, stopWatch := context.WithCancel(ctx)
	w, err := e.client.Watch(wctx, e.key, &leases.WatchOptions{PollInterval: e.cfg.PollInterval})
	if err != nil {
		stopWatch()
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
		if ctx.Err() != nil {
			return nil // stopped before it began
		}
		return fmt.Errorf("election %q: %w", e.key, err)
	}
	e.mu.Lock()
	e.watch = w
	e.mu.Unlock()
	r := &runner{e: e, w: w, tryAt: time.Now()}
	err = r.loop(ctx)
	stopWatch()
	for range w.Events() {
	}
	e.mu.Lock()
	e.running, e.watch = false, nil
	e.mu.Unlock()
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
}

func (r *runner) loop(ctx context.Context) error {
	e := r.e
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if err := r.maybeAttempt(ctx); err != nil {
			r.stepDown(ctx, nil)
			return err
		}
		var termDone <-chan struct{}
		if r.term != nil {
			termDone = r.term.ctx.Done()
		}
		timer.Reset(r.nextWake())
		select {
		case <-ctx.Done():
			r.stepDown(ctx, fmt.Errorf("%w: %w", ErrResigned, context.Cause(ctx)))
			return nil
		case ev, ok := <-r.w.Events():
			if !ok {
				// The watch ends with ctx (the watcher may see it first) or
				// with the client: either way this replica resigns, and its
				// term must end before OnStartedLeading is waited for.
				if ctx.Err() != nil {
					r.stepDown(ctx, fmt.Errorf("%w: %w", ErrResigned, context.Cause(ctx)))
					return nil
				}
				r.stepDown(ctx, fmt.Errorf("%w: %w", ErrResigned, leases.ErrClosed))
				return fmt.Errorf("election %q: %w", e.key, leases.ErrClosed)
			}
			r.observe(ev)
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
	if r.term != nil || r.tryAt.IsZero() {
		return time.Hour
	}
	at := r.tryAt
	if r.holdOff.After(at) {
		at = r.holdOff
	}
	return max(time.Until(at), 0)
}

// maybeAttempt campaigns when an attempt is due.
func (r *runner) maybeAttempt(ctx context.Context) error {
	e := r.e
	now := time.Now()
	if r.term != nil || r.tryAt.IsZero() || now.Before(r.tryAt) || now.Before(r.holdOff) || ctx.Err() != nil {
		return nil
	}
	r.tryAt = time.Time{}
	t, held, err := e.attempt(ctx)
	switch {
	case t != nil:
		r.failures = 0
		r.term, r.cbDone, r.lastTerm = t, make(chan struct{}), t.Token()
		e.setHealth(nil)
		go func(done chan struct{}) {
			defer close(done)
			if e.cfg.OnStartedLeading != nil {
				e.cfg.OnStartedLeading(t.ctx, t)
			}
		}(r.cbDone)
		return nil
	case held:
		r.failures = 0
		e.setHealth(nil)
		return nil // the leader's end is announced, or read at its expiry
	case ctx.Err() != nil:
		return nil
	case transient(err):
		r.failures++
		r.tryAt = now.Add(e.backoff(r.failures))
		e.setHealth(fmt.Errorf("election %q: campaign: %w", e.key, err))
		e.cfg.Logger.Warn("pgfence election: attempt failed; retrying", "key", e.key, "err", err)
		return nil
	}
	return fmt.Errorf("election %q: campaign: %w", e.key, err)
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
		// Someone else leads: the next vacancy is fair game. (The grant of
		// this replica's own term may be seen after that term ended: it
		// does not lift the hold-off of its resignation.)
		r.holdOff = time.Time{}
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
	r.term, r.cbDone = nil, nil
	if e.cfg.OnStoppedLeading != nil {
		e.cfg.OnStoppedLeading(t, why)
	}
	t.releaseErr = err
	close(t.stepped)
	if errors.Is(why, ErrResigned) {
		r.holdOff = time.Now().Add(e.cfg.TTL)
		r.tryAt = r.holdOff
	} else {
		// Lost: race again when the lease's end is seen (its expiry by the
		// database clock, or the release above).
		r.tryAt = time.Time{}
		if err == nil {
			r.tryAt = time.Now()
		}
	}
}

func (e *Election) setHealth(err error) {
	e.mu.Lock()
	e.health = err
	e.mu.Unlock()
}
