package leases

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Limits on input. The client checks them before any round trip and returns
// an [pgfence.ErrInvalid] error naming the argument and the limit; the SQL functions
// enforce the same limits for other clients (PF008, pgfence.lease_check_args),
// and a test compares the two. A TTL is at least 1 ms, and so is every poll,
// backoff, renewal and resolve interval (a shorter one would send statements
// back to back).
const (
	// MaxTTLLimit is the largest TTL the database accepts
	// (pgfence.lease_max_ttl()), and the longest interval a client accepts.
	MaxTTLLimit = 24 * time.Hour
	// MaxKeyBytes is the longest key, in bytes (not characters).
	MaxKeyBytes = 512
	// MaxHolderInfoBytes is the longest holder description, in bytes.
	MaxHolderInfoBytes = 1024

	minTTL      = time.Millisecond
	minInterval = time.Millisecond
)

// Defaults for [Config] and [AcquireOptions] fields left zero; each field's
// comment gives its own.
const (
	// MaxHoldDefault is the longest a lease is kept alive.
	MaxHoldDefault = time.Hour
	// ReleaseTimeoutDefault bounds the Release run by [Client.Do] after its
	// function returns.
	ReleaseTimeoutDefault = 5 * time.Second

	backoffMinDefault     = 10 * time.Millisecond
	backoffMaxDefault     = time.Second
	pollIntervalDefault   = 5 * time.Second
	resolveTimeoutDefault = 5 * time.Second
	renewFractionDefault  = 3
	maxFailuresDefault    = 3

	// notifyChannel is the channel pgfence.release and pgfence.force_release
	// notify, with the key as payload.
	notifyChannel = "pgfence_lease_released"
	// grantNotifyChannel is the channel an announced grant
	// ([AcquireOptions.Announce]) notifies, with the payload "<lease length
	// in microseconds>:<key>". Other clients' waiters woken by the same
	// release hear it and skip their attempt; watchers read the grant.
	grantNotifyChannel = "pgfence_lease_granted"
	// changeNotifyChannel is the channel on which a live grant announces that
	// it changed: after a renewal of a lease granted with [AcquireOptions.Announce]
	// "renewed:<remaining µs>:<token>:<expiry µs>:<tag>:<key>", signed by
	// pgfence.announce_renewal (watchers believe it only when the tag checks
	// out); "info_changed:<remaining µs>:<key>" after [Lease.SetHolderInfo].
	// Watchers move their timers to the new expiry, and read the change.
	changeNotifyChannel = "pgfence_lease_changed"
	// listenerApplicationName is the application_name of a client's LISTEN
	// connection.
	listenerApplicationName = "pgfence-leases-listener"
)

// Config configures a [Client]. A nil *Config and zero fields use the defaults.
type Config struct {
	// Logger receives one debug event per lease transition and warnings when a
	// lease is lost. Default: discard.
	Logger *slog.Logger
	// MeterProvider receives the client's metrics (see the Observability
	// section of the pgfence package's README). Default: the global otel.GetMeterProvider(),
	// a no-op until the application sets one.
	MeterProvider metric.MeterProvider
	// TracerProvider receives spans around acquire, renew and release. Default:
	// the global otel.GetTracerProvider(), a no-op until the application sets
	// one. Whatever the provider, a valid span context in a call's context has
	// its trace id stored in the lease events the call records.
	TracerProvider trace.TracerProvider

	// SafetyMargin is subtracted from a grant's or renewal's TTL, counted from
	// the moment the request was sent by the local monotonic clock, to get the
	// local trust window; the lease's context ends when it runs out. It must be
	// below half of every TTL used. Default: TTL/10.
	SafetyMargin time.Duration

	// DisableWakeups turns off the LISTEN connection; waiting Acquire calls then
	// only poll. Use it behind PgBouncer in transaction mode.
	DisableWakeups bool
	// BackoffMin is the first retry delay of a waiting Acquire (full jitter).
	// Default 10 ms.
	BackoffMin time.Duration
	// BackoffMax caps the retry delay when no notifications arrive. Default
	// 1 s.
	BackoffMax time.Duration
	// PollInterval is the safety-net poll of a waiting Acquire while
	// notifications work: a lost notification costs at most this. Default
	// 5 s.
	PollInterval time.Duration
	// ResolveTimeout bounds reading back a grant whose reply was lost. The
	// caller never waits past its own context for it: the read-back goes on in
	// the background and releases a grant the caller did not receive. Default
	// 5 s.
	ResolveTimeout time.Duration
	// DurableRelease makes releases commit with synchronous_commit = on. By
	// default they commit with synchronous_commit = off: a release lost in a
	// crash only makes the next holder wait for the lease to expire, and it
	// saves a WAL flush per release.
	DurableRelease bool
}

// deref is *p, or the zero T when p is nil: a nil *Config or options struct
// is the defaults, and a NULL column scans as the zero value.
func deref[T any](p *T) (v T) {
	if p != nil {
		v = *p
	}
	return v
}

func (c *Config) resolve() (Config, error) {
	cfg := deref(c)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Config.BackoffMin", &cfg.BackoffMin, backoffMinDefault},
		{"Config.BackoffMax", &cfg.BackoffMax, backoffMaxDefault},
		{"Config.PollInterval", &cfg.PollInterval, pollIntervalDefault},
		{"Config.ResolveTimeout", &cfg.ResolveTimeout, resolveTimeoutDefault},
	} {
		if err := checkInterval(d.name, *d.v); err != nil {
			return cfg, err
		}
		*d.v = cmp.Or(*d.v, d.def)
	}
	switch {
	case cfg.SafetyMargin < 0:
		return cfg, invalid("Config.SafetyMargin", "must not be negative, got %s", cfg.SafetyMargin)
	case cfg.SafetyMargin > (MaxTTLLimit-1)/2:
		// No TTL would exceed twice the margin (and twice a huge margin
		// overflows).
		return cfg, invalid("Config.SafetyMargin", "must be below half of MaxTTLLimit (%s), got %s", MaxTTLLimit, cfg.SafetyMargin)
	case cfg.BackoffMax < cfg.BackoffMin:
		return cfg, invalid("Config.BackoffMax", "must be at least BackoffMin (%s), got %s", cfg.BackoffMin, cfg.BackoffMax)
	}
	return cfg, nil
}

// checkInterval refuses a poll, backoff, renewal or resolve interval outside
// 1 ms to [MaxTTLLimit]; 0 (the default) passes.
func checkInterval(name string, d time.Duration) error {
	switch {
	case d < 0:
		return invalid(name, "must not be negative, got %s", d)
	case d > 0 && d < minInterval:
		return invalid(name, "must be at least %s (0 for the default), got %s", minInterval, d)
	case d > MaxTTLLimit:
		return invalid(name, "must be at most %s, got %s", MaxTTLLimit, d)
	}
	return nil
}

// AcquireOptions says how a lease is taken and kept: by [Client.Acquire],
// [Client.TryAcquire] and [Client.Do], and (embedded in their configurations)
// by an election and a job runner. A nil *AcquireOptions uses the defaults.
//
// A granted lease is kept alive in the background: renewed every
// RenewInterval until it is released, lost, held for MaxHold, or
// MaxFailures renewals in a row failed (its context then ends and says why),
// or until the client is closed. NoKeepAlive leaves the renewals to the
// caller ([Lease.Renew]).
type AcquireOptions struct {
	// MaxWait bounds the wait for the lease on its own, whatever is left of
	// the context's deadline; zero waits as long as the context lives. The
	// error after it wraps [context.DeadlineExceeded] and the last attempt's
	// error.
	MaxWait time.Duration
	// TryOnce makes one attempt instead of waiting, as [Client.TryAcquire]
	// does: when another holder has the lease the error is a [*HeldError]
	// (errors.Is [pgfence.ErrLeaseHeld]). MaxWait and Fair do not apply.
	TryOnce bool
	// HolderInfo describes this holder in the lease row and the grant's event
	// (at most [MaxHolderInfoBytes]). Default: "host:pid".
	HolderInfo string
	// Fair makes Acquire wait its turn in a queue in the database
	// (pgfence.lease_waiters), so fair waiters of every client and process
	// are granted in arrival order. Without it, waiters are FIFO within one
	// client only. Each fair waiter takes its place from its arrival, and so
	// polls even while another waiter of its client waits for the same key.
	// It costs one small non-durable write per poll, and it orders fair
	// waiters only: a TryAcquire or a non-fair Acquire can still take a free
	// lease first.
	Fair bool
	// Announce makes the grant send NOTIFY pgfence_lease_granted (with the
	// lease's length and key), and every renewal a signed announcement of the
	// new expiry on pgfence_lease_changed, so that watchers ([Client.Watch])
	// read the grant at once and wait for the new expiry instead of polling,
	// and waiters of other clients skip the attempt they were about to make
	// and set their timers to the new lease's expiry. It costs a notification
	// that wakes every listening session per grant and renewal: use it for
	// keys whose grants others follow (an election), or when many clients
	// wait for one key and statements, not database CPU, are what you need to
	// save; not for hot keys with few waiters.
	Announce bool

	// RenewInterval is the time between two renewals. Default: the TTL / 3.
	// It must be below the TTL minus the safety margin.
	RenewInterval time.Duration
	// MaxHold is the longest the lease is kept alive, counted from the
	// grant; then its context ends with [ErrMaxHold]. Default
	// [MaxHoldDefault] (one hour), [NoMaxHold] for no limit. Work that may
	// run longer must raise it.
	MaxHold time.Duration
	// MaxFailures is how many renewals in a row may fail (database
	// unreachable, outcome unknown) before the keep-alive gives up and ends
	// the lease's context. Default 3.
	MaxFailures int
	// NoKeepAlive grants the lease without keeping it alive: it expires
	// after its TTL unless the caller renews it ([Lease.Renew]).
	NoKeepAlive bool
}

// NoMaxHold, as [AcquireOptions.MaxHold], keeps a lease alive for as long as
// it is held: for an elected leader, whose term should last until it resigns
// or fails.
const NoMaxHold = time.Duration(math.MaxInt64)

// check validates o for a lease of ttl with the safety margin margin, and
// returns it with its defaults filled in.
func (o *AcquireOptions) check(ttl, margin time.Duration) (AcquireOptions, error) {
	v := deref(o)
	switch {
	case v.MaxWait < 0:
		return v, invalid("AcquireOptions.MaxWait", "must not be negative, got %s", v.MaxWait)
	case v.TryOnce && v.MaxWait > 0:
		return v, invalid("AcquireOptions.MaxWait", "has no effect with TryOnce (which never waits), got %s", v.MaxWait)
	case v.TryOnce && v.Fair:
		return v, invalid("AcquireOptions.Fair", "has no effect with TryOnce (which never waits in the queue)")
	case v.RenewInterval >= ttl-margin:
		return v, invalid("AcquireOptions.RenewInterval", "must be below the TTL minus the safety margin (%s), got %s", ttl-margin, v.RenewInterval)
	case v.MaxHold < 0:
		return v, invalid("AcquireOptions.MaxHold", "must not be negative, got %s", v.MaxHold)
	case v.MaxFailures < 0:
		return v, invalid("AcquireOptions.MaxFailures", "must not be negative, got %d", v.MaxFailures)
	}
	if err := checkInterval("AcquireOptions.RenewInterval", v.RenewInterval); err != nil {
		return v, err
	}
	v.HolderInfo = cmp.Or(v.HolderInfo, defaultHolderInfo())
	if err := checkText("AcquireOptions.HolderInfo", v.HolderInfo, MaxHolderInfoBytes, false); err != nil {
		return v, err
	}
	v.RenewInterval = cmp.Or(v.RenewInterval, ttl/renewFractionDefault)
	v.MaxHold = cmp.Or(v.MaxHold, MaxHoldDefault)
	v.MaxFailures = cmp.Or(v.MaxFailures, maxFailuresDefault)
	return v, nil
}

// defaultHolderInfo is "host:pid", at most MaxHolderInfoBytes.
var defaultHolderInfo = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	info := fmt.Sprintf("%s:%d", host, os.Getpid())
	return info[:min(len(info), MaxHolderInfoBytes)]
})

// checkText refuses text of more than maxLen bytes (or none, when
// required), and what a PostgreSQL text value cannot hold, before the server
// does it with a less clear error.
func checkText(field, s string, maxLen int, required bool) error {
	switch {
	case required && s == "":
		return invalid(field, "must not be empty")
	case len(s) > maxLen:
		return invalid(field, "must be at most %d bytes, got %d", maxLen, len(s))
	case strings.IndexByte(s, 0) >= 0:
		return invalid(field, "must not contain a NUL byte")
	case !utf8.ValidString(s):
		return invalid(field, "must be valid UTF-8")
	}
	return nil
}

// validateKey checks a lease key: 1 to [MaxKeyBytes] bytes of text
// PostgreSQL can store (valid UTF-8, no NUL byte).
func validateKey(key string) error { return checkText("key", key, MaxKeyBytes, true) }

// maxReasonChars is the longest operator reason ([Client.ForceRelease],
// [Client.PauseGrants], [Client.ResumeGrants]), in characters; the SQL
// functions enforce the same limit.
const maxReasonChars = 1000

// validateReason checks an operator's reason: text of at most maxReasonChars
// characters, and not empty when required.
func validateReason(reason string, required bool) error {
	n := utf8.RuneCountInString(reason)
	switch {
	case required && (n == 0 || n > maxReasonChars):
		return invalid("reason", "must be 1 to %d characters, got %d", maxReasonChars, n)
	case n > maxReasonChars:
		return invalid("reason", "must be at most %d characters, got %d", maxReasonChars, n)
	}
	return checkText("reason", reason, len(reason), false)
}

// validateTTL checks a TTL against the limits and returns the safety margin
// to use with it.
func (c *Client) validateTTL(ttl time.Duration) (margin time.Duration, err error) {
	switch {
	case ttl <= 0:
		return 0, invalid("ttl", "must be positive, got %s", ttl)
	case ttl > MaxTTLLimit:
		return 0, invalid("ttl", "must be at most %s, got %s", MaxTTLLimit, ttl)
	case ttl < minTTL:
		return 0, invalid("ttl", "must be at least %s, got %s", minTTL, ttl)
	}
	margin = cmp.Or(c.cfg.SafetyMargin, ttl/10)
	if margin >= ttl-margin { // 2*margin >= ttl, without overflow
		return 0, invalid("ttl", "must exceed twice Config.SafetyMargin (%s), got %s", margin, ttl)
	}
	return margin, nil
}
