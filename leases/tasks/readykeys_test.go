package tasks_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/migrations"
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

// A probe goes from key to key, not from task to task: listing the keys of
// one prefix reads a few index entries per key with open tasks, however many
// tasks another prefix's hot key holds between them. Under the C collation
// of the test cluster, and under an ICU collation (en-US), where the keys of
// a prefix are not one range of the index.
func TestReadyKeysSkipOtherKeysTasks(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	t.Run("C", func(t *testing.T) { readyKeysReadFewEntries(t, ctx, db.Pool) })
	t.Run("ICU en-US", func(t *testing.T) {
		name := db.Name + "_icu"
		if _, err := db.Pool.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()+
			` TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'`); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = db.Pool.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
		})
		cfg, err := pgxpool.ParseConfig(db.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.Database = name
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if err := migrations.Up(ctx, pool); err != nil {
			t.Fatal(err)
		}
		readyKeysReadFewEntries(t, ctx, pool)
	})
}

func readyKeysReadFewEntries(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	for _, key := range []string{"a/1", "c/1"} {
		if _, err := pool.Exec(ctx, sqlEnqueue, key, `{}`); err != nil {
			t.Fatal(err)
		}
	}
	const hot = 3000
	if _, err := pool.Exec(ctx, `SELECT count(pgfence.task_enqueue('b/hot', pg_catalog.jsonb_build_object('i', g))) FROM generate_series(1, $1) g`, hot); err != nil {
		t.Fatal(err)
	}
	// Each prefix several times: PL/pgSQL plans the probes for any prefix
	// after a few calls.
	for _, prefix := range []string{"c/", "a/", "", "c/", "a/", "", "c/", "a/", "", "c/", "a/", "", "c/", "a/", ""} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The entries this backend read and did not report yet, before and
		// after: their difference is the call's.
		const sqlRead = `SELECT pg_stat_get_xact_tuples_returned('pgfence.tasks_open'::regclass)`
		var before, read int64
		if err := tx.QueryRow(ctx, sqlRead).Scan(&before); err != nil {
			t.Fatal(err)
		}
		rows, _ := tx.Query(ctx, `SELECT pgfence.task_ready_keys($1)`, prefix)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][]string{"c/": {"c/1"}, "a/": {"a/1"}, "": {"a/1", "b/hot", "c/1"}}[prefix]
		if !slices.Equal(keys, want) {
			t.Errorf("keys under %q: %v, want %v", prefix, keys, want)
		}
		if err := tx.QueryRow(ctx, sqlRead).Scan(&read); err != nil {
			t.Fatal(err)
		}
		if read -= before; read > 20 {
			t.Errorf("listing %q read %d index entries of tasks_open, past b/hot's %d tasks one by one", prefix, read, hot)
		}
		_ = tx.Rollback(ctx)
	}
}
