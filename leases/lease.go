package leases

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence"
)

// Lease is one grant: a key held by a fresh holder id with a fencing token. Its
// [Lease.Context] ends when the lease is released, lost, or when the local trust
// window (the last successful grant or renewal's send time + TTL − safety
// margin, by the local monotonic clock) runs out, whichever comes first. Work
// done under the lease should run under that context and carry [Lease.Token]
// to the resource it protects. Its methods are safe for concurrent use.
type Lease struct {
	c      *Client
	key    string
	holder string
	token  int64
	ttl    time.Duration
	margin time.Duration
	start  time.Time // local monotonic send time of the grant

	ctx    context.Context
	cancel context.CancelCauseFunc // only endQuietly calls it, under mu: ctx has ended once it did
	// releaseAsked: Release was called. Until a release is confirmed, the
	// lease may still be held (the release was not sent or its outcome is
	// unknown): the keep-alive no longer renews it, and its trust window runs out.
	releaseAsked atomic.Bool
	relSem       chan struct{} // one Release at a time
	// releaseSent: a release of this lease was sent and its reply lost, so it
	// may have committed. Without it, a release that finds the grant already
	// released knows someone else ended it. Only Release (under relSem)
	// touches it.
	releaseSent bool

	mu         sync.Mutex
	expiresAt  time.Time   // database clock, last known
	trustUntil time.Time   // local monotonic
	timer      *time.Timer // ends the lease at trustUntil
	released   bool        // a Release call got a conclusive answer ...
	releaseErr error       // ... and returned this (later calls return it too)
}

func (c *Client) newLease(key, holder string, token int64, ttl, margin time.Duration, start, expiresAt time.Time) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	l := &Lease{c: c, key: key, holder: holder, token: token, ttl: ttl, margin: margin, start: start, ctx: ctx, cancel: cancel,
		expiresAt: expiresAt, trustUntil: start.Add(ttl - margin), relSem: make(chan struct{}, 1)}
	l.mu.Lock()
	l.timer = time.AfterFunc(c.until(l.trustUntil), l.trustExpired)
	l.mu.Unlock()
	return l
}

// Key is the lease's key.
func (l *Lease) Key() string { return l.key }

// Holder is the random id of this grant (a UUID), needed to renew or release it.
func (l *Lease) Holder() string { return l.holder }

// Token is the fencing token of this grant: it is larger than every token
// issued for the key before. Pass it to the resource the lease protects.
func (l *Lease) Token() int64 { return l.token }

// ExpiresAt is the expiry by the database clock as of the last grant or
// renewal this client saw commit. Compare it only with database times.
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// Context ends when the lease is released, lost or its trust window runs out.
// [context.Cause] (or [Lease.Err]) says which. Work under the lease must
// stop when its Done channel is closed.
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease is held. Afterwards it is [ErrReleased] after a
// confirmed Release, [ErrMaxHold] when keep-alive reached its limit, and
// otherwise an error wrapping [pgfence.ErrLeaseLost] that says why. It reads the
// clock: once the local trust window has run out it ends the lease (if the
// timer that does so has not run yet, say right after the process was
// paused) and returns the error, so a nil Err means the lease was trusted at
// the moment of the call.
func (l *Lease) Err() error {
	if l.ctx.Err() == nil && l.c.until(l.trustDeadline()) <= 0 {
		l.trustExpired()
	}
	return context.Cause(l.ctx) // nil while the context lives
}

func (l *Lease) trustExpired() {
	awaited := "renewal"
	if l.releaseAsked.Load() {
		awaited = "release"
	}
	l.end(l.lostError("the local trust window ran out before a "+awaited+" was confirmed", nil))
}

func (l *Lease) trustDeadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.trustUntil
}

// end ends the lease's context with cause (once), and reports it.
func (l *Lease) end(cause error) {
	if l.endQuietly(cause) {
		l.reportEnd(cause)
	}
}

// endQuietly ends the lease's context with cause, and reports whether this
// call ended it; reportEnd must follow when it did.
func (l *Lease) endQuietly(cause error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil { // only this cancels it, under l.mu
		return false
	}
	l.timer.Stop()
	l.cancel(cause)
	return true
}

// reportEnd records the lease's end in the metrics and, unless it was
// released, emits eventLost.
func (l *Lease) reportEnd(cause error) {
	l.c.tel.ended(l, cause)
	if !errors.Is(cause, ErrReleased) {
		l.c.emit(event{Kind: eventLost, Key: l.key, Holder: l.holder, Token: l.token, Err: cause})
	}
}

// refused handles the database's refusal (PF002, in err) of a call of the lease
// (what) because the grant had ended: the lease is lost, unless the holder's
// own Release, running meanwhile (say, with the keep-alive's renewal sent
// just after it committed), ended it; then the lease ends as released.
func (l *Lease) refused(ctx context.Context, what string, err error) error {
	if l.releaseAsked.Load() && l.releasedBy(ctx, false, false) == nil {
		l.end(ErrReleased)
		return l.Err()
	}
	lost := l.lostError("the database refused "+what, pgerr.PgError(err))
	l.end(lost)
	return lost
}

// Renew extends the lease to the database's clock_timestamp() + TTL, if this
// grant still holds it and it has not expired. When the database refuses
// because the grant no longer holds the key (PF002), the lease is lost: its
// context ends and the error wraps [pgfence.ErrLeaseLost]; but
// once [Lease.Release] has been called, a refusal because the grant was
// released with its holder id and token (by that Release, running meanwhile)
// ends the lease as released and returns [ErrReleased]. Other
// failures ([pgfence.ErrUnavailable], [pgfence.ErrOutcomeUnknown], [pgfence.ErrNotGranted] after the
// role's prefix was revoked, [pgfence.ErrNotPrimary] on a standby, or the context's
// error when ctx ended before the renewal was sent) leave the lease as it
// was; its trust window still runs from the last confirmed renewal.
func (l *Lease) Renew(ctx context.Context) (err error) {
	return l.renew(ctx, false)
}

// renew is Renew; announce sends the renewal's notification on
// changeNotifyChannel in the same statement.
func (l *Lease) renew(ctx context.Context, announce bool) (err error) {
	ctx, done := l.c.tel.startRenew(ctx, l)
	defer func() { done(err) }()
	if err := l.Err(); err != nil {
		return err
	}
	sql := sqlRenew
	if announce {
		sql = sqlRenewAnnounced
	}
	start := l.c.now()
	var expiresAt time.Time
	err = l.c.exec(ctx, []any{&expiresAt}, driver.Stmt{SQL: sql, Args: []any{l.key, l.holder, l.token, l.ttl.Microseconds()}})
	if pgerr.Code(err) == pgerr.CodeLeaseNotHeld {
		return l.refused(ctx, "the renewal", err)
	}
	if err != nil {
		err = fmt.Errorf("leases: renew %s: %w", l.id(), err)
		l.c.emit(event{Kind: eventRenewFailed, Key: l.key, Holder: l.holder, Token: l.token, Err: err})
		return err
	}
	l.mu.Lock()
	ended := l.ctx.Err() != nil
	if !ended {
		l.expiresAt = expiresAt
		if trust := start.Add(l.ttl - l.margin); trust.After(l.trustUntil) {
			l.trustUntil = trust
			l.timer.Reset(l.c.until(trust))
		}
	}
	l.mu.Unlock()
	if ended {
		return l.Err()
	}
	l.c.emit(event{Kind: eventRenewed, Key: l.key, Holder: l.holder, Token: l.token})
	return nil
}

// SetHolderInfo replaces the lease's holder description (the value
// [Status.HolderInfo] and [Client.Watch] show) while the grant is live: an
// elected leader publishes its address or state this way. It commits
// durably, records an info_changed event in the key's history (one per
// grant: a later change replaces the grant's earlier one) and announces it
// on pgfence_lease_changed; it returns the change's time by the database
// clock. info is at most [MaxHolderInfoBytes] of UTF-8 without NUL.
//
// When the database refuses because the grant is no longer live (it
// expired, was taken over or force-released), the lease is lost: its context
// ends and the error wraps [pgfence.ErrLeaseLost]. When the holder's own Release,
// running at the same time, ended it first, the error is [ErrReleased] and
// the lease is released, not lost. Other failures ([pgfence.ErrUnavailable],
// [pgfence.ErrOutcomeUnknown], the context's error) leave the lease as it was.
func (l *Lease) SetHolderInfo(ctx context.Context, info string) (time.Time, error) {
	if err := checkText("info", info, MaxHolderInfoBytes, false); err != nil {
		return time.Time{}, err
	}
	if err := l.Err(); err != nil {
		return time.Time{}, err
	}
	var at time.Time
	err := l.c.exec(ctx, []any{&at}, driver.Stmt{SQL: sqlSetHolderInfo, Args: []any{l.key, l.holder, l.token, info}})
	if pgerr.Code(err) == pgerr.CodeLeaseNotHeld {
		return time.Time{}, l.refused(ctx, "to change the holder info", err)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("leases: set holder info of %s: %w", l.id(), err)
	}
	return at, nil
}

// id names the lease in errors.
func (l *Lease) id() string { return fmt.Sprintf("%q (holder %s, token %d)", l.key, l.holder, l.token) }

// Release ends the grant and ends the lease's context with [ErrReleased]. It
// never frees another holder's grant and is idempotent: releasing twice (or
// concurrently), or retrying after a lost reply, returns nil; once a release
// got an answer, later calls return the same result. When the lease had
// already expired, been taken over or been force-released before the release,
// the error wraps [pgfence.ErrLeaseLost] (work done under it may not have been
// protected to the end) and so does the lease's context's cause. It retries a
// lost reply at most twice within ctx. When it finds the grant already
// released, or after a lost reply the key granted to another holder, the
// lease's history says how the grant ended: released with the grant's holder
// id and token (an earlier attempt whose reply was lost, or another client
// acting for the holder: nil) or by an operator's force-release
// ([pgfence.ErrLeaseLost]).
//
// When the release was not sent ([pgfence.ErrUnavailable], or the context's error) or
// its outcome stays unknown ([pgfence.ErrOutcomeUnknown]), the lease may still be
// held: it is not ended as released. Its context stays open until its trust
// window runs out (then it ends with an [pgfence.ErrLeaseLost] error), or until a
// later Release is confirmed; call Release again to free the key before its
// TTL. The keep-alive no longer renews a lease whose holder called Release.
func (l *Lease) Release(ctx context.Context) (err error) {
	l.releaseAsked.Store(true)
	// One release at a time: a call that finds the grant released by another
	// call of this lease would otherwise take it for an operator's doing.
	select {
	case l.relSem <- struct{}{}:
	case <-ctx.Done():
		if released, result := l.releaseResult(); released {
			return result
		}
		return fmt.Errorf("leases: release %s: %w", l.id(), context.Cause(ctx))
	}
	// Let go of it before the lease's end and the events reach the
	// client's logger.
	unlock := sync.OnceFunc(func() { <-l.relSem })
	defer unlock()
	if released, result := l.releaseResult(); released {
		return result
	}
	var (
		changed bool
		status  string
	)
	ctx, done := l.c.tel.startRelease(ctx, l)
	defer func() { done(status, err) }()
	release := driver.Traced(ctx, driver.Stmt{SQL: sqlRelease, Args: []any{l.key, l.holder, l.token, l.c.cfg.DurableRelease}})
	for attempt := 0; attempt < 3; attempt++ {
		changed, status = false, "" // what a failed attempt scanned does not count
		err = l.c.exec(ctx, []any{&changed, &status}, release...)
		l.releaseSent = l.releaseSent || errors.Is(err, pgfence.ErrOutcomeUnknown)
		if !errors.Is(err, pgfence.ErrUnavailable) && !errors.Is(err, pgfence.ErrOutcomeUnknown) ||
			!sleepCtx(ctx, fullJitter(l.c.cfg.BackoffMin<<attempt)) {
			break
		}
	}
	sent := l.releaseSent
	if err != nil {
		// Not sent, or the outcome is unknown: the lease may still be held
		// (until its trust window runs out), so it is not ended as released.
		if sent && !errors.Is(err, pgfence.ErrOutcomeUnknown) {
			err = fmt.Errorf("%w: the reply to an earlier attempt was lost; the last attempt: %w", pgfence.ErrOutcomeUnknown, err)
		}
		return fmt.Errorf("leases: release %s: %w", l.id(), err)
	}
	var result error
	switch {
	case status == "released":
	case status == "expired":
		result = l.lostError("the lease had expired before the release (now released)", nil)
	case status == "not_held" && !sent:
		result = l.lostError("the key was granted to another holder before the release; nothing changed", nil)
	default:
		// Already released, or (after a lost reply) granted to another
		// holder, whom a release by the lost attempt may have let in: the
		// history says whether this grant was released, and how.
		result = l.releasedBy(ctx, sent, status == "not_held")
	}
	if result == nil && sent {
		// The history confirmed the release of an earlier attempt whose
		// reply was lost: count it as what it was.
		status = outcomeReleased
	}
	cause := cmp.Or(result, ErrReleased)
	// The lease ends before a second Release waiting for the lock returns
	// this result (the grant is not held any more, whoever ended it); the
	// events go out after the lock is given up. An outcome the history
	// could not tell is not final: a later Release tries again.
	unknown := errors.Is(result, pgfence.ErrOutcomeUnknown)
	ended := l.endQuietly(cause)
	if !unknown {
		l.mu.Lock()
		l.released, l.releaseErr = true, result
		l.mu.Unlock()
	}
	unlock()
	if ended {
		l.reportEnd(cause)
	}
	if !unknown {
		if changed {
			l.c.wake(l.key) // local waiters need not wait for the notification
		}
		l.c.emit(event{Kind: eventReleased, Key: l.key, Holder: l.holder, Token: l.token})
	}
	return result
}

// releasedAfterExpiry is the reason pgfence.release records for a release of
// an expired grant (status expired).
const releasedAfterExpiry = "released after expiry"

// releaseResult reports whether a release got a conclusive answer, and the
// result it returned.
func (l *Lease) releaseResult() (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.released, l.releaseErr
}

// releasedBy interprets a release that found this grant already released,
// or (regranted) the key granted to another holder since, from the lease's
// history: nil when it was released with its holder id and token (by this
// lease's earlier attempt whose reply was lost, or by another client acting
// for the holder), an [pgfence.ErrLeaseLost] error when an operator force-released it
// or it had expired first. sent says whether an earlier release of this lease
// may have committed without its reply: when the history cannot say, that
// makes the outcome unknown (the error wraps [pgfence.ErrLeaseLost] and
// [pgfence.ErrOutcomeUnknown]); without one, someone else ended the grant.
func (l *Lease) releasedBy(ctx context.Context, sent, regranted bool) error {
	var event, reason string
	err := l.c.pool.QueryRow(ctx, sqlReleasedBy, l.key, l.holder, l.token).Scan(&event, &reason)
	switch {
	case err == nil && event == "force_released":
		return l.lostError("the grant had been force-released before the release; nothing changed", nil)
	case err == nil && reason == releasedAfterExpiry:
		return l.lostError("the lease had expired before the release (now released)", nil)
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		err = errors.New("its end is no longer in the history")
	}
	switch {
	case !sent:
		return l.lostError("the grant had been ended by someone else before the release (the history could not say how)", err)
	case regranted:
		return l.lostError("the key was granted to another holder, and whether an earlier attempt of this release (its reply was lost) had released the grant first could not be read back",
			fmt.Errorf("%w: %w", pgfence.ErrOutcomeUnknown, err))
	}
	return l.lostError("the grant is released, but whether by an earlier attempt of this release (its reply was lost) or by an operator could not be read back",
		fmt.Errorf("%w: %w", pgfence.ErrOutcomeUnknown, err))
}

// renewLoop keeps the lease alive as o says (see [AcquireOptions]): it
// renews it every o.RenewInterval, counted from the grant or the last
// renewal, until the lease ends (released or lost), o.MaxHold passes (the
// lease's context then ends with [ErrMaxHold]), o.MaxFailures renewals in a
// row fail (it ends with an [pgfence.ErrLeaseLost] error) or ctx (the
// client's lifetime) ends. No renewal attempt outlives the trust window, so
// a renewal whose outcome stays unknown ends the lease's context when the
// window runs out, before the database could grant the key to anyone else.
// Once [Lease.Release] has been called it renews no more. It returns why it
// stopped (a keepalive outcome) and the error that ended the lease, if any.
func (l *Lease) renewLoop(ctx context.Context, o AcquireOptions) (string, error) {
	untilHold := func() time.Duration { // MaxHold, counted from the grant
		if o.MaxHold == NoMaxHold {
			return NoMaxHold
		}
		return max(0, l.c.until(l.start.Add(o.MaxHold)))
	}
	// The first renewal is due one interval into the current trust window
	// (from the grant or the last renewal), not one interval after the loop
	// started: a grant whose reply came late would otherwise let the window
	// run out before its first renewal.
	next := max(0, l.c.until(l.trustDeadline().Add(o.RenewInterval-(l.ttl-l.margin))))
	timer := time.NewTimer(min(next, untilHold()))
	defer timer.Stop()
	ended := func() (string, error) {
		err := l.Err()
		if errors.Is(err, ErrReleased) {
			return outcomeReleased, nil
		}
		return endOutcome(err), err
	}
	for failures := 0; ; {
		select {
		case <-ctx.Done():
			return outcomeCanceled, nil
		case <-l.ctx.Done():
			return ended()
		case <-timer.C:
		}
		if l.releaseAsked.Load() {
			// The holder asked to give the lease up, but no release was
			// confirmed: renewing would keep it held. Wait (the timer is
			// not set again) for a confirmed release or for the trust
			// window to run out.
			continue
		}
		if untilHold() == 0 {
			err := fmt.Errorf("%w: lease %q (holder %s, token %d) kept for %s, its maximum hold (AcquireOptions.MaxHold): raise it for work that runs longer",
				ErrMaxHold, l.key, l.holder, l.token, o.MaxHold)
			l.end(err)
			return outcomeMaxHold, err
		}
		rctx, cancel := context.WithTimeout(ctx, l.c.until(l.trustDeadline()))
		err := l.renew(rctx, o.Announce)
		cancel()
		switch {
		case err == nil:
			failures, next = 0, o.RenewInterval
		case l.Err() != nil:
			return ended()
		case ctx.Err() != nil:
			return outcomeCanceled, nil
		default:
			failures++
			if failures >= o.MaxFailures {
				lost := l.lostError(fmt.Sprintf("keep-alive gave up after %d failed renewals", failures), err)
				l.end(lost)
				return outcomeFailures, lost
			}
			next = max(time.Millisecond, o.RenewInterval/4/2+fullJitter(o.RenewInterval/4/2))
		}
		timer.Reset(min(next, untilHold()))
	}
}
