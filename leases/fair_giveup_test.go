package leases_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The fair waiter at the head of the queue gives up while the key is free
// (its holder's lease ran out, which no release announces). The next fair
// waiter, of another client, must hear of it and take the key: it used to
// sleep until its next poll (here an hour), the key free all that time.
func TestFairWaiterGivingUpWakesTheNext(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	cfg := leases.Config{PollInterval: time.Hour, BackoffMax: time.Hour}
	clients := listeningClients(t, ctx, db.Pool, 2, cfg)
	holder := newClient(t, db.Pool, &leases.Config{DisableWakeups: true})
	if _, err := holder.TryAcquire(ctx, "q", time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	queued := func(n int) {
		t.Helper()
		for {
			var got int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_waiters WHERE key = 'q'`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got >= n {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%d fair waiters queued, want %d", got, n)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	fair := &leases.AcquireOptions{Fair: true}
	headCtx, giveUp := context.WithCancel(ctx)
	head := make(chan error, 1)
	go func() {
		_, err := clients[0].Acquire(headCtx, "q", time.Minute, fair)
		head <- err
	}()
	queued(1)
	next := make(chan error, 1)
	go func() {
		l, err := clients[1].Acquire(ctx, "q", time.Minute, fair)
		if err == nil {
			err = l.Release(ctx)
		}
		next <- err
	}()
	queued(2)

	backdate(t, db.Pool, "q", -time.Second) // the holder's lease ran out, silently
	giveUp()
	if err := <-head; err == nil {
		t.Fatal("the head waiter got the key after giving up")
	}
	select {
	case err := <-next:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the next fair waiter still sleeps with the key free after the head gave up")
	}
}
