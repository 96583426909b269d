package leases

import (
	"context"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/internal/pgerr"
)

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
