package idempotency_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The transaction an atomic attempt hands out is closed once the attempt
// ends: a deferred Rollback (or any later call) answers ErrTxClosed and
// sends nothing, though the pooled connection it ran on is by then another
// caller's, in the middle of a transaction of its own.
func TestAttemptTxClosedAfterItEnds(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // the next caller gets the attempt's connection
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)

	for _, end := range []string{"Complete", "Fail", "Release"} {
		out, err := store.Begin(ctx, pool, idempotency.Request{Scope: "orders", Key: "guard-" + end})
		if err != nil || out.Attempt == nil {
			t.Fatalf("Begin: %+v, %v", out, err)
		}
		stale := out.Attempt.Tx()
		if _, err := charge("guard-"+end, 1)(ctx, stale); err != nil {
			t.Fatal(err)
		}
		switch end {
		case "Complete":
			_, err = out.Attempt.Complete(ctx, []byte("ok"))
		case "Fail":
			_, err = out.Attempt.Fail(ctx, &idempotency.Failure{Code: "declined"})
		default:
			err = out.Attempt.Release(ctx)
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}

		// Another caller's transaction on the same connection.
		other, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ('other-'||$1, 1)`, end); err != nil {
			t.Fatal(err)
		}
		if err := stale.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("after %s: Rollback of the attempt's tx: %v, want ErrTxClosed", end, err)
		}
		if _, err := stale.Exec(ctx, `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("after %s: Exec on the attempt's tx: %v, want ErrTxClosed", end, err)
		}
		if err := stale.QueryRow(ctx, `SELECT 1`).Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("after %s: QueryRow on the attempt's tx: %v, want ErrTxClosed", end, err)
		}
		if err := other.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if n := countCharges(t, pool, "other-"+end); n != 1 {
			t.Errorf("after %s: the other caller's committed insert: %d rows, want 1 (the stale Rollback reached its transaction)", end, n)
		}
	}
}
