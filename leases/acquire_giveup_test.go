package leases_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// When a waiting Acquire's context ends during an attempt that sent nothing
// (no connection came before the end), the error still wraps the last
// attempt that got an answer, here a *HeldError with the holder's time left,
// as Acquire's documentation says; not just the context's error twice.
func TestAcquireGivingUpKeepsLastAnswer(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, 30*time.Second)
	acquireCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		if conns.Add(1) == 1 {
			return true, nil // the first attempt runs
		}
		// The caller gives up while the second attempt waits for a connection.
		giveUp()
		<-ctx.Done()
		return true, ctx.Err()
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})

	if _, err := leasesClient(t, db).TryAcquire(ctx, "k", 10*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(acquireCtx, "k", 10*time.Second, nil)
	var held *leases.HeldError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &held) || held.Remaining <= 0 {
		t.Fatalf("Acquire that gave up: %v, want context.Canceled and the last answer's *HeldError", err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections asked for, want 2", n)
	}
}
