package election

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgfence/pgfence/leases"
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
	lease  *leases.Lease
	ctx    context.Context
	cancel context.CancelCauseFunc
	// stepped is closed once Run has stepped down from the term (released
	// it and called OnStoppedLeading); releaseErr is the release's error.
	stepped    chan struct{}
	releaseErr error
}

// newTerm starts a term on l, which the client keeps alive until Run
// releases it. The lease's end ends the term, before the database can elect
// anyone else: the lease's context ends with its local trust window.
func newTerm(l *leases.Lease) *Term {
	ctx, cancel := context.WithCancelCause(context.Background())
	context.AfterFunc(l.Context(), func() { cancel(endCause(l.Err())) })
	return &Term{lease: l, ctx: ctx, cancel: cancel, stepped: make(chan struct{})}
}

// endCause says why a term whose lease ended with err is over: resigned
// when the lease was released, else the lease's error.
func endCause(err error) error {
	if errors.Is(err, leases.ErrReleased) {
		return fmt.Errorf("%w: %w", ErrResigned, err)
	}
	return err
}

// Key is the election's key: the resource of the leader's fenced writes.
func (t *Term) Key() string { return t.lease.Key() }

// Holder is the holder id of the term's grant.
func (t *Term) Holder() string { return t.lease.Holder() }

// Token is the term's number: the fencing token of its grant.
func (t *Term) Token() int64 { return t.lease.Token() }

// Context ends when the term ends: its leader resigned ([ErrResigned]) or
// its lease was lost (an error wrapping [pgfence.ErrLeaseLost]; by the local
// trust window, before the database can elect anyone else). [context.Cause]
// says which.
func (t *Term) Context() context.Context { return t.ctx }

// Err is nil while the term lasts, and says why it ended afterwards. It
// reads the clock ([leases.Lease.Err]): a term whose trust window has run
// out is over even if no timer has said so yet.
func (t *Term) Err() error {
	if err := t.lease.Err(); err != nil && t.ctx.Err() == nil {
		t.cancel(endCause(err))
	}
	return context.Cause(t.ctx)
}

// Proclaim publishes value (at most [leases.MaxHolderInfoBytes]) as this
// leader's, for followers ([Election.Observe], [Leader.Value]): in the
// lease's holder info, durably, announced to watchers. Once the term is
// over it fails with the term's end ([Term.Err]); a refusal by the database
// (the lease was lost) ends the term.
func (t *Term) Proclaim(ctx context.Context, value string) error {
	if err := t.Err(); err != nil {
		return fmt.Errorf("election %q: proclaim: %w", t.Key(), err)
	}
	if _, err := t.lease.SetHolderInfo(ctx, value); err != nil {
		return fmt.Errorf("election %q: proclaim: %w", t.Key(), err)
	}
	return nil
}
