package idempotency

import (
	"cmp"
	"context"
	"fmt"
	"math"

	"github.com/pgfence/pgfence/internal/driver"
)

// GCOptions configures [Store.GC]. A nil *GCOptions and the zero value use
// the defaults.
type GCOptions struct {
	// BatchSize is the most keys one statement deletes, at most
	// math.MaxInt32 (the SQL function takes an integer). Default 1000.
	BatchSize int
	// MaxBatches stops after this many batches. Default 0: until no expired
	// key is left (or ctx ends).
	MaxBatches int
}

// GCResult counts what [Store.GC] did.
type GCResult struct {
	// Deleted is the number of expired keys deleted.
	Deleted int64
	// Batches is the number of delete statements run.
	Batches int
}

// gcSQL deletes one batch of completed keys whose retention ended (database
// clock) and returns how many (pgfence.idempotency_gc). In-progress
// keys have no expires_at and are never selected; rows a claim is reusing
// right now are locked and skipped.
const gcSQL = `SELECT pgfence.idempotency_gc($1)`

// GC deletes expired completed keys in batches, each its own statement (and
// transaction when db is a pool or connection), so it never holds many locks
// for long and never blocks claims. Keys in progress, atomic or leased, are
// never deleted. It returns what it deleted so far even when it stops on an
// error. It calls pgfence.idempotency_gc, which members of pgfence_app may
// not run: connect as a member of pgfence_operator (or the schema owner).
// It is recorded as the operation gc (and the keys as gc_deleted) and
// logged at debug level.
func (s *Store) GC(ctx context.Context, db DB, opts *GCOptions) (res GCResult, err error) {
	ctx, done := s.tel.Start(ctx, "gc")
	defer func() {
		s.tel.Count(ctx, "gc_deleted", "ok", res.Deleted)
		s.tel.log.DebugContext(ctx, "idempotency: gc", "deleted", res.Deleted, "batches", res.Batches, "error", err)
		done(outcomeOf(err))
	}()
	o := cmp.Or(opts, &GCOptions{})
	switch {
	case o.BatchSize < 0 || o.BatchSize > math.MaxInt32:
		return res, fmt.Errorf("%w: GCOptions.BatchSize must be 0 to %d, got %d", ErrInvalid, math.MaxInt32, o.BatchSize)
	case o.MaxBatches < 0:
		return res, fmt.Errorf("%w: GCOptions.MaxBatches must not be negative, got %d", ErrInvalid, o.MaxBatches)
	}
	h, err := driver.Pgx(db)
	if err != nil {
		return res, err
	}
	size := cmp.Or(o.BatchSize, 1000)
	for o.MaxBatches == 0 || res.Batches < o.MaxBatches {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		var deleted int64
		if err := h.QueryRow(ctx, gcSQL, size).Scan(&deleted); err != nil {
			return res, fmt.Errorf("idempotency: gc: %w", err)
		}
		res.Batches++
		res.Deleted += deleted
		if deleted < int64(size) {
			break
		}
	}
	return res, nil
}
