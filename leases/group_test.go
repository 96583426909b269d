package leases_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgbouncer"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

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
	var once sync.Once
	unblock = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(unblock)
	return unblock
}

// waitUntil polls cond until it holds, or fails the test after 20 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitingOnLock reports whether some backend waits for a lock.
func waitingOnLock(t *testing.T, ctx context.Context, pool *pgxpool.Pool) bool {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

type attempt struct {
	key string
	l   *leases.Lease
	err error
}

// queueBehindBlockedBatch starts a grant of a blocked key (the batch in
// flight), then the attempts for keys, and returns once all of them wait in
// the queue: when the block is lifted they go as one batch.
func queueBehindBlockedBatch(t *testing.T, ctx context.Context, pool *pgxpool.Pool, c *leases.Client, keys []string) (unblock func(), results func() []attempt) {
	t.Helper()
	unblock = blockKey(t, ctx, pool, c, "group/blocker")
	var wg sync.WaitGroup
	out := make([]attempt, len(keys)+1)
	start := func(i int, key string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.TryAcquire(ctx, key, time.Minute, nil)
			out[i] = attempt{key, l, err}
		}()
	}
	start(len(keys), "group/blocker")
	waitUntil(t, "the leading batch to wait for the row lock", func() bool { return waitingOnLock(t, ctx, pool) })
	for i, key := range keys {
		start(i, key)
	}
	waitUntil(t, "every attempt to queue", func() bool { g, _ := leases.GroupQueued(c); return g == len(keys) })
	return unblock, func() []attempt { wg.Wait(); return out[:len(keys)] }
}

// With Config.GroupCommit, grant attempts that arrive while a batch is in
// flight go together in one statement, one transaction, and each gets its
// own answer: distinct keys are granted with their own tokens, a key held
// by another client is a HeldError for its attempts only, and of several
// attempts on one free key exactly one wins.
func TestGroupCommitGrantsTogetherEachItsOwnAnswer(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	other := newClient(t, pool, &leases.Config{DisableWakeups: true})
	held, err := other.TryAcquire(ctx, "group/held", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, GroupCommit: true})

	var keys []string
	for i := range 20 {
		keys = append(keys, fmt.Sprintf("group/free/%02d", i))
	}
	keys = append(keys, "group/held", "group/held", "group/held", "group/dup", "group/dup", "group/dup")
	unblock, results := queueBehindBlockedBatch(t, ctx, pool, c, keys)
	unblock()

	dupWins := 0
	for _, a := range results() {
		switch {
		case a.key == "group/held":
			var he *leases.HeldError
			if !errors.As(a.err, &he) || he.Remaining <= 0 {
				t.Errorf("attempt on a held key: %v, want a HeldError with the holder's remaining time", a.err)
			}
		case a.key == "group/dup" && errors.Is(a.err, leases.ErrLeaseHeld):
		case a.err != nil:
			t.Errorf("%s: %v", a.key, a.err)
		default:
			if a.key == "group/dup" {
				dupWins++
			}
			var holder string
			var token int64
			if err := pool.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.leases WHERE key = $1`, a.key).Scan(&holder, &token); err != nil {
				t.Fatal(err)
			}
			if holder != a.l.Holder() || token != a.l.Token() {
				t.Errorf("%s: granted holder %s token %d, the row says %s %d", a.key, a.l.Holder(), a.l.Token(), holder, token)
			}
		}
	}
	if dupWins != 1 {
		t.Errorf("%d of 3 attempts on one free key won, want exactly 1", dupWins)
	}
	// One transaction granted them all: their lease rows share one xmin.
	var txs int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM pgfence.leases
		WHERE key LIKE 'group/free/%' OR key = 'group/dup'`).Scan(&txs); err != nil {
		t.Fatal(err)
	}
	if txs != 1 {
		t.Errorf("the queued grants took %d transactions, want 1", txs)
	}
	if err := held.Release(ctx); err != nil {
		t.Errorf("the other client's lease: %v", err)
	}
}

// A batch the server refuses (here: grants of one prefix are paused) rolled
// back and granted nothing; each attempt is then sent alone, so only the
// paused key is refused.
func TestGroupCommitRefusedBatchGoesAlone(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := pool.Exec(ctx, `SELECT pgfence.pause_grants('group/paused/', 'test')`); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, GroupCommit: true})
	keys := []string{"group/a", "group/paused/1", "group/b", "group/c"}
	unblock, results := queueBehindBlockedBatch(t, ctx, pool, c, keys)
	unblock()
	for _, a := range results() {
		if a.key == "group/paused/1" {
			if !errors.Is(a.err, leases.ErrGrantsPaused) {
				t.Errorf("paused key: %v, want ErrGrantsPaused", a.err)
			}
			continue
		}
		if a.err != nil {
			t.Errorf("%s beside a paused key: %v", a.key, a.err)
		}
	}
}

// An attempt whose context ends while it waits in the queue was never sent:
// it returns the context's cause, and nothing is granted for it later.
func TestGroupCommitCanceledWhileQueuedIsNotSent(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, GroupCommit: true})
	unblock := blockKey(t, ctx, pool, c, "group/blocker")
	lead := make(chan error, 1)
	go func() {
		l, err := c.TryAcquire(ctx, "group/blocker", time.Minute, nil)
		if err == nil {
			err = l.Release(ctx)
		}
		lead <- err
	}()
	waitUntil(t, "the leading batch to wait for the row lock", func() bool { return waitingOnLock(t, ctx, pool) })
	qctx, cancel := context.WithCancelCause(ctx)
	queued := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(qctx, "group/gave-up", time.Minute, nil)
		queued <- err
	}()
	waitUntil(t, "the attempt to queue", func() bool { g, _ := leases.GroupQueued(c); return g == 1 })
	giveUp := errors.New("gave up while queued")
	cancel(giveUp)
	if err := <-queued; !errors.Is(err, giveUp) || errors.Is(err, leases.ErrOutcomeUnknown) {
		t.Fatalf("canceled while queued: %v, want the cause, not an unknown outcome", err)
	}
	unblock()
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
	// The queue drained; the canceled attempt left no row behind.
	waitUntil(t, "the queue to drain", func() bool { g, r := leases.GroupQueued(c); return g == 0 && r == 0 })
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE key = 'group/gave-up'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows of the canceled attempt: %d %v", n, err)
	}
}

// Releases that arrive while a release is in flight go together, and each
// says what it did: the lease rows are released, the key's next grant
// succeeds, and each release recorded its own event.
func TestGroupCommitReleasesTogether(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, GroupCommit: true})
	var ls []*leases.Lease
	for i := range 10 {
		l, err := c.TryAcquire(ctx, fmt.Sprintf("group/rel/%d", i), time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	blocker, err := c.TryAcquire(ctx, "group/rel/blocker", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = 'group/rel/blocker' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	lead := make(chan error, 1)
	go func() { lead <- blocker.Release(ctx) }()
	waitUntil(t, "the leading release to wait for the row lock", func() bool { return waitingOnLock(t, ctx, pool) })
	errs := make(chan error, len(ls))
	for _, l := range ls {
		go func() { errs <- l.Release(ctx) }()
	}
	waitUntil(t, "every release to queue", func() bool { _, r := leases.GroupQueued(c); return r == len(ls) })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
	for range ls {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	var released, txs int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT xmin::text) FROM pgfence.lease_events
		WHERE key LIKE 'group/rel/_' AND event = 'released'`).Scan(&released, &txs); err != nil {
		t.Fatal(err)
	}
	if released != len(ls) || txs != 1 {
		t.Errorf("%d release events in %d transactions, want %d in 1", released, txs, len(ls))
	}
	for _, l := range ls {
		if !errors.Is(l.Err(), leases.ErrReleased) {
			t.Errorf("%s: %v, want ErrReleased", l.Key(), l.Err())
		}
		if _, err := c.TryAcquire(ctx, l.Key(), time.Minute, nil); err != nil {
			t.Errorf("%s after its release: %v", l.Key(), err)
		}
	}
}

// Behind PgBouncer in transaction mode (no named prepared statements), a
// batch is one statement like any other: queued grants go together and each
// gets its own answer, and queued releases likewise.
func TestGroupCommitBehindPgBouncer(t *testing.T) {
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	b, err := pgbouncer.Start(ctx, &pgbouncer.Config{Upstream: cluster.Addr(), Credential: cluster.Internal().Credential(), PoolSize: 4})
	if err != nil {
		if errors.Is(err, pgbouncer.ErrNotFound) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	cfg, err := pgxpool.ParseConfig(b.ConnString(db.Name))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, GroupCommit: true})

	var keys []string
	for i := range 12 {
		keys = append(keys, fmt.Sprintf("group/bouncer/%02d", i))
	}
	unblock, results := queueBehindBlockedBatch(t, ctx, db.Pool, c, keys)
	unblock()
	var ls []*leases.Lease
	for _, a := range results() {
		if a.err != nil {
			t.Fatalf("%s behind PgBouncer: %v", a.key, a.err)
		}
		ls = append(ls, a.l)
	}
	var txs int
	if err := db.Pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM pgfence.leases WHERE key LIKE 'group/bouncer/%'`).Scan(&txs); err != nil {
		t.Fatal(err)
	}
	if txs != 1 {
		t.Errorf("the queued grants took %d transactions, want 1", txs)
	}
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Release(ctx); err != nil {
				t.Errorf("%s: %v", l.Key(), err)
			}
		}()
	}
	wg.Wait()
	var live int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_status WHERE key LIKE 'group/bouncer/%' AND live`).Scan(&live); err != nil || live != 0 {
		t.Fatalf("live leases after the releases: %d %v", live, err)
	}
}

// An attempt whose context ends after it was sent (alone, or in a batch)
// has an unknown outcome: the caller hears ErrOutcomeUnknown at once, and
// the settlement in the background leaves the key free (the statement was
// canceled, or the grant it made is released) before Close returns, never
// held by a grant nobody received.
func TestCanceledAfterSentIsSettledBeforeClose(t *testing.T) {
	for _, group := range []bool{false, true} {
		t.Run(fmt.Sprintf("GroupCommit=%v", group), func(t *testing.T) { canceledAfterSentIsSettled(t, group) })
	}
}

func canceledAfterSentIsSettled(t *testing.T, group bool) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, GroupCommit: group})
	unblock := blockKey(t, ctx, pool, c, "group/blocker")
	actx, cancel := context.WithCancelCause(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(actx, "group/blocker", time.Minute, nil)
		got <- err
	}()
	waitUntil(t, "the batch to wait for the row lock", func() bool { return waitingOnLock(t, ctx, pool) })
	cancel(errors.New("gave up while the batch ran"))
	if err := <-got; !errors.Is(err, leases.ErrOutcomeUnknown) {
		t.Fatalf("canceled after its batch was sent: %v, want ErrOutcomeUnknown", err)
	}
	unblock()
	// Close waits for the settlement in the background.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var live bool
	if err := pool.QueryRow(ctx, `SELECT live FROM pgfence.lease_status WHERE key = 'group/blocker'`).Scan(&live); err != nil || live {
		t.Fatalf("after the settlement the key is live=%v (%v): a grant nobody received holds it", live, err)
	}
	other := newClient(t, pool, &leases.Config{DisableWakeups: true})
	if _, err := other.TryAcquire(ctx, "group/blocker", time.Minute, nil); err != nil {
		t.Fatalf("the key after the settlement: %v", err)
	}
}
