package tasks_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// task_ready_keys walks the keys with open tasks under a prefix in key order,
// p_max_keys at a time from after p_after: pages together list each such key
// once, a key whose tasks are all finished or outside the prefix never, and a
// role only the keys whose consumer lease it may take.
func TestReadyKeysPageThroughEveryKey(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	for _, key := range []string{"a/1", "k/1", "k/2", "k/2", "k/3", "k/4", "k/5", "k/6", "kz"} {
		if _, err := db.Pool.Exec(ctx, sqlEnqueue, key, `{}`); err != nil {
			t.Fatal(err)
		}
	}
	// k/6's only task is finished: no key to claim.
	if _, err := db.Pool.Exec(ctx, `UPDATE pgfence.tasks SET state = 'done', seq = 1, finished_at = clock_timestamp() WHERE key = 'k/6'`); err != nil {
		t.Fatal(err)
	}
	ready := func(pool *pgxpool.Pool, max int, after string) []string {
		t.Helper()
		rows, _ := pool.Query(ctx, `SELECT pgfence.task_ready_keys('k/', $1, $2)`, max, after)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	var all []string
	for after, pages := "", 0; ; pages++ {
		page := ready(db.Pool, 2, after)
		if pages > 4 {
			t.Fatalf("more pages than keys: at %v", page)
		}
		all = append(all, page...)
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1]
	}
	if want := []string{"k/1", "k/2", "k/3", "k/4", "k/5"}; !slices.Equal(all, want) {
		t.Errorf("pages of 2 listed %v, want %v", all, want)
	}
	consumer := loginRole(t, ctx, db, "pgfence.task:k/3")
	if got := ready(consumer, 100, ""); !slices.Equal(got, []string{"k/3"}) {
		t.Errorf("a role granted only k/3's consumer lease is offered %v, want [k/3]", got)
	}
	if _, err := consumer.Exec(context.Background(), `SELECT pgfence.task_ready_keys('k/', 0)`); err == nil {
		t.Error("max_keys 0 was accepted")
	}
}
