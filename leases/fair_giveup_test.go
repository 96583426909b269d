package leases_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
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
	if _, err := holder.TryAcquire(ctx, "q", time.Hour, manual()); err != nil { // it runs out below
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

// A fair waiter that gives up returns when its context ends, also when the
// statement that takes it out of the queue cannot get through: that
// statement goes on in the background (Close waits for it).
func TestFairGiveUpKeepsItsDeadline(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	holder := newClient(t, db.Pool, &leases.Config{DisableWakeups: true})
	if _, err := holder.TryAcquire(ctx, "q", time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, db.URL)
	c := newClient(t, proxiedPool(t, db.URL, p), &leases.Config{DisableWakeups: true})
	if _, err := c.TryAcquire(ctx, "warm", time.Second, manual()); err != nil { // a connection in the pool
		t.Fatal(err)
	}
	p.SetHold(faultproxy.ClientToServer, true) // from now on nothing gets through
	defer p.SetHold(faultproxy.ClientToServer, false)
	start := time.Now()
	_, err := c.Acquire(ctx, "q", time.Minute, &leases.AcquireOptions{Fair: true, MaxWait: 300 * time.Millisecond})
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v, want its deadline", err)
	}
	// The queue statement alone may take 2 s; the wait is bounded by 300 ms.
	if elapsed > 1500*time.Millisecond {
		t.Fatalf("Acquire with MaxWait 300ms returned after %s", elapsed)
	}
}

// A fair waiter gives up while its queue turn waits on the server (here
// behind a lock on an expired row of the key's queue, which the turn
// deletes), and the server never hears that the client gave up (the cancel
// request cannot get through). The turn then runs after all: the waiter must
// leave the queue after it, not before, or its row stands in the other
// waiters' way for a whole patience.
func TestFairGiveUpLeavesAfterItsTurn(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO pgfence.lease_waiters (key, waiter, enqueued_at, expires_at)
		VALUES ('q', gen_random_uuid(), now() - interval '2 minutes', now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	lock, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `SELECT 1 FROM pgfence.lease_waiters WHERE key = 'q' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	p := newProxy(t, db.URL)
	pool := proxiedPool(t, db.URL, p)
	// Two connections in the pool: the turn's, and one for the leave once
	// the proxy refuses new ones.
	c1, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c1.Release()
	c2.Release()
	c, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	waitCtx, giveUp := context.WithCancel(ctx)
	gave := make(chan error, 1)
	go func() {
		_, err := c.Acquire(waitCtx, "q", time.Minute, &leases.AcquireOptions{Fair: true})
		gave <- err
	}()
	for { // until the turn waits for the lock
		var waiting bool
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%lease_queue_turn%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the fair waiter's queue turn never waited for the lock")
		case <-time.After(5 * time.Millisecond):
		}
	}
	p.SetRefuse(true) // no cancel request reaches the server
	defer p.SetRefuse(false)
	giveUp()
	if err := <-gave; !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire after giving up: %v, want context.Canceled", err)
	}
	time.Sleep(100 * time.Millisecond) // room for a leave that would not wait for the turn
	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil { // waits for the leave
		t.Fatal(err)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_waiters WHERE key = 'q' AND expires_at > now()`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d live rows in the queue after its only fair waiter gave up: its turn ran after its leave", left)
	}
}
