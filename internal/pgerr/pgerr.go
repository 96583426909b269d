// Package pgerr classifies PostgreSQL and connection errors in one place, so
// that every pgfence package maps SQLSTATEs to the same sentinels and nothing
// matches error strings.
//
// It reads server errors whatever the driver: pgx's *pgconn.PgError (pgx and
// its database/sql driver, stdlib) and lib/pq's *pq.Error both have a
// SQLState() method and exported Message and Detail fields, which is all it
// uses; lib/pq is not imported. A driver's [driver.ErrBadConn] counts as a
// broken connection.
//
// The sentinels are defined here once, one per failure, and exported by
// package pgfence (and the few that idempotency's users need, by package
// idempotency): every package classifies with [Classify], so a failure is the
// same errors.Is target whichever package returned it.
package pgerr

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// pgfence's own SQLSTATEs, raised by the SQL installed by the migrations.
const (
	CodeStaleToken     = "PF001" // a fenced write presented an older token
	CodeLeaseNotHeld   = "PF002" // the writer or renewer no longer holds the lease
	CodeLeaseHeld      = "PF003" // another holder has the lease
	CodeKeyMismatch    = "PF004" // idempotency key reused with another payload
	CodeNotPrimary     = "PF005" // tokens are not issued in recovery
	CodeUnfencedWrite  = "PF006" // a protected table was written without a token
	CodeKeyInProgress  = "PF007" // idempotency key is being processed
	CodeInvalid        = "PF008" // invalid argument
	CodeFloorNotRaised = "PF009" // the token floor may only be raised
	CodeIsolation      = "PF010" // the transaction is not READ COMMITTED (raised before any write)
	CodeGrantsPaused   = "PF011" // new grants for the key's prefix are paused (pgfence.pause_grants)
	CodeTokenNotIssued = "PF012" // the resource's lease has not issued the presented token
	CodeAbandoned      = "PF013" // the request was abandoned by its client after its reply was lost
	CodeNotGranted     = "PF014" // the role may not use this key, resource or scope (pgfence.grant_prefix)
	CodeKeyDone        = "PF015" // idempotency key already has a stored answer (idempotency_claim_atomic_new)
	CodeBacklogFull    = "PF016" // the task key's backlog is full (pgfence.task_enqueue)
)

// PostgreSQL SQLSTATEs pgfence reacts to.
const (
	CodeSerializationFailure = "40001"
	CodeDeadlockDetected     = "40P01"
	CodeLockNotAvailable     = "55P03" // lock_timeout
	CodeQueryCanceled        = "57014" // statement_timeout or cancel
	CodeIdleInTxTimeout      = "25P03"
	CodeReadOnlyTransaction  = "25006"
	CodeAdminShutdown        = "57P01"
	CodeCrashShutdown        = "57P02"
	CodeCannotConnectNow     = "57P03"
	CodeUniqueViolation      = "23505"
	CodeUndefinedFunction    = "42883"
	CodeUndefinedTable       = "42P01"
	CodeInvalidSchemaName    = "3F000"
)

// The sentinels, one per failure. Package pgfence documents them.
var (
	// ErrStaleToken: a write presented a token older than one already
	// accepted for its resource (PF001).
	ErrStaleToken = errors.New("pgfence: stale token")
	// ErrLeaseLost: the lease is no longer held by this grant: expired,
	// released, taken over or force-released (PF002, or found by the client).
	ErrLeaseLost = errors.New("pgfence: lease lost")
	// ErrLeaseHeld: another holder has the lease (PF003).
	ErrLeaseHeld = errors.New("pgfence: lease held by another holder")
	// ErrMismatch: an idempotency key was used before with another payload
	// (PF004).
	ErrMismatch = errors.New("pgfence: idempotency key reused with a different request")
	// ErrUnfencedWrite: a protected table was written without an accepted
	// token for the row's resource (PF006).
	ErrUnfencedWrite = errors.New("pgfence: unfenced write to a protected table")
	// ErrInProgress: another attempt holds the idempotency key (PF007).
	ErrInProgress = errors.New("pgfence: idempotency key in progress")
	// ErrFloorLowered: the token floor may only be raised (PF009).
	ErrFloorLowered = errors.New("pgfence: the token floor may only be raised")
	// ErrTokenNotIssued: the lease named by the resource has not issued the
	// token (PF012).
	ErrTokenNotIssued = errors.New("pgfence: token not issued for this resource")
	// ErrNotFound: the lease, resource or key asked for does not exist.
	ErrNotFound = errors.New("pgfence: not found")

	// ErrUnavailable: the database could not be reached or is shutting down;
	// nothing was done.
	ErrUnavailable = errors.New("pgfence: database unavailable")
	// ErrOutcomeUnknown: the connection broke after the request was sent; the
	// change may or may not have committed. Resolve it by reading back.
	ErrOutcomeUnknown = errors.New("pgfence: outcome unknown")
	// ErrNotPrimary: the server is in recovery (a standby); no token is issued.
	ErrNotPrimary = errors.New("pgfence: server is not a primary")
	// ErrIsolation: the caller's transaction runs in REPEATABLE READ or
	// SERIALIZABLE; pgfence's claims need READ COMMITTED.
	ErrIsolation = errors.New("pgfence: transaction isolation must be READ COMMITTED")
	// ErrLockTimeout: lock_timeout expired while waiting for a row lock.
	ErrLockTimeout = errors.New("pgfence: lock timeout")
	// ErrStatementTimeout: statement_timeout expired (or the query was cancelled).
	ErrStatementTimeout = errors.New("pgfence: statement timeout")
	// ErrIdleInTransactionTimeout: the session was idle in a transaction for
	// longer than idle_in_transaction_session_timeout and was terminated.
	ErrIdleInTransactionTimeout = errors.New("pgfence: idle in transaction timeout")
	// ErrInvalid: an argument was rejected before or by the database.
	ErrInvalid = errors.New("pgfence: invalid argument")
	// ErrGrantsPaused: an operator paused new grants for a prefix of the key
	// (pgfence.pause_grants); nothing was granted. Current holders are not
	// affected.
	ErrGrantsPaused = errors.New("pgfence: new grants are paused for this key")
	// ErrAbandoned: the request arrived after its client had given it up
	// (its reply was lost and the client was told it did not happen); the
	// server refused it, so that answer stays true.
	ErrAbandoned = errors.New("pgfence: request abandoned by its client")
	// ErrNotGranted: the database role may not use this lease key, fenced
	// resource or idempotency scope: no prefix of it is granted to the role
	// (pgfence.grant_prefix). Nothing was done.
	ErrNotGranted = errors.New("pgfence: name not granted to this database role")
	// ErrBacklogFull: the task key has as many open tasks as its bound
	// (PF016); nothing was enqueued.
	ErrBacklogFull = errors.New("pgfence: task backlog full")
)

// sqlStater is what the drivers' server errors have in common:
// *pgconn.PgError and lib/pq's *pq.Error both return their SQLSTATE from
// SQLState.
type sqlStater interface{ SQLState() string }

// Code returns the SQLSTATE of the server error in err's chain, whichever
// driver reported it, or "" when err carries none.
func Code(err error) string {
	var s sqlStater
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// ServerError is what the server said in an error response, read from
// whichever driver's error type carries it.
type ServerError struct {
	Code    string // SQLSTATE
	Message string // the primary message
	Detail  string // DETAIL; pgfence's own errors put name=value pairs here
}

// Server returns the error response in err's chain, whichever driver
// reported it, and false when err carries none (the server never answered).
// It reads *pgconn.PgError directly, and the exported string fields Message
// and Detail of any other error type with a SQLState method (lib/pq's
// *pq.Error).
func Server(err error) (ServerError, bool) {
	var s sqlStater
	if !errors.As(err, &s) {
		return ServerError{}, false
	}
	if pe, ok := s.(*pgconn.PgError); ok {
		return ServerError{Code: pe.Code, Message: pe.Message, Detail: pe.Detail}, true
	}
	se := ServerError{Code: s.SQLState()}
	v := reflect.ValueOf(s)
	for v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		field := func(name string) string {
			if f := v.FieldByName(name); f.IsValid() && f.Kind() == reflect.String {
				return f.String()
			}
			return ""
		}
		se.Message, se.Detail = field("Message"), field("Detail")
	}
	return se, true
}

// PgError returns the *pgconn.PgError in err's chain, or nil. Code and
// Server read the server errors of every driver.
func PgError(err error) *pgconn.PgError {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr
	}
	return nil
}

// IsConnectionError reports whether err means the connection failed (refused,
// reset, closed, timed out at the network level) rather than the server
// rejecting a statement. A connection pgx had already closed
// ([pgconn.ErrConnClosed]) is one too; whether anything was sent on it is
// [pgconn.SafeToRetry]'s to say (see [Classify]). So is a database/sql
// driver's [driver.ErrBadConn]: the driver says the connection cannot be used
// (lib/pq also says it when the connection broke after a request was sent).
func IsConnectionError(err error) bool {
	if err == nil {
		return false
	}
	if code := Code(err); code != "" {
		switch code {
		case CodeAdminShutdown, CodeCrashShutdown, CodeCannotConnectNow:
			return true
		}
		return len(code) == 5 && code[:2] == "08"
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, context.DeadlineExceeded) && pgconn.Timeout(err)
}

// schemaMissing reports whether the server refused a statement because a
// pgfence object does not exist: the schema is missing, or older than the
// client (a function signature a later migration created). An application's
// own missing table is not this.
func schemaMissing(se ServerError) bool {
	switch se.Code {
	case CodeUndefinedFunction, CodeUndefinedTable, CodeInvalidSchemaName:
		// function pgfence.f(...), relation "pgfence.t", schema "pgfence"
		return strings.Contains(se.Message, "pgfence.") || strings.Contains(se.Message, `"pgfence"`)
	}
	return false
}

// schemaError adds what to do to a server error caused by a missing or
// outdated pgfence schema; errors.As still finds the driver's error.
type schemaError struct{ err error }

func (e *schemaError) Error() string {
	return e.err.Error() + " (the pgfence schema is missing or older than this client: apply the migrations, `pgfence migrate up` or migrations.Up)"
}

func (e *schemaError) Unwrap() error { return e.err }

// codeInvalidStatementName (26000) is what a backend answers for a prepared
// statement it does not have.
const codeInvalidStatementName = "26000"

// statementGoneError is a prepared statement missing on the backend that runs
// the next round trip: behind a transaction-mode pooler, one client's round
// trips reach different backends unless the driver sends each statement in
// one (pgx's exec mode, lib/pq's binary_parameters).
type statementGoneError struct{ err error }

func (e *statementGoneError) Error() string {
	return e.err.Error() + " (a statement prepared in one round trip was missing in the next: behind a transaction-mode pooler such as PgBouncer, add default_query_exec_mode=exec to a pgx URL, or binary_parameters=yes to a lib/pq one)"
}

func (e *statementGoneError) Unwrap() error { return e.err }

// sentinels are the failures the server names by SQLSTATE.
var sentinels = map[string]error{
	CodeStaleToken:           ErrStaleToken,
	CodeLeaseNotHeld:         ErrLeaseLost,
	CodeLeaseHeld:            ErrLeaseHeld,
	CodeKeyMismatch:          ErrMismatch,
	CodeNotPrimary:           ErrNotPrimary,
	CodeReadOnlyTransaction:  ErrNotPrimary,
	CodeUnfencedWrite:        ErrUnfencedWrite,
	CodeKeyInProgress:        ErrInProgress,
	CodeInvalid:              ErrInvalid,
	CodeFloorNotRaised:       ErrFloorLowered,
	CodeIsolation:            ErrIsolation,
	CodeSerializationFailure: ErrIsolation,
	CodeGrantsPaused:         ErrGrantsPaused,
	CodeTokenNotIssued:       ErrTokenNotIssued,
	CodeAbandoned:            ErrAbandoned,
	CodeNotGranted:           ErrNotGranted,
	CodeBacklogFull:          ErrBacklogFull,
	CodeLockNotAvailable:     ErrLockTimeout,
	CodeQueryCanceled:        ErrStatementTimeout,
	CodeIdleInTxTimeout:      ErrIdleInTransactionTimeout,
}

// classified are the sentinels an error carries once Classify (or a package
// that builds on it) has classified it.
var classified = []error{ErrUnavailable, ErrOutcomeUnknown, ErrNotPrimary, ErrIsolation, ErrLockTimeout,
	ErrStatementTimeout, ErrIdleInTransactionTimeout, ErrInvalid, ErrGrantsPaused, ErrAbandoned, ErrNotGranted,
	ErrStaleToken, ErrLeaseLost, ErrLeaseHeld, ErrMismatch, ErrUnfencedWrite, ErrInProgress, ErrFloorLowered,
	ErrTokenNotIssued, ErrNotFound, ErrBacklogFull}

// Classified reports whether err already carries one of the shared sentinels.
func Classified(err error) bool {
	for _, s := range classified {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// Classify maps a database error to pgfence's shared sentinels, keeping the
// original in the chain. sent reports whether a statement that could commit
// (a COMMIT, or a statement that commits on its own) was handed to the
// connection: a connection failure then is an unknown outcome, whoever
// reports it and whatever its SQLSTATE; before such a statement it is
// "unavailable". Errors it does not know are returned unchanged, and so are
// errors already classified: classifying twice changes nothing.
func Classify(err error, sent bool) error {
	if err == nil || Classified(err) {
		return err
	}
	if s, ok := sentinels[Code(err)]; ok {
		return fmt.Errorf("%w: %w", s, err)
	}
	se, answered := Server(err)
	if answered && !IsConnectionError(err) {
		if schemaMissing(se) {
			return &schemaError{err}
		}
		if gone := (*statementGoneError)(nil); se.Code == codeInvalidStatementName && !errors.As(err, &gone) {
			return &statementGoneError{err}
		}
		return err // the server answered: the statement failed, nothing committed
	}
	// A connection exception in an answer (08xxx, 57P0x) says nothing of what
	// reached PostgreSQL: PgBouncer answers 08P01 both when it never
	// forwarded the request ("server login has been failing") and when it
	// forwarded a COMMIT and lost the server's reply ("server conn
	// crashed?"). So only sent decides, as for a connection that broke.
	// A connection that could not be established sent nothing, whatever the
	// caller was about to send.
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	// No answer from the server.
	if pgconn.SafeToRetry(err) {
		// Nothing was sent. A context that ended first is the caller's own
		// deadline, not an outage; an error raised in the client itself (a
		// wrong argument count, say) is the caller's bug, not an outage.
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || !IsConnectionError(err) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if !sent {
		// Nothing reached the server: the caller's own deadline, or a bug of
		// the caller's, is returned as is; a broken connection is an outage.
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || !IsConnectionError(err) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}
