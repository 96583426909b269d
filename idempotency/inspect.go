package idempotency

import (
	"cmp"
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
	// ExpiresAt is when its retention ends and [Store.GC] may delete it;
	// zero while in progress.
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
// (0: 50, at most 10,000). To tell whether more exist, ask for one more than
// you show.
func Keys(ctx context.Context, db DB, scope string, limit int) ([]KeyState, error) {
	if limit < 0 || limit > maxKeysLimit {
		return nil, fmt.Errorf("%w: limit must be 0 to %d, got %d", ErrInvalid, maxKeysLimit, limit)
	}
	return listKeys(ctx, db, checkText("scope", scope, 1, MaxScopeBytes), sqlKeys, scope, cmp.Or(limit, 50))
}

// LookupKey returns the state of one key, and false when it is not stored
// (never claimed, or deleted by [Store.GC]).
func LookupKey(ctx context.Context, db DB, scope, key string) (KeyState, bool, error) {
	keys, err := listKeys(ctx, db, errors.Join(checkText("scope", scope, 1, MaxScopeBytes), checkText("key", key, 1, MaxKeyBytes)),
		sqlLookupKey, scope, key)
	if err != nil || len(keys) == 0 {
		return KeyState{}, false, err
	}
	return keys[0], true, nil
}

// listKeys returns the keys query selects, unless the arguments were
// refused (invalid).
func listKeys(ctx context.Context, db DB, invalid error, query string, args ...any) ([]KeyState, error) {
	if invalid != nil {
		return nil, invalid
	}
	if err := driver.NilHandle(db); err != nil {
		return nil, err
	}
	rows, _ := db.Query(ctx, query, args...) // its error is the rows', which CollectRows returns
	keys, err := pgx.CollectRows(rows, scanKey)
	if err != nil {
		return nil, fmt.Errorf("idempotency: keys: %w", classify(err, false))
	}
	return keys, nil
}

func scanKey(row pgx.CollectableRow) (KeyState, error) {
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
