package pgfence

import (
	"context"
)

// Operators' functions: they need membership in pgfence_operator (or the
// schema's owner). Each runs one statement that commits on its own on a pool
// or a connection; a connection lost after sending it returns an error
// wrapping [ErrOutcomeUnknown]: read the state back before trying again.

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
