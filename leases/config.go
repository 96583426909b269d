package leases

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Limits on input. The client checks them before any round trip and returns
// an [pgfence.ErrInvalid] error naming the argument and the limit; the SQL functions
// enforce the same limits for other clients (PF008, pgfence.lease_check_args),
// and a test compares the two.
const (
	// MaxTTLLimit is the largest TTL the database accepts
	// (pgfence.lease_max_ttl()); [Config.MaxTTL] may lower it per client.
	MaxTTLLimit = 24 * time.Hour
	// MinInterval is the shortest poll, backoff, renewal and resolve interval
	// a client accepts: a shorter one would send statements back to back.
	MinInterval = time.Millisecond
	// MinTTL is the shortest TTL, for the client and the database alike
	// (pgfence.try_acquire and pgfence.renew refuse a shorter one with PF008).
	MinTTL = time.Millisecond
	// MaxKeyBytes is the longest key, in bytes (not characters).
	MaxKeyBytes = 512
	// MaxHolderInfoBytes is the longest holder description, in bytes.
	MaxHolderInfoBytes = 1024
)

// Defaults for [Config] and [AcquireOptions] fields left zero.
const (
	// MaxTTLDefault is the default largest TTL a client accepts.
	MaxTTLDefault = time.Hour

	// BackoffMinDefault is the first retry delay of a waiting Acquire.
	BackoffMinDefault = 10 * time.Millisecond
	// BackoffMaxDefault caps the retry delay while no wake-up notifications
	// arrive (disabled or the LISTEN connection is down).
	BackoffMaxDefault = time.Second
	// PollIntervalDefault is the safety-net poll of a waiting Acquire while
	// wake-up notifications work: a lost notification costs at most this.
	PollIntervalDefault = 5 * time.Second
	// ResolveTimeoutDefault bounds reading back the outcome of a grant whose
	// reply was lost.
	ResolveTimeoutDefault = 5 * time.Second
	// ReleaseTimeoutDefault bounds the Release run by [Client.Do] after its
	// function returns.
	ReleaseTimeoutDefault = 5 * time.Second

	// RenewFractionDefault: a lease is renewed every TTL/RenewFractionDefault.
	RenewFractionDefault = 3
	// MaxFailuresDefault is how many renewals in a row may fail before
	// keep-alive gives up and ends the lease's context.
	MaxFailuresDefault = 3
	// MaxHoldDefault is the longest a lease is kept alive.
	MaxHoldDefault = time.Hour

	// notifyChannel is the channel pgfence.release and pgfence.force_release
	// notify, with the key as payload.
	notifyChannel = "pgfence_lease_released"
	// grantNotifyChannel is the channel a grant notifies when the waiter that
	// won it had already lost a race for the key and [Config.AnnounceGrants]
	// is on, or when it was asked to ([AcquireOptions.Announce]), with the payload "<lease length in
	// microseconds>:<key>". Other clients' waiters woken by the same release
	// hear it and skip their attempt; watchers read the grant.
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

	// HolderInfo describes this process in the lease rows (at most 1024 bytes).
	// Default: "host:pid".
	HolderInfo string
	// MaxTTL is the largest TTL the client accepts. Default [MaxTTLDefault], at
	// most [MaxTTLLimit].
	MaxTTL time.Duration
	// SafetyMargin is subtracted from a grant's or renewal's TTL, counted from
	// the moment the request was sent by the local monotonic clock, to get the
	// local trust window; the lease's context ends when it runs out. It must be
	// below half of every TTL used ([New] refuses one of half of MaxTTL or
	// more, which leaves no TTL). Default: TTL/10.
	SafetyMargin time.Duration

	// DisableWakeups turns off the LISTEN connection; waiting Acquire calls then
	// only poll. Use it behind PgBouncer in transaction mode.
	DisableWakeups bool
	// AnnounceGrants makes a waiting Acquire that has lost a race for its key
	// announce its grant (NOTIFY pgfence_lease_granted): waiters of other
	// clients then skip their attempt and set their timers to the new lease's
	// expiry. Off by default: a NOTIFY wakes every listening session of the
	// database and serialises the commits that send one. With many clients
	// waiting for one key it saves attempts but lengthens hand-offs, and with
	// a few it makes no difference. Turn it on when statements, not database
	// CPU, are what you need to save.
	// Clients that do not announce still act on the announcements of those
	// that do.
	AnnounceGrants bool
	// BackoffMin is the first retry delay of a waiting Acquire (full jitter).
	// Default [BackoffMinDefault].
	BackoffMin time.Duration
	// BackoffMax caps the retry delay when no notifications arrive, at most
	// [MaxTTLLimit]. Default [BackoffMaxDefault].
	BackoffMax time.Duration
	// PollInterval is the safety-net poll while notifications work, at most
	// [MaxTTLLimit]. Default [PollIntervalDefault].
	PollInterval time.Duration
	// ResolveTimeout bounds reading back a grant whose reply was lost. The
	// caller never waits past its own context for it: the read-back goes on in
	// the background and releases a grant the caller did not receive. Default
	// [ResolveTimeoutDefault].
	ResolveTimeout time.Duration
	// DurableRelease makes releases commit with synchronous_commit = on. By
	// default they commit with synchronous_commit = off: a release lost in a
	// crash only makes the next holder wait for the lease to expire, and it
	// saves a WAL flush per release.
	DurableRelease bool
}

func (c *Config) resolve() (Config, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HolderInfo == "" {
		host, _ := os.Hostname()
		cfg.HolderInfo = fmt.Sprintf("%s:%d", host, os.Getpid())
		if len(cfg.HolderInfo) > MaxHolderInfoBytes {
			cfg.HolderInfo = cfg.HolderInfo[:MaxHolderInfoBytes]
		}
	}
	if len(cfg.HolderInfo) > MaxHolderInfoBytes {
		return cfg, invalid("Config.HolderInfo", "must be at most %d bytes, got %d", MaxHolderInfoBytes, len(cfg.HolderInfo))
	}
	if err := validText("Config.HolderInfo", cfg.HolderInfo); err != nil {
		return cfg, err
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Config.MaxTTL", &cfg.MaxTTL, MaxTTLDefault},
		{"Config.BackoffMin", &cfg.BackoffMin, BackoffMinDefault},
		{"Config.BackoffMax", &cfg.BackoffMax, BackoffMaxDefault},
		{"Config.PollInterval", &cfg.PollInterval, PollIntervalDefault},
		{"Config.ResolveTimeout", &cfg.ResolveTimeout, ResolveTimeoutDefault},
	}
	for _, d := range durations {
		if *d.v < 0 {
			return cfg, invalid(d.name, "must not be negative, got %s", *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
		// Shorter would poll or retry the database back to back.
		if *d.v < MinInterval {
			return cfg, invalid(d.name, "must be at least %s (0 for the default), got %s", MinInterval, *d.v)
		}
	}
	if cfg.SafetyMargin < 0 {
		return cfg, invalid("Config.SafetyMargin", "must not be negative, got %s", cfg.SafetyMargin)
	}
	if cfg.MaxTTL > MaxTTLLimit {
		return cfg, invalid("Config.MaxTTL", "must be at most %s, got %s", MaxTTLLimit, cfg.MaxTTL)
	}
	// A waiter polls at least once per MaxTTLLimit; a fair waiter keeps its
	// place in the queue for twice its longest pause, which must not overflow.
	if cfg.BackoffMax > MaxTTLLimit {
		return cfg, invalid("Config.BackoffMax", "must be at most %s, got %s", MaxTTLLimit, cfg.BackoffMax)
	}
	if cfg.PollInterval > MaxTTLLimit {
		return cfg, invalid("Config.PollInterval", "must be at most %s, got %s", MaxTTLLimit, cfg.PollInterval)
	}
	// Close waits for settlements, each bounded by it.
	if cfg.ResolveTimeout > MaxTTLLimit {
		return cfg, invalid("Config.ResolveTimeout", "must be at most %s, got %s", MaxTTLLimit, cfg.ResolveTimeout)
	}
	if cfg.SafetyMargin > (cfg.MaxTTL-1)/2 {
		// No TTL up to MaxTTL would exceed twice the margin (and twice a huge
		// margin overflows).
		return cfg, invalid("Config.SafetyMargin", "must be below half of MaxTTL (%s), got %s", cfg.MaxTTL, cfg.SafetyMargin)
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		return cfg, invalid("Config.BackoffMax", "must be at least BackoffMin (%s), got %s", cfg.BackoffMin, cfg.BackoffMax)
	}
	return cfg, nil
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
	// (at most [MaxHolderInfoBytes]). Default: [Config.HolderInfo].
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
	// lease's length and key), whatever [Config.AnnounceGrants] says, and
	// every renewal a signed announcement of the new expiry on
	// pgfence_lease_changed, so that watchers ([Client.Watch]) read the grant
	// at once and wait for the new expiry instead of polling, and waiters of
	// other clients set their timers to it. It costs a notification that
	// wakes every listening session per grant and renewal: use it for keys
	// whose grants others follow (an election), not for hot keys.
	Announce bool

	// RenewInterval is the time between two renewals. Default: the TTL /
	// [RenewFractionDefault]. It must be below the TTL minus the safety
	// margin.
	RenewInterval time.Duration
	// MaxHold is the longest the lease is kept alive, counted from the
	// grant; then its context ends with [ErrMaxHold]. Default
	// [MaxHoldDefault] (one hour), [NoMaxHold] for no limit. Work that may
	// run longer must raise it.
	MaxHold time.Duration
	// MaxFailures is how many renewals in a row may fail (database
	// unreachable, outcome unknown) before the keep-alive gives up and ends
	// the lease's context. Default [MaxFailuresDefault].
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
	var v AcquireOptions
	if o != nil {
		v = *o
	}
	switch {
	case v.MaxWait < 0:
		return v, invalid("AcquireOptions.MaxWait", "must not be negative, got %s", v.MaxWait)
	case v.TryOnce && v.MaxWait > 0:
		return v, invalid("AcquireOptions.MaxWait", "has no effect with TryOnce (which never waits), got %s", v.MaxWait)
	case v.TryOnce && v.Fair:
		return v, invalid("AcquireOptions.Fair", "has no effect with TryOnce (which never waits in the queue)")
	case len(v.HolderInfo) > MaxHolderInfoBytes:
		return v, invalid("AcquireOptions.HolderInfo", "must be at most %d bytes, got %d", MaxHolderInfoBytes, len(v.HolderInfo))
	case v.RenewInterval < 0:
		return v, invalid("AcquireOptions.RenewInterval", "must not be negative, got %s", v.RenewInterval)
	case v.RenewInterval > 0 && v.RenewInterval < MinInterval:
		return v, invalid("AcquireOptions.RenewInterval", "must be at least %s (0 for the default), got %s", MinInterval, v.RenewInterval)
	case v.RenewInterval >= ttl-margin:
		return v, invalid("AcquireOptions.RenewInterval", "must be below the TTL minus the safety margin (%s), got %s", ttl-margin, v.RenewInterval)
	case v.MaxHold < 0:
		return v, invalid("AcquireOptions.MaxHold", "must not be negative, got %s", v.MaxHold)
	case v.MaxFailures < 0:
		return v, invalid("AcquireOptions.MaxFailures", "must not be negative, got %d", v.MaxFailures)
	}
	if err := validText("AcquireOptions.HolderInfo", v.HolderInfo); err != nil {
		return v, err
	}
	if v.RenewInterval == 0 {
		v.RenewInterval = ttl / RenewFractionDefault
	}
	if v.MaxHold == 0 {
		v.MaxHold = MaxHoldDefault
	}
	if v.MaxFailures == 0 {
		v.MaxFailures = MaxFailuresDefault
	}
	return v, nil
}

// validateKey checks a lease key: 1 to [MaxKeyBytes] bytes of text
// PostgreSQL can store (valid UTF-8, no NUL byte).
func validateKey(key string) error {
	if len(key) == 0 {
		return invalid("key", "must not be empty")
	}
	if len(key) > MaxKeyBytes {
		return invalid("key", "must be at most %d bytes, got %d", MaxKeyBytes, len(key))
	}
	return validText("key", key)
}

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
	return validText("reason", reason)
}

// validText refuses what a PostgreSQL text value cannot hold, before the
// server does it with a less clear error.
func validText(field, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return invalid(field, "must not contain a NUL byte")
	}
	if !utf8.ValidString(s) {
		return invalid(field, "must be valid UTF-8")
	}
	return nil
}

// validateTTL checks a TTL against the client's limits and returns the safety
// margin to use with it.
func (c *Client) validateTTL(ttl time.Duration) (margin time.Duration, err error) {
	if ttl <= 0 {
		return 0, invalid("ttl", "must be positive, got %s", ttl)
	}
	if ttl > c.cfg.MaxTTL {
		return 0, invalid("ttl", "must be at most %s (Config.MaxTTL), got %s", c.cfg.MaxTTL, ttl)
	}
	if ttl < MinTTL {
		return 0, invalid("ttl", "must be at least %s, got %s", MinTTL, ttl)
	}
	margin = c.cfg.SafetyMargin
	if margin == 0 {
		margin = ttl / 10
	}
	if margin >= ttl-margin { // 2*margin >= ttl, without overflow
		return 0, invalid("ttl", "must exceed twice Config.SafetyMargin (%s), got %s", margin, ttl)
	}
	return margin, nil
}
