package leases

import (
	"context"
	"errors"
	"time"
)

// Do runs fn under the lease on key for ttl: it gets the lease (waiting like
// [Client.Acquire], or one attempt with [HoldOptions.TryOnce]), keeps it
// alive while fn runs, cancels fn's context the moment the lease is lost, and
// releases it when fn returns. A nil opts uses the defaults. Of the
// [HoldOptions], Do uses every field; MaxHold defaults to [MaxHoldDefault]
// (one hour): work that may run longer must raise it, or it loses its lease
// with [ErrMaxHold] at that point.
//
// Which context bounds what:
//
//   - ctx bounds the whole call. While Do waits for the lease, ctx ending
//     stops the wait and fn never runs; once fn runs, ctx ending cancels
//     fn's context (with ctx's cause). A deadline on ctx is therefore a
//     deadline for the wait and the work together.
//   - opts.MaxWait bounds the wait alone: Do gives up waiting after it, and
//     fn, once started, has all that is left of ctx. To bound only the wait,
//     use MaxWait, not a deadline on ctx.
//   - fn's context also ends when the lease ends: lost (a renewal refused,
//     the local trust window ran out, keep-alive gave up after MaxFailures
//     failures), MaxHold reached ([ErrMaxHold]), or released by fn itself
//     ([ErrReleased]). [context.Cause] says which.
//   - The release after fn returns is bounded by [ReleaseTimeoutDefault],
//     not by ctx: it runs when ctx has ended too.
//
// Do returns fn's error, else the lease's error if it ended before fn
// returned (wrapping [ErrLeaseLost] when it was lost, [ErrMaxHold] when
// MaxHold ended it; the message names the limit), else the release's error. When the lease could not be had, it returns the
// error of [Client.Acquire] or, with TryOnce, of [Client.TryAcquire] (a
// [*HeldError] when the key is held). fn may release the lease itself
// ([Lease.Release]) to free the key early: that ends it as released, not
// lost. If fn panics, Do stops the keep-alive and releases the lease before
// the panic continues.
func (c *Client) Do(ctx context.Context, key string, ttl time.Duration, opts *HoldOptions, fn func(ctx context.Context, l *Lease) error) error {
	if fn == nil {
		return invalid("fn", "must not be nil")
	}
	if err := c.CheckHold(key, ttl, opts); err != nil {
		return err
	}
	var (
		l   *Lease
		err error
	)
	if opts != nil && opts.TryOnce {
		l, err = c.TryAcquire(ctx, key, ttl, opts.AcquireOptions())
	} else {
		l, err = c.Acquire(ctx, key, ttl, opts.AcquireOptions())
	}
	if err != nil {
		return err
	}
	return c.run(ctx, l, opts, fn)
}

// CheckHold reports what [Client.Do] would refuse for key, ttl and opts
// before anything is sent, including what the grant or the keep-alive would
// refuse only after the lease was granted: the key, the TTL against this
// client's [Config], the options, and a renewal interval that the TTL leaves
// no room for. The error wraps [ErrInvalid] and names the argument. Helpers
// that hold a lease later (an election, a job runner) call it when they are
// built.
func (c *Client) CheckHold(key string, ttl time.Duration, opts *HoldOptions) error {
	if err := validateKey(key); err != nil {
		return err
	}
	margin, err := c.validateTTL(ttl)
	if err != nil {
		return err
	}
	if err := opts.validate(); err != nil {
		return err
	}
	if opts != nil && opts.RenewInterval >= ttl-margin {
		return invalid("HoldOptions.RenewInterval", "must be below the TTL minus the safety margin (%s), got %s", ttl-margin, opts.RenewInterval)
	}
	return nil
}

// run runs fn under l, kept alive with opts, as Do does.
func (c *Client) run(ctx context.Context, l *Lease, opts *HoldOptions, fn func(ctx context.Context, l *Lease) error) error {
	kaCtx, stopKeepAlive := context.WithCancel(ctx)
	kaDone := make(chan struct{})
	go func() {
		defer close(kaDone)
		_ = l.KeepAlive(kaCtx, opts.KeepAliveOptions()) // its outcome shows in l.Err()
	}()
	fnCtx, cancelFn := context.WithCancelCause(ctx)
	stopWatch := context.AfterFunc(l.ctx, func() { cancelFn(context.Cause(l.ctx)) })

	var lostErr, relErr error
	finish := func() {
		stopWatch()
		if lostErr = l.Err(); errors.Is(lostErr, ErrReleased) {
			lostErr = nil // fn released the lease: not lost
		}
		stopKeepAlive()
		<-kaDone
		cancelFn(nil)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeoutDefault)
		relErr = l.Release(rctx)
		cancel()
	}
	returned := false
	defer func() {
		if !returned {
			// fn panicked (or called runtime.Goexit): do not leave the lease
			// kept alive by a leaked goroutine; the panic goes on.
			finish()
		}
	}()
	fnErr := fn(fnCtx, l)
	returned = true
	finish()
	switch {
	case fnErr != nil:
		return fnErr
	case lostErr != nil:
		return lostErr
	default:
		return relErr
	}
}
