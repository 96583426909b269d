package leases_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// batches records the pgfence.lease_batch statements a pool sends, by their
// element count.
type batches struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batches) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pgfence.lease_batch(") && len(d.Args) > 0 {
		if ops, ok := d.Args[0].([]string); ok {
			b.mu.Lock()
			b.sizes = append(b.sizes, len(ops))
			b.mu.Unlock()
		}
	}
	return ctx
}

func (b *batches) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (b *batches) seen() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.sizes...)
}

// tracedPool opens a pool on url whose lease_batch statements b records.
func tracedPool(t *testing.T, url string, b *batches) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = b
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// acquireResult is one TryAcquire's outcome.
type acquireResult struct {
	key string
	l   *leases.Lease
	err error
}

// stall occupies both batch senders of the group-commit client c: each
// sends a grant attempt for a key whose row another transaction (returned)
// holds locked, and waits for it. Calls made meanwhile queue for the next
// batch. Rolling the transaction back lets both attempts through (they are
// granted); their results arrive on the returned channel.
func stall(t *testing.T, ctx context.Context, admin *pgxpool.Pool, c *leases.Client, keys [2]string) (pgx.Tx, <-chan acquireResult) {
	t.Helper()
	plain := newClient(t, admin, &leases.Config{DisableWakeups: true})
	for _, k := range keys { // rows that exist, released
		l, err := plain.TryAcquire(ctx, k, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = ANY($1) FOR UPDATE`, keys[:]); err != nil {
		t.Fatal(err)
	}
	out := make(chan acquireResult, 2)
	for i, k := range keys {
		go func() {
			l, err := c.TryAcquire(ctx, k, time.Minute, nil)
			out <- acquireResult{k, l, err}
		}()
		waitFor(t, ctx, fmt.Sprintf("%d grant attempt(s) waiting for the locked rows", i+1), func() bool {
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%try_acquire%'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == i+1
		})
	}
	return tx, out
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// tryAll starts a TryAcquire of each key on c; their results arrive on the
// returned channel.
func tryAll(ctx context.Context, c *leases.Client, keys ...string) <-chan acquireResult {
	results := make(chan acquireResult, len(keys))
	for _, k := range keys {
		go func() {
			l, err := c.TryAcquire(ctx, k, time.Minute, nil)
			results <- acquireResult{k, l, err}
		}()
	}
	return results
}

// unstall waits until n calls queue on c, then lets the two stalled grant
// attempts through (rolling back tx) and checks they were granted.
func unstall(t *testing.T, ctx context.Context, c *leases.Client, n int, tx pgx.Tx, stalled <-chan acquireResult) {
	t.Helper()
	waitFor(t, ctx, "the calls to queue", func() bool { return leases.GroupPending(c) == n })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if r := <-stalled; r.err != nil {
			t.Errorf("stalled grant of %s: %v", r.key, r.err)
		}
	}
}

// rowIsLease checks that r's key is held, in the database, by the lease r
// got: its holder and token.
func rowIsLease(t *testing.T, ctx context.Context, pool *pgxpool.Pool, r acquireResult) {
	t.Helper()
	var holder string
	var token int64
	if err := pool.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.leases WHERE key = $1 AND released_at IS NULL`, r.key).Scan(&holder, &token); err != nil {
		t.Fatalf("the row of %s: %v", r.key, err)
	}
	if holder != r.l.Holder() || token != r.l.Token() {
		t.Errorf("%s: the lease says holder %s token %d, the row %s %d", r.key, r.l.Holder(), r.l.Token(), holder, token)
	}
}

// Calls that overlap go as one statement, and each keeps its own result: a
// refused call (paused prefix) and a lost race (two callers, one key) do
// not change the others'; releases ride in the same batch.
// Both with pgx's prepared statements and with its simple protocol (which
// writes the arrays into the SQL text).
func TestGroupCommitBatchesOverlappingCalls(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := pgfencetest.NewDatabase(t)
			sep := "?"
			if strings.Contains(db.URL, "?") {
				sep = "&"
			}
			testGroupCommitBatches(t, db, db.URL+sep+"default_query_exec_mode="+mode)
		})
	}
}

func testGroupCommitBatches(t *testing.T, db *pgfencetest.Database, url string) {
	ctx := ctxTimeout(t, time.Minute)
	var seen batches
	c := newClient(t, tracedPool(t, url, &seen), &leases.Config{DisableWakeups: true, GroupCommit: true})

	held, err := c.TryAcquire(ctx, "g/release-me", time.Minute, nil) // alone: not a batch
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.pause_grants('g/paused/', 'test')`); err != nil {
		t.Fatal(err)
	}
	tx, stalled := stall(t, ctx, db.Pool, c, [2]string{"g/stall-1", "g/stall-2"})

	keys := []string{"g/a", "g/b", "g/c", "g/same", "g/same", "g/paused/1"}
	results := tryAll(ctx, c, keys...)
	released := make(chan error, 1)
	go func() { released <- held.Release(ctx) }()
	unstall(t, ctx, c, len(keys)+1, tx, stalled)
	if err := <-released; err != nil {
		t.Errorf("Release in the batch: %v", err)
	}
	granted := map[string]int{}
	for range keys {
		r := <-results
		switch {
		case r.key == "g/paused/1":
			if !errors.Is(r.err, leases.ErrGrantsPaused) || pgerr.Code(r.err) != pgerr.CodeGrantsPaused {
				t.Errorf("TryAcquire(%s) in a batch: %v, want ErrGrantsPaused (PF011)", r.key, r.err)
			}
		case r.key == "g/same" && errors.Is(r.err, leases.ErrLeaseHeld):
		case r.err != nil:
			t.Errorf("TryAcquire(%s) in a batch: %v", r.key, r.err)
		default:
			granted[r.key]++
			rowIsLease(t, ctx, db.Pool, r)
		}
	}
	for _, k := range []string{"g/a", "g/b", "g/c", "g/same"} {
		if granted[k] != 1 {
			t.Errorf("%s granted %d times, want once", k, granted[k])
		}
	}
	var live bool
	if err := db.Pool.QueryRow(ctx, `SELECT live FROM pgfence.lease_status WHERE key = 'g/release-me'`).Scan(&live); err != nil || live {
		t.Errorf("g/release-me after its release in a batch: live %v, %v", live, err)
	}
	if got := seen.seen(); len(got) != 1 || got[0] != len(keys)+1 {
		t.Errorf("lease_batch statements by element count: %v, want one of %d", got, len(keys)+1)
	}
}

// A batch whose reply is lost after its commit: each caller settles its own
// grant as a lost reply and gets its lease; nothing is granted twice or
// left held without a holder that knows it.
func TestGroupCommitLostBatchReply(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, time.Minute)
	db := pgfencetest.NewDatabase(t)
	proxy := newProxy(t, db.URL)
	var seen batches
	url, err := proxy.ConnString(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, tracedPool(t, url, &seen), &leases.Config{DisableWakeups: true, GroupCommit: true})
	tx, stalled := stall(t, ctx, db.Pool, c, [2]string{"lost/stall-1", "lost/stall-2"})

	cut := proxy.CutAfter(faultproxy.SQLContains("pgfence.lease_batch("))
	keys := []string{"lost/a", "lost/b", "lost/c"}
	results := tryAll(ctx, c, keys...)
	unstall(t, ctx, c, len(keys), tx, stalled)
	for range keys {
		r := <-results
		if r.err != nil {
			t.Errorf("TryAcquire(%s), its batch's reply lost after the commit: %v, want the lease it was granted", r.key, r.err)
			continue
		}
		rowIsLease(t, ctx, db.Pool, r)
		if err := r.l.Release(ctx); err != nil {
			t.Errorf("Release(%s): %v", r.key, err)
		}
	}
	if !cut.Fired() || !cut.Replied() {
		t.Fatalf("the cut after lease_batch: fired %v, the server finished %v", cut.Fired(), cut.Replied())
	}
	if got := seen.seen(); len(got) != 1 || got[0] != len(keys) {
		t.Errorf("lease_batch statements by element count: %v, want one of %d", got, len(keys))
	}
}

// A call whose context ends while it waits for a batch is not sent: it
// returns the context's error and the key stays free.
func TestGroupCommitCallGivenUpWhileQueued(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, time.Minute)
	db := pgfencetest.NewDatabase(t)
	var seen batches
	c := newClient(t, tracedPool(t, db.URL, &seen), &leases.Config{DisableWakeups: true, GroupCommit: true})
	tx, stalled := stall(t, ctx, db.Pool, c, [2]string{"q/stall-1", "q/stall-2"})

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := c.TryAcquire(short, "q/given-up", time.Minute, nil)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, leases.ErrOutcomeUnknown) {
		t.Errorf("TryAcquire whose deadline passed in the queue: %v, want the deadline, not an unknown outcome", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if r := <-stalled; r.err != nil {
			t.Errorf("stalled grant of %s: %v", r.key, r.err)
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE key = 'q/given-up'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("rows of the given-up key: %d, %v; want none", n, err)
	}
	if got := seen.seen(); len(got) != 0 {
		t.Errorf("lease_batch statements: %v, want none", got)
	}
	if l, err := c.TryAcquire(ctx, "q/given-up", time.Minute, nil); err != nil {
		t.Errorf("the key after: %v", err)
	} else {
		_ = l.Release(ctx)
	}
}

// Many goroutines of one group-commit client contending for a few keys:
// never two live holders of a key, and every grant's token is above the
// key's previous one.
func TestGroupCommitMutualExclusion(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, time.Minute)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, GroupCommit: true})
	const workers, rounds, keys = 16, 40, 3
	var (
		mu      sync.Mutex
		holding = map[string]bool{}
		last    = map[string]int64{}
		grants  int
		wg      sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				key := fmt.Sprintf("mx/%d", (w+i)%keys)
				l, err := c.TryAcquire(ctx, key, time.Minute, nil)
				if errors.Is(err, leases.ErrLeaseHeld) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if holding[key] {
					t.Errorf("%s granted (token %d) while another goroutine holds it", key, l.Token())
				}
				if l.Token() <= last[key] {
					t.Errorf("%s granted token %d after %d", key, l.Token(), last[key])
				}
				holding[key], last[key] = true, l.Token()
				grants++
				mu.Unlock()
				// Hold it for a while: a second grant of the key meanwhile
				// finds holding set.
				time.Sleep(time.Millisecond)
				mu.Lock()
				holding[key] = false
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if grants == 0 {
		t.Fatal("no grants")
	}
}

// A grant whose key's row another transaction holds locked does not hold up
// its batch: it waits only groupLockWait there, then is sent on its own and
// waits as long as the lock is held, while the rest of its batch returns.
func TestGroupCommitLockedRowWaitsAlone(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, time.Minute)
	db := pgfencetest.NewDatabase(t)
	var seen batches
	c := newClient(t, tracedPool(t, db.URL, &seen), &leases.Config{DisableWakeups: true, GroupCommit: true})
	plain := newClient(t, db.Pool, &leases.Config{DisableWakeups: true})
	l, err := plain.TryAcquire(ctx, "lk/slow", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	locker, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(context.Background()) }()
	if _, err := locker.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = 'lk/slow' FOR SHARE`); err != nil {
		t.Fatal(err)
	}
	tx, stalled := stall(t, ctx, db.Pool, c, [2]string{"lk/stall-1", "lk/stall-2"})

	results := tryAll(ctx, c, "lk/slow", "lk/a", "lk/b")
	unstall(t, ctx, c, 3, tx, stalled)
	// lk/a and lk/b come back while lk/slow's row is still locked.
	for range 2 {
		select {
		case r := <-results:
			if r.key == "lk/slow" || r.err != nil {
				t.Fatalf("while lk/slow's row is locked: %s returned %v", r.key, r.err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the rest of the batch waited for the locked row")
		}
	}
	waitFor(t, ctx, "lk/slow's grant to wait on its own", func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%try_acquire%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-results; r.key != "lk/slow" || r.err != nil {
		t.Fatalf("after the lock went: %s %v, want lk/slow granted", r.key, r.err)
	}
	if got := seen.seen(); len(got) != 1 || got[0] != 3 {
		t.Errorf("lease_batch statements by element count: %v, want one of 3", got)
	}
}

// On a schema migrated before batches came (no pgfence.lease_batch), group
// commit sends each call on its own: the calls of the refused batch and
// every later one succeed, with prepared statements and with the simple
// protocol (where the refusal arrives with the result, not at Prepare).
func TestGroupCommitOnASchemaWithoutBatches(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := ctxTimeout(t, time.Minute)
			db := pgfencetest.NewDatabase(t)
			if _, err := db.Pool.Exec(ctx, `DROP FUNCTION pgfence.lease_batch`); err != nil {
				t.Fatal(err)
			}
			sep := "?"
			if strings.Contains(db.URL, "?") {
				sep = "&"
			}
			var seen batches
			c := newClient(t, tracedPool(t, db.URL+sep+"default_query_exec_mode="+mode, &seen), &leases.Config{DisableWakeups: true, GroupCommit: true})
			tx, stalled := stall(t, ctx, db.Pool, c, [2]string{"old/stall-1", "old/stall-2"})
			keys := []string{"old/a", "old/b", "old/c"}
			results := tryAll(ctx, c, keys...)
			unstall(t, ctx, c, len(keys), tx, stalled)
			var held []*leases.Lease
			for range keys {
				r := <-results
				if r.err != nil {
					t.Errorf("TryAcquire(%s) whose batch the schema refused: %v", r.key, r.err)
					continue
				}
				held = append(held, r.l)
			}
			if got := seen.seen(); len(got) != 1 {
				t.Errorf("lease_batch statements: %v, want the one refused", got)
			}
			// Later calls, concurrent ones included, go on their own.
			errs := make(chan error, len(held))
			for _, l := range held {
				go func() { errs <- l.Release(ctx) }()
			}
			for range held {
				if err := <-errs; err != nil {
					t.Errorf("Release: %v", err)
				}
			}
			if got := seen.seen(); len(got) != 1 {
				t.Errorf("lease_batch statements after the refusal: %v, want none more", got)
			}
		})
	}
}
