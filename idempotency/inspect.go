package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/driver"
)

// Reads for operators and tools: the state of stored keys, never their
// fingerprint, result or recovery data (the fingerprint is read for
// Store.Recover, not shown). They change nothing and take no
// lock. Every statement is immune to search_path: functions and operators are
// schema-qualified.

// KeyState is the state of one stored idempotency key.
type KeyState struct {
	Scope string
	Key   string
	// Mode is "atomic" ([Store.Do]) or "leased" ([Store.Claim]).
	Mode string
	// Status is "in_progress", "succeeded" or "failed".
	Status string
	// Epoch counts the claims that owned the key: a takeover adds one, and
	// so does a new intent once the key's retention ended (also for an
	// atomic key).
	Epoch int64
	// RecoveryPoint is the last point an attempt recorded ([Attempt.Advance]);
	// empty if none.
	RecoveryPoint string
	// Released reports that a leased key in progress was given up by its
	// last owner ([Attempt.Release]) rather than abandoned by a crash.
	Released bool
	// FailureCode is the code of a stored [Failure]; empty unless failed.
	FailureCode string
	// CreatedAt is when the key was first claimed (database clock).
	CreatedAt time.Time
	// CompletedAt is when it completed; zero while in progress.
	CompletedAt time.Time
	// ExpiresAt is when its retention ends and [GC] may delete it; zero while
	// in progress.
	ExpiresAt time.Time
	// LeaseExpiresAt is when a leased attempt's claim runs out; zero for
	// atomic and completed keys.
	LeaseExpiresAt time.Time
	// TraceID is the trace of the claim that owns or completed the key, if it
	// was traced.
	TraceID string

	fingerprint string // what Store.Recover claims with
	retention   time.Duration
}

// maxKeysLimit is the most keys one call of Keys returns.
const maxKeysLimit = 10_000

const (
	sqlKeyColumns = `SELECT scope, key, mode, status, epoch, recovery_point,
       owner IS NULL AND status OPERATOR(pg_catalog.=) 'in_progress', coalesce(failure_code, ''),
       created_at, completed_at, expires_at, lease_expires_at, coalesce(trace_id, ''), fingerprint,
       (extract(epoch FROM retention) OPERATOR(pg_catalog.*) 1e6)::bigint
  FROM pgfence.idempotency_keys`
	sqlKeys = sqlKeyColumns + `
 WHERE scope OPERATOR(pg_catalog.=) $1 ORDER BY created_at DESC, key LIMIT $2`
	sqlLookupKey = sqlKeyColumns + `
 WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2`
)

// Keys returns the stored keys of scope, newest first, at most limit of them
// (0: 50, at most 10,000). To tell whether more
// exist, ask for one more than you show.
func Keys(ctx context.Context, db DB, scope string, limit int) ([]KeyState, error) {
	if err := checkScope(scope); err != nil {
		return nil, err
	}
	switch {
	case limit < 0 || limit > maxKeysLimit:
		return nil, fmt.Errorf("%w: limit must be 0 to %d, got %d", ErrInvalid, maxKeysLimit, limit)
	case limit == 0:
		limit = 50
	}
	q, done, err := querier(ctx, db)
	if err != nil {
		return nil, err
	}
	defer done()
	rows, err := q.Query(ctx, sqlKeys, scope, limit)
	if err != nil {
		return nil, classify(err, false)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (KeyState, error) { return scanKey(row) })
	if err != nil {
		return nil, classify(err, false)
	}
	return out, nil
}

// LookupKey returns the state of one key, and false when it is not stored
// (never claimed, or deleted by [GC]).
func LookupKey(ctx context.Context, db DB, scope, key string) (KeyState, bool, error) {
	if err := checkScope(scope); err != nil {
		return KeyState{}, false, err
	}
	if len(key) == 0 || len(key) > MaxKeyBytes || !validText(key) {
		return KeyState{}, false, fmt.Errorf("%w: key must be 1 to %d bytes of UTF-8 without NUL, got %d bytes", ErrInvalid, MaxKeyBytes, len(key))
	}
	if err := driver.NilHandle(db); err != nil {
		return KeyState{}, false, err
	}
	k, err := scanKey(db.QueryRow(ctx, sqlLookupKey, scope, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return KeyState{}, false, nil
	}
	if err != nil {
		return KeyState{}, false, classify(err, false)
	}
	return k, true, nil
}

func checkScope(scope string) error {
	if len(scope) == 0 || len(scope) > MaxScopeBytes || !validText(scope) {
		return fmt.Errorf("%w: scope must be 1 to %d bytes of UTF-8 without NUL, got %d bytes", ErrInvalid, MaxScopeBytes, len(scope))
	}
	return nil
}

func scanKey(row pgx.Row) (KeyState, error) {
	var (
		k                                KeyState
		completed, expires, leaseExpires *time.Time
		fingerprint                      []byte
		retention                        int64
	)
	err := row.Scan(&k.Scope, &k.Key, &k.Mode, &k.Status, &k.Epoch, &k.RecoveryPoint, &k.Released, &k.FailureCode,
		&k.CreatedAt, &completed, &expires, &leaseExpires, &k.TraceID, &fingerprint, &retention)
	k.CompletedAt, k.ExpiresAt, k.LeaseExpiresAt = orZero(completed), orZero(expires), orZero(leaseExpires)
	k.fingerprint, k.retention = string(fingerprint), fromMicros(&retention)
	return k, err
}

// orZero returns *t, or the zero time for a NULL.
func orZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// querier returns db, refusing a nil one.
func querier(_ context.Context, db DB) (DB, func(), error) {
	if err := driver.NilHandle(db); err != nil {
		return nil, nil, err
	}
	return db, func() {}, nil
}
