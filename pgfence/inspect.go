package pgfence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/driver"
)

// Reads for operators and tools: what pgfence.fences, pgfence.token_floor and
// pgfence.protected_tables() hold now. They change nothing and take no lock.
// Every statement is immune to search_path: functions and operators are
// schema-qualified.

// FenceRecord is one fenced resource as pgfence.fences stores it.
type FenceRecord struct {
	// Resource is the fenced resource.
	Resource string
	// Token is the highest token accepted for the resource.
	Token int64
	// Writes counts the accepted writes.
	Writes int64
	// AcceptedAt is when the last write was accepted (database clock).
	AcceptedAt time.Time
	// Op is the operation id of the last accepted write (zero if it had none).
	Op OpID
}

const (
	sqlFences = `SELECT resource, token, writes, accepted_at, ` + sqlOp + ` FROM pgfence.fences
 WHERE pg_catalog.starts_with(resource, $1) ORDER BY resource LIMIT $2`
	sqlLookupFence = `SELECT resource, token, writes, accepted_at, ` + sqlOp + ` FROM pgfence.fences
 WHERE resource OPERATOR(pg_catalog.=) $1`
	sqlTokenFloor   = `SELECT floor, raised_at, reason, retention, retention_at FROM pgfence.token_floor`
	sqlProtectionOf = `SELECT relation::pg_catalog.text, resource_column, prefix FROM pgfence.protected_tables()
 WHERE relation OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)`
)

// Fences returns the fenced resources whose name starts with prefix ("" for
// every one), ordered by name, at most limit of them (0: 1000; at most
// 100,000). To tell whether more exist, ask for one more than you show.
func Fences(ctx context.Context, db DB, prefix string, limit int) ([]FenceRecord, error) {
	if err := driver.NilHandle(db); err != nil {
		return nil, err
	}
	if prefix != "" {
		if err := validateName("prefix", prefix); err != nil {
			return nil, err
		}
	}
	return list(ctx, db, sqlFences, prefix, limit, 1000, 100_000, func(row pgx.CollectableRow) (FenceRecord, error) { return scanFence(row) })
}

// list runs a listing query for name of at most limit rows (def when limit
// is 0, at most max) and scans each row with scan.
func list[T any](ctx context.Context, db DB, sql, name string, limit, def, max int, scan pgx.RowToFunc[T]) ([]T, error) {
	switch {
	case limit < 0 || limit > max:
		return nil, fmt.Errorf("%w: limit must be 0 to %d, got %d", ErrInvalid, max, limit)
	case limit == 0:
		limit = def
	}
	rows, err := db.Query(ctx, sql, name, limit)
	if err != nil {
		return nil, read(err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, read(err)
	}
	return out, nil
}

// LookupFence returns the fence of resource, or an error wrapping
// [ErrNotFound] when no token was ever accepted for it. It reads the last
// committed state without waiting for writers in flight; after an unknown
// outcome use [Resolve].
func LookupFence(ctx context.Context, db DB, resource string) (FenceRecord, error) {
	if err := driver.NilHandle(db); err != nil {
		return FenceRecord{}, err
	}
	if err := validateName("resource", resource); err != nil {
		return FenceRecord{}, err
	}
	f, err := scanFence(db.QueryRow(ctx, sqlLookupFence, resource))
	if errors.Is(err, pgx.ErrNoRows) {
		return FenceRecord{}, fmt.Errorf("%w: no token accepted for resource %q", ErrNotFound, resource)
	}
	if err != nil {
		return FenceRecord{}, read(err)
	}
	return f, nil
}

func scanFence(row pgx.Row) (FenceRecord, error) {
	var f FenceRecord
	err := row.Scan(&f.Resource, &f.Token, &f.Writes, &f.AcceptedAt, &f.Op)
	return f, err
}

// TokenFloorState is the token floor and the retention floor: every token
// issued is greater than both.
type TokenFloorState struct {
	// Floor is the floor itself; 0 until [RaiseTokenFloor] raised it.
	Floor int64
	// RaisedAt is when the floor was last set (database clock).
	RaisedAt time.Time
	// Reason is why, as given to [RaiseTokenFloor] ("initial" at first).
	Reason string
	// Retention is the retention floor; 0 until [AdvanceRetention] first
	// advanced it.
	Retention int64
	// RetentionAt is when it was last advanced; zero before.
	RetentionAt time.Time
}

// TokenFloor returns the token floor. After a restore or a rebuild compare it
// with [MaxStoredToken]; [RaiseTokenFloor] raises it.
func TokenFloor(ctx context.Context, db DB) (TokenFloorState, error) {
	if err := driver.NilHandle(db); err != nil {
		return TokenFloorState{}, err
	}
	var (
		f           TokenFloorState
		retentionAt *time.Time
	)
	err := db.QueryRow(ctx, sqlTokenFloor).Scan(&f.Floor, &f.RaisedAt, &f.Reason, &f.Retention, &retentionAt)
	if err != nil {
		return TokenFloorState{}, read(err)
	}
	if retentionAt != nil {
		f.RetentionAt = *retentionAt
	}
	return f, nil
}

// ProtectionOf returns how table is protected ([Protect]), and false when it
// is not, or when no such table exists. Table names are checked with
// [CheckIdentifier]; an unqualified name is looked up on the search_path, as
// [Protect] looks it up.
func ProtectionOf(ctx context.Context, db DB, table pgx.Identifier) (ProtectedTable, bool, error) {
	if err := driver.NilHandle(db); err != nil {
		return ProtectedTable{}, false, err
	}
	if err := checkIdentifier("table", table); err != nil {
		return ProtectedTable{}, false, err
	}
	var p ProtectedTable
	err := db.QueryRow(ctx, sqlProtectionOf, table.Sanitize()).Scan(&p.Table, &p.ResourceColumn, &p.Prefix)
	if errors.Is(err, pgx.ErrNoRows) {
		return ProtectedTable{}, false, nil
	}
	if err != nil {
		return ProtectedTable{}, false, read(err)
	}
	return p, true, nil
}
