package idempotency

import (
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
	// MaxResultBytes is the largest stored result (the result of Do's work,
	// [Attempt.Complete]'s, or [Failure.Data]).
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
	// [GC] deletes it. A [Request] may override it. Default [RetentionDefault];
	// 1µs to 366 days.
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
	retention  time.Duration
	wait       time.Duration
	lease      time.Duration
	retryAfter time.Duration
	logger     *slog.Logger
	tel        *instruments
}

// NewStore returns a Store configured by cfg (nil for the defaults).
func NewStore(cfg *Config) (*Store, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	s := &Store{
		retention:  cfg.Retention,
		wait:       cfg.WaitTimeout,
		lease:      cfg.Lease,
		retryAfter: cfg.RetryAfter,
		logger:     cfg.Logger,
	}
	switch {
	case s.retention < 0:
		return nil, fmt.Errorf("%w: Config.Retention must not be negative, got %v", ErrInvalid, s.retention)
	case s.retention == 0:
		s.retention = RetentionDefault
	case s.retention < time.Microsecond:
		return nil, fmt.Errorf("%w: Config.Retention must be at least 1µs (the database's precision), got %v", ErrInvalid, s.retention)
	case s.retention > maxRetention:
		return nil, fmt.Errorf("%w: Config.Retention must be at most %v (366 days), got %v", ErrInvalid, maxRetention, s.retention)
	}
	switch {
	case s.wait < 0:
		s.wait = time.Millisecond
	case s.wait == 0:
		s.wait = WaitTimeoutDefault
	case s.wait < time.Millisecond:
		return nil, fmt.Errorf("%w: Config.WaitTimeout must be at least 1ms, got %v", ErrInvalid, s.wait)
	case s.wait > maxWaitTimeout:
		return nil, fmt.Errorf("%w: Config.WaitTimeout must be at most %v (lock_timeout's limit), got %v", ErrInvalid, maxWaitTimeout, s.wait)
	}
	switch {
	case s.lease < 0:
		return nil, fmt.Errorf("%w: Config.Lease must not be negative, got %v", ErrInvalid, s.lease)
	case s.lease == 0:
		s.lease = LeaseDefault
	case s.lease < time.Millisecond:
		return nil, fmt.Errorf("%w: Config.Lease must be at least 1ms, got %v", ErrInvalid, s.lease)
	case s.lease > maxLease:
		return nil, fmt.Errorf("%w: Config.Lease must be at most %v, got %v", ErrInvalid, maxLease, s.lease)
	}
	switch {
	case s.retryAfter < 0:
		return nil, fmt.Errorf("%w: Config.RetryAfter must not be negative, got %v", ErrInvalid, s.retryAfter)
	case s.retryAfter == 0:
		s.retryAfter = RetryAfterDefault
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.tel = newInstruments(cfg.MeterProvider, cfg.TracerProvider, s.logger)
	return s, nil
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

func (s *Store) check(req Request) (fingerprint []byte, retention time.Duration, err error) {
	switch {
	case len(req.Scope) == 0 || len(req.Scope) > MaxScopeBytes:
		return nil, 0, fmt.Errorf("%w: Request.Scope must be 1 to %d bytes, got %d", ErrInvalid, MaxScopeBytes, len(req.Scope))
	case len(req.Key) == 0 || len(req.Key) > MaxKeyBytes:
		return nil, 0, fmt.Errorf("%w: Request.Key must be 1 to %d bytes, got %d", ErrInvalid, MaxKeyBytes, len(req.Key))
	case !validText(req.Scope):
		return nil, 0, fmt.Errorf("%w: Request.Scope must be valid UTF-8 without NUL bytes", ErrInvalid)
	case !validText(req.Key):
		return nil, 0, fmt.Errorf("%w: Request.Key must be valid UTF-8 without NUL bytes", ErrInvalid)
	case req.Retention < 0:
		return nil, 0, fmt.Errorf("%w: Request.Retention must not be negative, got %v", ErrInvalid, req.Retention)
	case req.Retention > 0 && req.Retention < time.Microsecond:
		return nil, 0, fmt.Errorf("%w: Request.Retention must be at least 1µs (the database's precision), got %v", ErrInvalid, req.Retention)
	case req.Retention > maxRetention:
		return nil, 0, fmt.Errorf("%w: Request.Retention must be at most %v (366 days), got %v", ErrInvalid, maxRetention, req.Retention)
	}
	retention = req.Retention
	if retention == 0 {
		retention = s.retention
	}
	fp := sha256.Sum256(req.Payload)
	return fp[:], retention, nil
}

// validText reports whether s is text PostgreSQL can store: valid UTF-8
// without NUL bytes.
func validText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
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
// replayed to every duplicate, like a success. Return it (or wrap it) from a
// [Store.Do]'s work or pass it to [Attempt.Fail]. Errors that are not a *Failure are
// transient: never stored, the key stays free for a retry.
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

func (f *Failure) check() error {
	switch {
	case len(f.Code) == 0 || len(f.Code) > maxFailureCodeBytes:
		return fmt.Errorf("%w: Failure.Code must be 1 to %d bytes, got %d", ErrInvalid, maxFailureCodeBytes, len(f.Code))
	case len(f.Message) > maxFailureMessageBytes:
		return fmt.Errorf("%w: Failure.Message must be at most %d bytes, got %d", ErrInvalid, maxFailureMessageBytes, len(f.Message))
	case !validText(f.Code):
		return fmt.Errorf("%w: Failure.Code must be valid UTF-8 without NUL bytes", ErrInvalid)
	case !validText(f.Message):
		return fmt.Errorf("%w: Failure.Message must be valid UTF-8 without NUL bytes", ErrInvalid)
	case len(f.Data) > MaxResultBytes:
		return fmt.Errorf("%w: Failure.Data must be at most %d bytes, got %d", ErrInvalid, MaxResultBytes, len(f.Data))
	}
	return nil
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
	if !sent && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return err // the caller's own deadline, not an outage
	}
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

func micros(d time.Duration) int64 { return d.Microseconds() }

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
