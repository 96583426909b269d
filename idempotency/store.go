package idempotency

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/internal/pgerr"
)

// DB is what the package runs on: a *pgxpool.Pool, a *pgx.Conn, or the
// caller's [pgx.Tx] (the work then runs inside the caller's transaction,
// under a savepoint).
type DB = driver.PgxDB

// Defaults for [Config].
const (
	// RetentionDefault is how long a completed key's result is kept.
	RetentionDefault = 24 * time.Hour
	// WaitTimeoutDefault bounds how long a claim waits for a key that another
	// transaction holds before it reports it in progress (see [Config.WaitTimeout]).
	WaitTimeoutDefault = 5 * time.Second
	// LeaseDefault is the lease of a leased claim.
	LeaseDefault = 30 * time.Second
	// RetryAfterDefault is the retry hint of an [*InProgressError] when the
	// database cannot tell when the key will be free (an uncommitted atomic
	// claim).
	RetryAfterDefault = time.Second
)

// Limits on input. The Go API checks them before any round trip and returns
// an [ErrInvalid] error naming the field and the limit; the SQL functions
// enforce the same limits for other clients (PF008), and a test compares the
// two. A rejected call writes nothing: the key stays as it was (free, or
// claimed by the same owner). The limits of other fields are stated where
// they are documented.
//
// A [Request.Payload] has no limit of its own: only its SHA-256 is sent and
// stored (the schema accepts fingerprints of 16 to 64 bytes). Bound what you
// read before hashing it; the HTTP middleware does (idemhttp.Config.MaxBodyBytes).
const (
	// MaxScopeBytes is the longest [Request.Scope].
	MaxScopeBytes = 512
	// MaxKeyBytes is the longest [Request.Key].
	MaxKeyBytes = 512
	// MaxResultBytes is the largest stored result (what the work of
	// [Store.Do] returns, [Attempt.Complete]'s, or [Failure.Data]).
	MaxResultBytes = 16 << 20

	maxFailureCodeBytes    = 128
	maxFailureMessageBytes = 4096
	maxRecoveryPointBytes  = 256
	maxRecoveryDataBytes   = 1 << 20
	maxRetention           = 366 * 24 * time.Hour
	maxLease               = 24 * time.Hour
	// maxWaitTimeout is lock_timeout's largest value, 2^31-1 milliseconds.
	maxWaitTimeout = math.MaxInt32 * time.Millisecond
)

// Config configures a [Store]. A nil *Config and the zero value use the
// defaults.
type Config struct {
	// Retention is how long a completed key answers duplicates with its stored
	// result; afterwards it is forgotten (the same key starts a new intent) and
	// [Store.GC] deletes it. A [Request] may override it. Default
	// [RetentionDefault]; 1µs to 366 days.
	Retention time.Duration
	// WaitTimeout bounds how long an atomic duplicate waits for an uncommitted
	// first attempt, and how long a leased claim waits for a key row that
	// another transaction holds locked (an owner completing inside its own
	// transaction): a lock_timeout on the claim, after which the key is
	// in progress ([ErrInProgress]). The caller's ctx bounds it too. Negative means do not
	// wait (1 ms). Default [WaitTimeoutDefault]; 1ms to lock_timeout's largest value,
	// 2^31-1 milliseconds (about 24.8 days).
	WaitTimeout time.Duration
	// Lease is how long a leased claim (and each heartbeat or recovery point)
	// holds the key before another attempt may take it over. Default
	// [LeaseDefault]; 1ms to 24h.
	Lease time.Duration
	// RetryAfter is the retry hint of an [*InProgressError] when the database
	// has no lease to go by. Default [RetryAfterDefault].
	RetryAfter time.Duration
	// Logger receives debug events (claims, takeovers, releases). Default:
	// discard.
	Logger *slog.Logger
	// MeterProvider receives the store's metrics (see the package
	// documentation's Observability section). Default: the global otel.GetMeterProvider(), a
	// no-op until the application sets one.
	MeterProvider metric.MeterProvider
	// TracerProvider receives spans around Do, Claim and an attempt's
	// Complete, Fail and Release. Default: the global
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// Store claims, replays and completes idempotency keys in the pgfence schema.
// It holds configuration only, no connection: every call takes the [DB] to
// use. It is safe for concurrent use.
type Store struct {
	retention, wait, lease, retryAfter time.Duration
	tel                                *instruments
}

// NewStore returns a Store configured by cfg (nil for the defaults).
func NewStore(cfg *Config) (*Store, error) {
	cfg = cmp.Or(cfg, &Config{})
	wait := cfg.WaitTimeout
	if wait < 0 {
		wait = time.Millisecond
	}
	s := &Store{}
	var errs [4]error
	s.retention, errs[0] = duration("Config.Retention", cfg.Retention, RetentionDefault, time.Microsecond, maxRetention)
	s.wait, errs[1] = duration("Config.WaitTimeout", wait, WaitTimeoutDefault, time.Millisecond, maxWaitTimeout)
	s.lease, errs[2] = duration("Config.Lease", cfg.Lease, LeaseDefault, time.Millisecond, maxLease)
	s.retryAfter, errs[3] = duration("Config.RetryAfter", cfg.RetryAfter, RetryAfterDefault, 1, math.MaxInt64)
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	s.tel = newInstruments(cfg.MeterProvider, cfg.TracerProvider, cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)))
	return s, nil
}

// duration returns d, or def when d is 0, and refuses d outside [lo, hi]
// (the database keeps microseconds).
func duration(field string, d, def, lo, hi time.Duration) (time.Duration, error) {
	switch {
	case d == 0:
		return def, nil
	case d < lo || d > hi:
		return 0, fmt.Errorf("%w: %s must be %v to %v, got %v", ErrInvalid, field, lo, hi, d)
	}
	return d, nil
}

// Lease returns how long a leased claim, heartbeat or recovery point holds
// a key: [Config.Lease] or its default.
func (s *Store) Lease() time.Duration { return s.lease }

// Request names one business intent and carries the request it was made with.
type Request struct {
	// Scope is the namespace of Key: the operation and whoever may use it, for
	// example "payments.capture/tenant-42". Keys of different scopes never meet.
	// 1 to [MaxScopeBytes] bytes.
	Scope string
	// Key names the business intent, for example the order id plus the
	// operation ("order-1234:capture"). It is stable across every retry of the
	// intent; a random id per attempt defeats the purpose. 1 to [MaxKeyBytes].
	Key string
	// Payload is the request in a canonical form (see [CanonicalJSON]). Its
	// SHA-256 is stored with the key: the same key with another payload is
	// refused with [ErrMismatch]. May be empty.
	Payload []byte
	// Retention overrides [Config.Retention] for this key when positive; at
	// most 366 days.
	Retention time.Duration
}

// claimArgs are the checked arguments of one claim.
type claimArgs struct {
	store           *Store
	scope, key      string
	fingerprint     []byte
	wait, retention time.Duration
	// claimed: the opener of an atomic claim claimed the key (outcome new)
	// with its BEGIN.
	claimed bool
}

// check refuses req unless the database would accept it, and returns the
// arguments of its claim.
func (s *Store) check(req Request) (claimArgs, error) {
	retention, err := duration("Request.Retention", req.Retention, s.retention, time.Microsecond, maxRetention)
	if err := errors.Join(checkText("Request.Scope", req.Scope, 1, MaxScopeBytes), checkText("Request.Key", req.Key, 1, MaxKeyBytes), err); err != nil {
		return claimArgs{}, err
	}
	fp := sha256.Sum256(req.Payload)
	return claimArgs{store: s, scope: req.Scope, key: req.Key, fingerprint: fp[:], wait: s.wait, retention: retention}, nil
}

// checkText refuses s unless it is text PostgreSQL can store (valid UTF-8
// without NUL bytes) of lo to hi bytes.
func checkText(field, s string, lo, hi int) error {
	if len(s) < lo || len(s) > hi {
		return fmt.Errorf("%w: %s must be %d to %d bytes, got %d", ErrInvalid, field, lo, hi, len(s))
	}
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%w: %s must be valid UTF-8 without NUL bytes", ErrInvalid, field)
	}
	return nil
}

// checkSize refuses bytes larger than the database stores.
func checkSize(field string, b []byte, hi int) error {
	if len(b) > hi {
		return fmt.Errorf("%w: %s must be at most %d bytes, got %d", ErrInvalid, field, hi, len(b))
	}
	return nil
}

// Outcome is the answer for a key that a call owned or found completed. A
// key that another attempt holds is an [*InProgressError] instead, and a key
// used with another payload [ErrMismatch].
type Outcome struct {
	// Replayed reports that the intent had completed before: Result or
	// Failure is the stored answer, and nothing was executed. Otherwise the
	// call owned the key: [Store.Do] and [Store.DoSQL] ran the intent and
	// stored its answer; [Store.Begin] and [Store.Claim] give the work to do
	// in Attempt.
	Replayed bool
	// Result is the stored result of a success; never nil for a success (an
	// empty result is an empty slice).
	Result []byte
	// Failure is the stored permanent failure, when the intent failed for good.
	Failure *Failure
	// ExpiresAt is when the stored result will be forgotten (database clock).
	ExpiresAt time.Time
	// Attempt is the claim of an outcome of [Store.Begin] or [Store.Claim]
	// that is not Replayed.
	Attempt *Attempt
}

// Failure is a permanent failure: it is stored as the key's answer and
// replayed to every duplicate, like a success. Return it (or wrap it) from
// the work of [Store.Do] or [Store.DoSQL], or pass it to [Attempt.Fail].
// Errors that are not a *Failure are transient: never stored, the key stays
// free for a retry.
type Failure struct {
	// Code classifies the failure for programs, e.g. "insufficient_funds".
	// 1 to 128 bytes of UTF-8 without NUL.
	Code string
	// Message is for people. At most 4096 bytes of UTF-8 without NUL.
	Message string
	// Data is an optional stored payload (for example an error response body).
	Data []byte
}

func (f *Failure) Error() string {
	if f.Message == "" {
		return "idempotency: permanent failure: " + f.Code
	}
	return "idempotency: permanent failure: " + f.Code + ": " + f.Message
}

// check refuses a nil failure or one the database would not store.
func (f *Failure) check() error {
	if f == nil {
		return fmt.Errorf("%w: failure is nil", ErrInvalid)
	}
	return errors.Join(checkText("Failure.Code", f.Code, 1, maxFailureCodeBytes),
		checkText("Failure.Message", f.Message, 0, maxFailureMessageBytes), checkSize("Failure.Data", f.Data, MaxResultBytes))
}

// Errors. ErrMismatch and ErrInProgress are this package's failures; the
// others are the same values as package pgfence's sentinels of the same
// names (github.com/pgfence/pgfence/pgfence), repeated here so that a caller
// of this package needs no second import: errors.Is works with either name.
var (
	// ErrMismatch: the key was used before with a different payload. The stored
	// result is not shown. PF004 from SQL.
	ErrMismatch = pgerr.ErrMismatch
	// ErrInProgress: another attempt holds the key. Errors carrying it are
	// [*InProgressError]s with a retry hint. PF007 from SQL.
	ErrInProgress = pgerr.ErrInProgress
	// ErrLeaseLost: a leased call from an attempt that no longer owns the key
	// (its lease expired and another attempt took over, it released the key, or
	// the key is completed). PF002 from SQL.
	ErrLeaseLost = pgerr.ErrLeaseLost
	// ErrIsolation: the transaction is not READ COMMITTED (PF010, 40001).
	ErrIsolation = pgerr.ErrIsolation
	// ErrOutcomeUnknown: the connection broke after a commit was sent; retry the
	// same request: the key tells whether it committed.
	ErrOutcomeUnknown = pgerr.ErrOutcomeUnknown
	// ErrUnavailable: the database could not be reached; nothing was done.
	ErrUnavailable = pgerr.ErrUnavailable
	// ErrInvalid: an argument was rejected; the error names it.
	ErrInvalid = pgerr.ErrInvalid
	// ErrNotGranted: the database role may not use this scope: no prefix of
	// it is granted to the role (PF014; an operator grants prefixes with
	// pgfence.grant_prefix). Nothing was done.
	ErrNotGranted = pgerr.ErrNotGranted
	// ErrNotPrimary: the server is a standby; keys are claimed on the
	// primary only (PF005).
	ErrNotPrimary = pgerr.ErrNotPrimary
)

// InProgressError reports a key held by another attempt.
type InProgressError struct {
	Scope, Key string
	// RetryAfter is when the key may be free: the rest of the owner's lease, or
	// [Config.RetryAfter] when no lease tells.
	RetryAfter time.Duration
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("idempotency: key %s/%s in progress, retry after %v", e.Scope, e.Key, e.RetryAfter)
}

// Unwrap returns [ErrInProgress].
func (e *InProgressError) Unwrap() error { return ErrInProgress }

// classify maps err to the package's errors, keeping the original in the
// chain. sent reports whether a change may have reached the server.
func classify(err error, sent bool) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		// Nothing was sent: the db given (a transaction) had ended. An
		// attempt claimed on a transaction cannot outlive it.
		return fmt.Errorf("%w: the transaction given as db has ended (claim on a pool or a connection): %w", ErrInvalid, err)
	}
	return pgerr.Classify(err, sent)
}

// acquire returns what a statement that commits on its own runs on: db
// itself, or for a pool one of its connections, with the function that gives
// it back; a pool that gives none sent nothing.
func acquire(ctx context.Context, db DB) (DB, func(), error) {
	c, release, err := driver.Conn(ctx, db)
	if err != nil || c == nil {
		return db, release, err
	}
	return c, release, nil
}

// nonNil returns b, or an empty slice for nil: a stored result is never
// NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// fromMicros converts microseconds read from the database. Another client
// may have set a lease longer than a time.Duration holds (about 292 years);
// that saturates instead of wrapping around to a negative duration.
func fromMicros(us *int64) time.Duration {
	switch {
	case us == nil || *us <= 0:
		return 0
	case *us > int64(math.MaxInt64/time.Microsecond):
		return math.MaxInt64
	}
	return time.Duration(*us) * time.Microsecond
}
