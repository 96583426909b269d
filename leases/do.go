package leases

import (
	"cmp"
	"context"
	"errors"
	"time"
)

// Do runs fn under the lease on key for ttl: it gets the lease (waiting like
// [Client.Acquire], or one attempt with [AcquireOptions.TryOnce]), which is
// kept alive while fn runs (see [AcquireOptions]), cancels fn's context the
// moment the lease ends, and releases it when fn returns. A nil opts uses the
// defaults; MaxHold defaults to [MaxHoldDefault] (one hour): work that may
// run longer must raise it, or it loses its lease with [ErrMaxHold] then.
// NoKeepAlive is refused: fn would lose its lease after one TTL.
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
//     the local trust window ran out, the keep-alive gave up after
//     MaxFailures failures), MaxHold reached ([ErrMaxHold]), or released by fn
//     itself ([ErrReleased]). [context.Cause] says which.
//   - The release after fn returns is bounded by [ReleaseTimeoutDefault],
//     not by ctx: it runs when ctx has ended too.
//
// Do returns fn's error, else the lease's error if it ended before fn
// returned (wrapping [pgfence.ErrLeaseLost] when it was lost, [ErrMaxHold]
// when MaxHold ended it; the message names the limit), else the release's
// error. When the lease could not be had, it returns the error of
// [Client.Acquire] (a [*HeldError] with TryOnce when the key is held). fn may
// release the lease itself ([Lease.Release]) to free the key early: that ends
// it as released, not lost. If fn panics, Do releases the lease before the
// panic continues.
func (c *Client) Do(ctx context.Context, key string, ttl time.Duration, opts *AcquireOptions, fn func(ctx context.Context, l *Lease) error) (err error) {
	if fn == nil {
		return invalid("fn", "must not be nil")
	}
	if opts != nil && opts.NoKeepAlive {
		return invalid("AcquireOptions.NoKeepAlive", "Do keeps the lease alive while fn runs")
	}
	l, err := c.Acquire(ctx, key, ttl, opts)
	if err != nil {
		return err
	}
	fnCtx, cancelFn := context.WithCancelCause(ctx)
	stopWatch := context.AfterFunc(l.ctx, func() { cancelFn(context.Cause(l.ctx)) })
	// Also when fn panics (or calls runtime.Goexit): the lease is not left
	// held, and the panic goes on.
	defer func() {
		stopWatch()
		lostErr := l.Err()
		if errors.Is(lostErr, ErrReleased) {
			lostErr = nil // fn released the lease: not lost
		}
		cancelFn(nil)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeoutDefault)
		defer cancel()
		relErr := l.Release(rctx)
		if err == nil {
			err = cmp.Or(lostErr, relErr)
		}
	}()
	return fn(fnCtx, l)
}
