package migrations_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
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
	pool := pgfencetest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var old []*leases.Lease
	for _, key := range []string{"one-off/1", "one-off/2", "one-off/3"} {
		l, err := c.TryAcquire(ctx, key, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pgfence.Exec(ctx, pool, l, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		old = append(old, l)
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
	if _, err := pgfence.Exec(ctx, pool, live, `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("a retired token of a live lease: %v, want stale", err)
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
