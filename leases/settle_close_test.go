package leases_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// An attempt whose context ends after it was sent has an unknown outcome:
// the caller hears ErrOutcomeUnknown at once, and the settlement in the
// background leaves the key free (the statement was canceled, or the grant
// it made is released) before Close returns, never held by a grant nobody
// received.
func TestCanceledAfterSentIsSettledBeforeClose(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	unblock := blockKey(t, ctx, pool, c, "blocked")
	actx, cancel := context.WithCancelCause(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(actx, "blocked", time.Minute, nil)
		got <- err
	}()
	waitLocked(t, pool)
	cancel(errors.New("gave up while the grant ran"))
	if err := <-got; !errors.Is(err, leases.ErrOutcomeUnknown) {
		t.Fatalf("canceled after it was sent: %v, want ErrOutcomeUnknown", err)
	}
	unblock()
	// Close waits for the settlement in the background.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var live bool
	if err := pool.QueryRow(ctx, `SELECT live FROM pgfence.lease_status WHERE key = 'blocked'`).Scan(&live); err != nil || live {
		t.Fatalf("after the settlement the key is live=%v (%v): a grant nobody received holds it", live, err)
	}
	other := newClient(t, pool, &leases.Config{DisableWakeups: true})
	if _, err := other.TryAcquire(ctx, "blocked", time.Minute, nil); err != nil {
		t.Fatalf("the key after the settlement: %v", err)
	}
}

// blockKey makes the next statement that writes key's lease row wait: it
// locks the row in a transaction of its own and returns the function that
// ends that transaction. The key is granted and released first, so its row
// exists and a grant goes on to update it.
func blockKey(t *testing.T, ctx context.Context, pool *pgxpool.Pool, c *leases.Client, key string) (unblock func()) {
	t.Helper()
	l, err := c.TryAcquire(ctx, key, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	done := false
	unblock = func() {
		if !done {
			done = true
			_ = tx.Rollback(ctx)
		}
	}
	t.Cleanup(unblock)
	return unblock
}
