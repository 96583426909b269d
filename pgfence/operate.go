package pgfence

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgfence/pgfence/internal/driver"
)

// Operators' functions: they need membership in pgfence_operator (or the
// schema's owner). Each runs one statement that commits on its own on a pool
// or a connection; a connection lost after sending it returns an error
// wrapping [ErrOutcomeUnknown]: read the state back before trying again.

// PrefixGrant lets a database role use the lease keys, fenced resources and
// idempotency scopes that start with Prefix.
type PrefixGrant struct {
	Role      string
	Prefix    string
	GrantedBy string
	GrantedAt time.Time
}

// GrantPrefix lets role (and its members) use every lease key, fenced
// resource and idempotency scope that starts with prefix ("" is every name).
// Members of pgfence_app use only the names granted to them: the protocol's
// functions refuse the others ([ErrNotGranted], PF014), and their rows of
// the pgfence tables are hidden from them. It returns false when the grant
// existed already.
func GrantPrefix(ctx context.Context, db DB, role, prefix string) (added bool, err error) {
	if err := checkGrantArgs(role, prefix); err != nil {
		return false, err
	}
	err = run(ctx, db, `SELECT pgfence.grant_prefix($1::pg_catalog.regrole, $2)`, []any{role, prefix}, &added)
	return added, err
}

// RevokePrefix removes a grant made by [GrantPrefix]; it reports whether
// there was one. Leases already granted under it stay, but their holders can
// no longer renew, release or write under them.
func RevokePrefix(ctx context.Context, db DB, role, prefix string) (removed bool, err error) {
	if err := checkGrantArgs(role, prefix); err != nil {
		return false, err
	}
	err = run(ctx, db, `SELECT pgfence.revoke_prefix($1::pg_catalog.regrole, $2)`, []any{role, prefix}, &removed)
	return removed, err
}

func checkGrantArgs(role, prefix string) error {
	if role == "" {
		return fmt.Errorf("%w: role must not be empty", ErrInvalid)
	}
	if len(prefix) > MaxResourceLen || !utf8.ValidString(prefix) || strings.IndexByte(prefix, 0) >= 0 {
		return fmt.Errorf("%w: prefix must be at most %d bytes of UTF-8 without NUL", ErrInvalid, MaxResourceLen)
	}
	if !utf8.ValidString(role) || strings.IndexByte(role, 0) >= 0 {
		return fmt.Errorf("%w: role must be UTF-8 without NUL", ErrInvalid)
	}
	return nil
}

// PrefixGrants lists the prefix grants, by role and prefix.
func PrefixGrants(ctx context.Context, db DB) ([]PrefixGrant, error) {
	if err := driver.NilHandle(db); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT grantee::pg_catalog.text, prefix, granted_by::pg_catalog.text, granted_at
  FROM pgfence.prefix_grants ORDER BY 1, 2`)
	if err != nil {
		return nil, read(err)
	}
	defer rows.Close()
	var out []PrefixGrant
	for rows.Next() {
		var g PrefixGrant
		if err := rows.Scan(&g.Role, &g.Prefix, &g.GrantedBy, &g.GrantedAt); err != nil {
			return nil, read(err)
		}
		out = append(out, g)
	}
	return out, read(rows.Err())
}

// LowerFence sets the accepted token of resource to token, below the one it
// has, and records who did it and why (reason, 1 to 1000 characters) in pgfence.fence_resets. It is the recovery path for a
// resource fenced with a token its lease will not reach again, which every
// holder would otherwise find stale. Lowering lets writers with tokens
// between token and the old one in again: give the lease's current token, or
// above. It returns the token it replaced.
func LowerFence(ctx context.Context, db DB, resource string, token int64, reason string) (previous int64, err error) {
	if err := validateName("resource", resource); err != nil {
		return 0, err
	}
	err = run(ctx, db, `SELECT pgfence.lower_fence($1, $2, $3)`, []any{resource, token, reason}, &previous)
	return previous, err
}

// Pruned counts the rows [PruneRetired] deleted.
type Pruned struct {
	Leases, Events, Fences, Waiters int64
}

// PruneRetired deletes, at most batch rows of each table (1 to 100000), what
// the floors have retired ([AdvanceRetention], [RaiseTokenFloor]): lease rows
// at or below a floor that are not live, their history, fence rows at or
// below a floor, and expired queue places. Rows retired by the retention
// floor alone go an hour after their lease ended or their write was
// accepted, so that a client settling a lost reply still finds them. Call
// it until it deletes nothing. It is the retention of the tables that
// otherwise keep a row for every key and resource ever used.
func PruneRetired(ctx context.Context, db DB, batch int) (Pruned, error) {
	var p Pruned
	err := run(ctx, db, `SELECT leases, events, fences, waiters FROM pgfence.prune_retired($1)`, []any{batch},
		&p.Leases, &p.Events, &p.Fences, &p.Waiters)
	return p, err
}

// AdvanceRetention raises the retention floor to the highest token granted
// so far, and returns it. From then on a token at or below it is refused
// once a later grant of its key superseded it (its holder lost the lease;
// the fence row that would refuse it may be pruned), while the newest token
// of every key keeps working: unlike [RaiseTokenFloor], no live holder has
// to acquire again. Every later grant is above it. [PruneRetired] then
// deletes the rows of leases that ended, and the fence rows written, over an
// hour before. Run both on a schedule (pgfence maintenance schedule) to keep
// the tables to the keys and resources used recently, however many are used
// once and never again. It reads the highest token of the lease rows kept (a
// scan). Operator only.
func AdvanceRetention(ctx context.Context, db DB) (int64, error) {
	var retention int64
	err := run(ctx, db, `SELECT pgfence.advance_retention()`, nil, &retention)
	return retention, err
}
