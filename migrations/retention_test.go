package migrations_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/pyclient"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Retention of the rows kept per key and resource: raising the floor retires
// every token at or below it (fenced writes refuse them), and PruneRetired
// then deletes the rows that only remember retired tokens. A key used again
// later starts above the floor, and a holder of a retired token is refused
// whether or not its rows are gone.
func TestPruneRetired(t *testing.T) {
	r := newRetentionRig(t)
	ctx, pool, c := r.ctx, r.pool, r.client
	var old []*leases.Lease
	for _, key := range []string{"one-off/1", "one-off/2", "one-off/3"} {
		old = append(old, r.acquireAndWrite(key))
	}
	live := old[2]
	for _, l := range old[:2] {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing is retired before the floor moves.
	if p, err := pgfence.PruneRetired(ctx, pool, 100); err != nil || p != (pgfence.Pruned{}) {
		t.Fatalf("prune before the floor moved: %+v %v", p, err)
	}
	top, err := pgfence.MaxStoredToken(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.RaiseTokenFloor(ctx, pool, top, "retire the one-off keys"); err != nil {
		t.Fatal(err)
	}
	// The live lease's token is retired too: its holder must acquire again.
	if _, err := pgfence.Exec(ctx, pool, live, `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) ||
		!strings.Contains(err.Error(), "are retired") {
		t.Fatalf("a retired token of a live lease: %v, want stale, saying the floor retired it", err)
	}
	p, err := pgfence.PruneRetired(ctx, pool, 100)
	if err != nil || p.Leases != 2 || p.Fences != 3 || p.Events < 2 {
		t.Fatalf("prune: %+v %v; want the two released leases, three fences, their events", p, err)
	}
	if p, err := pgfence.PruneRetired(ctx, pool, 100); err != nil || p != (pgfence.Pruned{}) {
		t.Fatalf("second prune: %+v %v, want nothing left", p, err)
	}
	// A retired token stays refused without its rows; a new grant starts
	// above the floor and writes.
	_, err = pgfence.Exec(ctx, pool, old[0], `SELECT 1`)
	if !errors.Is(err, pgfence.ErrTokenNotIssued) && !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("a retired token after its rows went: %v, want refused", err)
	}
	l, err := c.TryAcquire(ctx, "one-off/1", time.Minute, nil)
	if err != nil || l.Token() <= top {
		t.Fatalf("grant after the prune: %v, %v; want a token above %d", l, err, top)
	}
	if _, err := pgfence.Exec(ctx, pool, l, `SELECT 1`); err != nil {
		t.Fatalf("the new holder: %v", err)
	}
	// Accepted tokens above the floor are still never deleted.
	if _, err := pool.Exec(ctx, `DELETE FROM pgfence.fences WHERE resource = 'one-off/1'`); pgerr.Code(err) != pgerr.CodeStaleToken {
		t.Fatalf("deleting a fence row above the floor: %v, want PF001", err)
	}
}

// pgfence.prune_lease_events keeps the newest events of a key and leaves the
// other keys' alone; with no key it prunes every key. Grants prune their own
// key this way as they go.
func TestPruneLeaseEvents(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Events written directly (as the owner): ids ascend with insertion.
	if _, err := pool.Exec(ctx, `INSERT INTO pgfence.lease_events (key, event, holder, token)
		SELECT k, 'acquired', gen_random_uuid(), n FROM unnest(ARRAY['prune/a', 'prune/b', 'prune/c']) k, generate_series(1, 10) n
		ORDER BY k, n`); err != nil {
		t.Fatal(err)
	}
	tokens := func(key string) []int64 {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT token FROM pgfence.lease_events WHERE key = $1 ORDER BY id`, key)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	prune := func(key any, keep int) int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, `SELECT pgfence.prune_lease_events($1, $2)`, key, keep).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := prune("prune/a", 3); n != 7 {
		t.Fatalf("pruned %d events of prune/a to keep 3, want 7", n)
	}
	if got := tokens("prune/a"); !slices.Equal(got, []int64{8, 9, 10}) {
		t.Fatalf("prune/a kept %v, want its newest three [8 9 10]", got)
	}
	if got := tokens("prune/b"); len(got) != 10 {
		t.Fatalf("pruning prune/a touched prune/b: %v", got)
	}
	if n := prune("prune/a", 5); n != 0 {
		t.Fatalf("keeping more than there are deleted %d", n)
	}
	if n := prune("prune/c", 0); n != 10 || len(tokens("prune/c")) != 0 {
		t.Fatalf("keep 0 deleted %d, left %v", n, tokens("prune/c"))
	}
	if n := prune(nil, 2); n != 1+8 {
		t.Fatalf("pruning every key to 2 deleted %d, want 9", n)
	}
	if a, b := tokens("prune/a"), tokens("prune/b"); !slices.Equal(a, []int64{9, 10}) || !slices.Equal(b, []int64{9, 10}) {
		t.Fatalf("every key pruned to 2: a %v b %v", a, b)
	}
}

// The retention floor prunes ended leases and old fence rows without
// retiring a live holder's token: after AdvanceRetention the newest token of
// every key keeps writing, a superseded one is refused even though its
// successor has not written yet, the rows go an hour after their lease ended
// or their write was accepted, and a key used again starts above the floor.
func TestAdvanceRetention(t *testing.T) {
	r := newRetentionRig(t)
	ctx, pool, c := r.ctx, r.pool, r.client
	ended := []*leases.Lease{r.acquireAndWrite("once/1"), r.acquireAndWrite("once/2")}
	live := r.acquireAndWrite("once/3")
	for _, l := range ended {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A superseded holder: its successor holds the key but has not written,
	// so the fence row alone still takes the old token.
	first := r.acquireAndWrite("reused")
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := c.TryAcquire(ctx, "reused", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, pool, first, `SELECT 1`); err != nil {
		t.Fatalf("a superseded token before the retention floor moved: %v, want accepted (no newer write)", err)
	}

	retention, err := pgfence.AdvanceRetention(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if retention < second.Token() {
		t.Fatalf("retention floor %d is below the newest token granted, %d", retention, second.Token())
	}
	state, err := pgfence.TokenFloor(ctx, pool)
	if err != nil || state.Retention != retention || state.RetentionAt.IsZero() || state.Floor != 0 {
		t.Fatalf("token floor state %+v, %v; want retention %d, the floor untouched", state, err, retention)
	}
	// The newest tokens keep working; the superseded one is refused.
	for _, l := range []*leases.Lease{live, second} {
		if _, err := pgfence.Exec(ctx, pool, l, `SELECT 1`); err != nil {
			t.Fatalf("the holder of %s after the retention floor moved: %v, want accepted", l.Key(), err)
		}
	}
	if _, err := pgfence.Exec(ctx, pool, first, `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) ||
		!strings.Contains(err.Error(), "superseded tokens up to") {
		t.Fatalf("a superseded token at or below the retention floor: %v, want stale, saying the retention floor retired it", err)
	}

	// Within the hour nothing goes.
	if p, err := pgfence.PruneRetired(ctx, pool, 100); err != nil || p != (pgfence.Pruned{}) {
		t.Fatalf("prune within the hour: %+v %v, want nothing", p, err)
	}
	backdate(t, pool, 2*time.Hour, "once/1", "once/2")
	p, err := pgfence.PruneRetired(ctx, pool, 100)
	// The ended leases once/1 and once/2 (reused and once/3 are live), every
	// fence row (all written at or below the retention floor), the history of
	// the pruned leases.
	if err != nil || p.Leases != 2 || p.Fences != 4 || p.Events < 4 {
		t.Fatalf("prune after the hour: %+v %v; want 2 leases, 4 fences, their events", p, err)
	}
	if p, err := pgfence.PruneRetired(ctx, pool, 100); err != nil || p != (pgfence.Pruned{}) {
		t.Fatalf("second prune: %+v %v, want nothing left", p, err)
	}
	// A live holder whose fence row went writes on: its token is its key's
	// newest. The superseded one stays refused without the row.
	if _, err := pgfence.Exec(ctx, pool, live, `SELECT 1`); err != nil {
		t.Fatalf("a live holder after its fence row was pruned: %v", err)
	}
	if _, err := pgfence.Exec(ctx, pool, first, `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("a superseded token after its fence row was pruned: %v, want stale", err)
	}
	// A holder of a pruned lease is refused; the key's next grant starts
	// above the retention floor, and then the old token is superseded.
	if _, err := pgfence.Exec(ctx, pool, ended[0], `SELECT 1`); !errors.Is(err, pgfence.ErrTokenNotIssued) {
		t.Fatalf("the token of a pruned lease: %v, want not issued", err)
	}
	again := r.acquireAndWrite("once/1")
	if again.Token() <= retention {
		t.Fatalf("grant of a pruned key: token %d, want above the retention floor %d", again.Token(), retention)
	}
	if _, err := pgfence.Exec(ctx, pool, ended[0], `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("the token of a pruned lease after the key's next grant: %v, want stale", err)
	}
	// A fence row above the retention floor is still never deleted.
	if _, err := pool.Exec(ctx, `DELETE FROM pgfence.fences WHERE resource = 'once/1'`); pgerr.Code(err) != pgerr.CodeStaleToken {
		t.Fatalf("deleting a fence row above the retention floor: %v, want PF001", err)
	}
	// Advancing again moves past the tokens granted since.
	next, err := pgfence.AdvanceRetention(ctx, pool)
	if err != nil || next < again.Token() {
		t.Fatalf("second advance: %d %v, want at least %d", next, err, again.Token())
	}
	// It never passes 2^62, the largest floor: tokens above it are refused
	// with a clear error, not a constraint violation.
	if _, err := pgfence.RaiseTokenFloor(ctx, pool, 1<<62, "the end of the range"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(ctx, "past-the-floor", time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.AdvanceRetention(ctx, pool); !errors.Is(err, pgfence.ErrInvalid) || pgerr.Code(err) != pgerr.CodeInvalid {
		t.Fatalf("advance past 2^62: %v, want PF008", err)
	}
}

// One-off keys (a lease and a fenced write each, never used again, through
// the SQL functions) keep the tables flat when the retention floor advances
// and prune_retired runs on a schedule: an hour after each cycle none of its
// rows are left, however many cycles ran before.
func TestRetentionKeepsOneOffKeysFlat(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const perCycle, cycles = 200, 6
	count := func() (leaseRows, fenceRows int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgfence.leases), (SELECT count(*) FROM pgfence.fences)`).Scan(&leaseRows, &fenceRows); err != nil {
			t.Fatal(err)
		}
		return leaseRows, fenceRows
	}
	for cycle := range cycles {
		// perCycle one-off keys, each granted, fenced and released, as a
		// client of the SQL functions would.
		if _, err := pool.Exec(ctx, `
			SELECT pgfence.fence(s.k, a.token), pgfence.release(s.k, a.holder, a.token)
			  FROM (SELECT 'one-off/' || $1::int || '/' || n AS k FROM generate_series(1, $2::int) n) s,
			       LATERAL pgfence.try_acquire(s.k, interval '1 minute') a`, cycle, perCycle); err != nil {
			t.Fatal(err)
		}
		if _, err := pgfence.AdvanceRetention(ctx, pool); err != nil {
			t.Fatal(err)
		}
		// An hour passes before the next cycle's maintenance.
		backdate(t, pool, 61*time.Minute)
		for {
			p, err := pgfence.PruneRetired(ctx, pool, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if p == (pgfence.Pruned{}) {
				break
			}
		}
		leaseRows, fenceRows := count()
		t.Logf("cycle %d: %d lease rows, %d fence rows", cycle, leaseRows, fenceRows)
		if leaseRows != 0 || fenceRows != 0 {
			t.Fatalf("cycle %d: %d lease rows and %d fence rows left after the prune, want none (every key of the cycle ended over an hour ago)", cycle, leaseRows, fenceRows)
		}
	}
	var granted int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_events WHERE event = 'acquired'`).Scan(&granted); err != nil {
		t.Fatal(err)
	}
	if granted != 0 {
		t.Fatalf("%d grant events of pruned keys left", granted)
	}
}

// backdate moves every fence row, and the lease rows of keys (every lease
// row when none is named), d into the past, as if that much time had passed
// since they were written.
func backdate(t *testing.T, pool *pgxpool.Pool, d time.Duration, keys ...string) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `UPDATE pgfence.leases SET granted_at = granted_at - $1::interval, renewed_at = renewed_at - $1::interval,
		        expires_at = expires_at - $1::interval, released_at = released_at - $1::interval
		  WHERE coalesce(cardinality($2::text[]), 0) = 0 OR key = ANY ($2::text[])`, d, keys); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgfence.fences SET accepted_at = accepted_at - $1::interval`, d); err != nil {
		t.Fatal(err)
	}
}

// A Python client (psycopg2, every statement in a transaction it opened)
// meets the retention floor as the Go packages do: once it advanced, a
// superseded token is refused with PF001 inside the client's transaction,
// which it rolls back, and the key's newest token writes.
func TestRetentionFromPsycopg2(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	script := `
import sys, psycopg2
conn = psycopg2.connect(sys.argv[1])
cur = conn.cursor()
cur.execute("SELECT holder, token FROM pgfence.try_acquire('py/r', interval '1 minute')")
h1, t1 = cur.fetchone()
cur.execute("SELECT pgfence.fence('py/r', %s)", (t1,))
cur.execute("SELECT released FROM pgfence.release('py/r', %s, %s)", (h1, t1))
conn.commit()
cur.execute("SELECT token FROM pgfence.try_acquire('py/r', interval '1 minute')")
t2 = cur.fetchone()[0]
conn.commit()
cur.execute("SELECT pgfence.advance_retention() >= %s", (t2,))
print("advanced", cur.fetchone()[0])
conn.commit()
try:
    cur.execute("SELECT pgfence.fence('py/r', %s)", (t1,))
    print("superseded accepted")
except psycopg2.Error as e:
    print("superseded", e.pgcode)
    conn.rollback()
cur.execute("SELECT pgfence.fence('py/r', %s) = %s", (t2, t2))
print("newest", cur.fetchone()[0])
conn.commit()
`
	lines := pyclient.Run(t, db.URL, script)
	want := []string{"advanced True", "superseded PF001", "newest True"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("psycopg2 printed\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// retentionRig is a database with a leases client, for the retention tests.
type retentionRig struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	client *leases.Client
}

func newRetentionRig(t *testing.T) *retentionRig {
	t.Helper()
	pool := pgfencetest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &retentionRig{t: t, ctx: ctx, pool: pool, client: c}
}

// acquireAndWrite grants key and makes one fenced write with its token.
func (r *retentionRig) acquireAndWrite(key string) *leases.Lease {
	r.t.Helper()
	l, err := r.client.TryAcquire(r.ctx, key, time.Minute, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := pgfence.Exec(r.ctx, r.pool, l, `SELECT 1`); err != nil {
		r.t.Fatalf("%s: %v", key, err)
	}
	return l
}

// The retention floor is durable before advance_retention returns, on a
// server whose default is synchronous_commit = off and whose WAL writer
// waits 10 s: every server process SIGKILLed right after it leaves the floor
// in place, so a superseded token whose fence row still takes it stays
// refused. After prune_retired and a second crash (whether or not the
// prune's own commit survived), the pruned key's old tokens stay refused
// and its next grant starts above the floor.
func TestRetentionSurvivesACrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster := pgfencetest.NewCluster(t, &pgfencetest.ClusterOptions{
		Settings: map[string]string{"synchronous_commit": "off", "wal_writer_delay": "10s"}})
	db := cluster.NewDatabase(t)
	pool := db.Pool
	crash := func() {
		t.Helper()
		if err := cluster.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := cluster.Start(ctx); err != nil {
			t.Fatalf("start after the crash: %v", err)
		}
		pool.Reset()
	}
	c, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The first holder writes and releases; the second holds the key but
	// has not written, so the fence row alone would still take the first
	// holder's token.
	first, err := c.TryAcquire(ctx, "crash/1", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, pool, first, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := c.TryAcquire(ctx, "crash/1", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	retention, err := pgfence.AdvanceRetention(ctx, pool)
	if err != nil || retention < second.Token() {
		t.Fatalf("advance: %d %v, want at least %d", retention, err, second.Token())
	}
	crash()
	state, err := pgfence.TokenFloor(ctx, pool)
	if err != nil || state.Retention != retention || state.RetentionAt.IsZero() {
		t.Fatalf("after a crash right after advance_retention: %+v %v, want retention %d (its commit must be durable)", state, err, retention)
	}
	if _, err := pgfence.Exec(ctx, pool, first, `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("the superseded token after the crash: %v, want stale", err)
	}

	// Prune the ended lease and the fence row, then crash again.
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	backdate(t, pool, 2*time.Hour)
	if p, err := pgfence.PruneRetired(ctx, pool, 100); err != nil || p.Leases != 1 || p.Fences != 1 {
		t.Fatalf("prune: %+v %v, want the lease row and the fence row of crash/1", p, err)
	}
	// The release and the prune may commit with synchronous_commit = off
	// (this cluster's setting): a crash may undo both, and the key is then
	// still held by the second holder. Make them durable, as the WAL writer
	// would, so that the crash tests the retention floor against a pruned key.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	crash()
	if _, err := pgfence.Exec(ctx, pool, first, `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) && !errors.Is(err, pgfence.ErrTokenNotIssued) {
		t.Fatalf("the first holder's token after the prune and a crash: %v, want refused", err)
	}
	third, err := c.TryAcquire(ctx, "crash/1", time.Minute, nil)
	if err != nil || third.Token() <= retention {
		t.Fatalf("grant after the prune and a crash: %v %v, want a token above the retention floor %d", third, err, retention)
	}
	if _, err := pgfence.Exec(ctx, pool, third, `SELECT 1`); err != nil {
		t.Fatalf("the new holder: %v", err)
	}
	for _, l := range []*leases.Lease{first, second} {
		if _, err := pgfence.Exec(ctx, pool, l, `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) {
			t.Fatalf("token %d after the key's next grant: %v, want stale", l.Token(), err)
		}
	}
}
