package leases

import (
	"math"
	"time"
)

// NoMaxHold, as [KeepAliveOptions.MaxHold] or [HoldOptions.MaxHold], lets
// keep-alive renew a lease for as long as its context lives: for an elected
// leader, whose term should last until it resigns or fails.
const NoMaxHold = time.Duration(math.MaxInt64)

// HoldOptions says how a lease is taken and kept by the helpers that hold one
// for the caller: [Client.Do], an election (package
// github.com/pgfence/pgfence/leases/election) and a job runner (package
// github.com/pgfence/pgfence/leases/job). Each helper's documentation says
// which fields apply to it and its defaults; the others are refused with
// [ErrInvalid] naming the field. A nil *HoldOptions uses the defaults.
type HoldOptions struct {
	// TryOnce makes one attempt instead of waiting: when another holder has
	// the lease, the helper returns at once with an error wrapping
	// [ErrLeaseHeld] (a [*HeldError]) and runs nothing. Skip-if-held.
	TryOnce bool
	// MaxWait bounds the wait for the lease on its own: the helper gives up
	// waiting after MaxWait (the error wraps [context.DeadlineExceeded] and
	// the last attempt's error), whatever is left of its context's deadline,
	// and the work under the lease is not bounded by it. Zero: wait as long
	// as the context lives. It must not be negative.
	MaxWait time.Duration
	// Fair waits in arrival order with the waiters of every client and
	// process ([AcquireOptions.Fair]).
	Fair bool
	// HolderInfo describes the holder in the lease row and in the grant's
	// event (at most [MaxHolderInfoBytes]). Default: [Config.HolderInfo].
	HolderInfo string
	// Announce makes the grant notify pgfence_lease_granted and every
	// renewal notify pgfence_lease_changed ([AcquireOptions.Announce],
	// [KeepAliveOptions.Announce]), so that watchers ([Client.Watch]) see the
	// grant at once and wait for the lease's new expiry instead of polling.
	Announce bool
	// RenewInterval is the time between two renewals
	// ([KeepAliveOptions.Interval]). Default: the TTL /
	// [RenewFractionDefault]. It must be below the TTL minus the safety
	// margin.
	RenewInterval time.Duration
	// MaxHold is the longest the lease is kept alive, counted from the grant
	// ([KeepAliveOptions.MaxHold]); then the lease's context ends with
	// [ErrMaxHold] and the work is cancelled. Default: [MaxHoldDefault] (one
	// hour), except where a helper says otherwise; [NoMaxHold] for no limit.
	// Work that may run longer must raise it.
	MaxHold time.Duration
	// MaxFailures is how many renewals in a row may fail before keep-alive
	// gives up ([KeepAliveOptions.MaxFailures]). Default
	// [MaxFailuresDefault].
	MaxFailures int
}

// AcquireOptions returns the options of the grant: MaxWait, HolderInfo, Fair
// and Announce.
func (o *HoldOptions) AcquireOptions() *AcquireOptions {
	if o == nil {
		return nil
	}
	return &AcquireOptions{MaxWait: o.MaxWait, HolderInfo: o.HolderInfo, Fair: o.Fair, Announce: o.Announce}
}

// KeepAliveOptions returns the options of the keep-alive: RenewInterval,
// MaxHold, MaxFailures and Announce.
func (o *HoldOptions) KeepAliveOptions() *KeepAliveOptions {
	if o == nil {
		return nil
	}
	return &KeepAliveOptions{Interval: o.RenewInterval, MaxHold: o.MaxHold, MaxFailures: o.MaxFailures, Announce: o.Announce}
}

// validate checks the fields the grant and the keep-alive check later, before
// anything is sent, for helpers that do both.
func (o *HoldOptions) validate() error {
	if o == nil {
		return nil
	}
	switch {
	case o.MaxWait < 0:
		return invalid("HoldOptions.MaxWait", "must not be negative, got %s", o.MaxWait)
	case o.RenewInterval < 0:
		return invalid("HoldOptions.RenewInterval", "must not be negative, got %s", o.RenewInterval)
	case o.RenewInterval > 0 && o.RenewInterval < MinInterval:
		return invalid("HoldOptions.RenewInterval", "must be at least %s (0 for the default), got %s", MinInterval, o.RenewInterval)
	case o.MaxHold < 0:
		return invalid("HoldOptions.MaxHold", "must not be negative, got %s", o.MaxHold)
	case o.MaxFailures < 0:
		return invalid("HoldOptions.MaxFailures", "must not be negative, got %d", o.MaxFailures)
	case o.TryOnce && o.MaxWait > 0:
		return invalid("HoldOptions.MaxWait", "has no effect with TryOnce (which never waits), got %s", o.MaxWait)
	case o.TryOnce && o.Fair:
		return invalid("HoldOptions.Fair", "has no effect with TryOnce (which never waits in the queue)")
	case len(o.HolderInfo) > MaxHolderInfoBytes:
		return invalid("HoldOptions.HolderInfo", "must be at most %d bytes, got %d", MaxHolderInfoBytes, len(o.HolderInfo))
	}
	return validText("HoldOptions.HolderInfo", o.HolderInfo)
}

// Validate checks o as a helper would before sending anything: the error
// wraps [ErrInvalid] and names the field. A nil *HoldOptions is valid.
func (o *HoldOptions) Validate() error { return o.validate() }
