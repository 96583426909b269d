package election

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// Term is one replica's leadership: the grant of the election's lease that
// made it leader. Its number is that grant's fencing token ([Term.Token]):
// pass the term as the lease of fenced writes ([pgfence.Write],
// [pgfence.Exec]), and the database refuses a write of an earlier term once
// a later term has written. Term implements pgfence.Lease.
//
// [pgfence.Write]: https://pkg.go.dev/github.com/pgfence/pgfence/pgfence#Write
// [pgfence.Exec]: https://pkg.go.dev/github.com/pgfence/pgfence/pgfence#Exec
type Term struct {
	e      *Election
	lease  *leases.Lease
	ctx    context.Context
	cancel context.CancelCauseFunc
	run    bool // a term of Run: Run releases it, after OnStartedLeading returned

	releaseMu  sync.Mutex
	releasing  bool          // a release began (guarded by releaseMu)
	released   chan struct{} // closed once the release was done (or tried)
	releaseErr error
	// stepped is closed once Run has stepped down from a term of its own
	// (released it and called OnStoppedLeading).
	stepped chan struct{}
}

// newTerm starts a term on l, which the client keeps alive until the term
// is released.
func (e *Election) newTerm(l *leases.Lease, run bool) *Term {
	ctx, cancel := context.WithCancelCause(context.Background())
	t := &Term{e: e, lease: l, ctx: ctx, cancel: cancel, run: run, released: make(chan struct{}),
		stepped: make(chan struct{})}
	// The lease's end ends the term, before the database can elect anyone
	// else: the lease's context ends with its local trust window.
	context.AfterFunc(l.Context(), func() { cancel(endCause(l.Err())) })
	return t
}

// endCause says why a term whose lease ended with err is over.
func endCause(err error) error {
	if errors.Is(err, leases.ErrReleased) {
		return fmt.Errorf("%w: %w", ErrResigned, err)
	}
	return fmt.Errorf("%w: %w", ErrLost, err)
}

// Key is the election's key: the resource of the leader's fenced writes.
func (t *Term) Key() string { return t.lease.Key() }

// Holder is the holder id of the term's grant.
func (t *Term) Holder() string { return t.lease.Holder() }

// Token is the term's number: the fencing token of its grant.
func (t *Term) Token() int64 { return t.lease.Token() }

// Lease is the term's lease.
func (t *Term) Lease() *leases.Lease { return t.lease }

// Context ends when the term ends: its leader resigned ([ErrResigned]) or
// its lease was lost ([ErrLost]; by the local trust window, before the
// database can elect anyone else). [context.Cause] says which.
func (t *Term) Context() context.Context { return t.ctx }

// Done is Context().Done().
func (t *Term) Done() <-chan struct{} { return t.ctx.Done() }

// Err is nil while the term lasts, and says why it ended afterwards. It
// reads the clock ([leases.Lease.Err]): a term whose trust window has run
// out is over even if no timer has said so yet.
func (t *Term) Err() error {
	if err := t.lease.Err(); err != nil && t.ctx.Err() == nil {
		t.cancel(endCause(err))
	}
	if t.ctx.Err() != nil {
		return context.Cause(t.ctx)
	}
	return nil
}

// Proclaim publishes value (at most [leases.MaxHolderInfoBytes]) as this
// leader's, for followers ([Election.Observe], [Leader.Value]): in the
// lease's holder info, durably, announced to watchers. It fails with
// [ErrNotLeader] once the term is over; a refusal by the database (the lease
// was lost) ends the term.
func (t *Term) Proclaim(ctx context.Context, value string) error {
	if err := t.Err(); err != nil {
		return fmt.Errorf("election %q: proclaim: %w: %w", t.Key(), ErrNotLeader, err)
	}
	if _, err := t.lease.SetHolderInfo(ctx, value); err != nil {
		return fmt.Errorf("election %q: proclaim: %w", t.Key(), err)
	}
	return nil
}

// Resign ends the term: its context ends with [ErrResigned], its keep-alive
// stops and its lease is released, so that another replica can be elected
// at once. It returns the release's error; resigning again returns the same.
//
// A term of [Election.Run] is released by Run, once OnStartedLeading has
// returned (the leader's work must stop before another replica may begin):
// Resign ends the term's context and returns nil at once, also when called
// from OnStartedLeading, and the release's outcome reaches OnStoppedLeading.
// To wait for the release, call [Election.Resign] (not from the callbacks).
func (t *Term) Resign(ctx context.Context) error {
	t.cancel(fmt.Errorf("%w (term %d)", ErrResigned, t.Token()))
	if t.run {
		select {
		case <-t.stepped:
			return t.releaseErr
		default:
			return nil // Run releases it when OnStartedLeading returns
		}
	}
	return t.release(ctx)
}

// release stops the keep-alive and releases the lease, once; a call while
// another one releases waits for it, or for its own ctx.
func (t *Term) release(ctx context.Context) error {
	t.releaseMu.Lock()
	first := !t.releasing
	t.releasing = true
	t.releaseMu.Unlock()
	if !first {
		select {
		case <-t.released:
			return t.releaseErr
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	err := t.lease.Release(ctx)
	if errors.Is(err, pgfence.ErrLeaseLost) && t.ctx.Err() != nil && !errors.Is(context.Cause(t.ctx), ErrResigned) {
		err = nil // lost before: the term already says so
	}
	t.releaseErr = err
	close(t.released)
	return err
}
