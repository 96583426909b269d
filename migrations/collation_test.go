package migrations_test

import (
	"context"
	"io/fs"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A key that reaches the SQL functions with a collation other than the
// database's default — a column declared COLLATE "C", a value of type name
// such as current_user — still finds its row through the primary key. A
// PL/pgSQL function compares its parameters in the collation they arrive
// with, and an index of the default collation cannot answer a comparison in
// another one: without the functions' explicit COLLATE, every such call read
// the whole table.
func TestKeysOfAnotherCollationUseTheIndex(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Enough rows that the planner prefers the index for one key.
	if _, err := pool.Exec(ctx, `
		INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at, released_at)
		SELECT 'coll/' || g, gen_random_uuid(), 1, t, t, t
		  FROM generate_series(1, 5000) g, (SELECT clock_timestamp() - interval '1 hour' AS t) c;
		SELECT count(pgfence.fence('coll/' || g, 1)) FROM generate_series(1, 5000) g;
		INSERT INTO pgfence.idempotency_keys (scope, key, fingerprint, mode, status, result, retention, completed_at, expires_at)
		SELECT 'coll', 'k' || g, sha256(g::text::bytea), 'atomic', 'succeeded', '\x6f6b', interval '1 day', t, t + interval '1 day'
		  FROM generate_series(1, 5000) g, (SELECT clock_timestamp() AS t) c;
		ANALYZE pgfence.leases, pgfence.fences, pgfence.idempotency_keys`); err != nil {
		t.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var holder string
	var token int64
	if err := tx.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.try_acquire('coll/7' COLLATE "C", interval '1 minute')`).Scan(&holder, &token); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		sql  string
		args []any
	}{
		{`SELECT pgfence.renew('coll/7' COLLATE "C", $1::uuid, $2, interval '1 minute')`, []any{holder, token}},
		{`SELECT pgfence.check_lease('coll/7' COLLATE "C", $1::uuid, $2)`, []any{holder, token}},
		{`SELECT pgfence.fence('coll/7' COLLATE "C", $1)`, []any{token}},
		{`SELECT pgfence.release('coll/7' COLLATE "C", $1::uuid, $2)`, []any{holder, token}},
		{`SELECT pgfence.fence('coll/8' COLLATE "C", 1)`, nil},
		// current_user is of type name, whose collation is "C".
		{`SELECT acquired FROM pgfence.try_acquire(current_user, interval '1 minute')`, nil},
		{`SELECT outcome FROM pgfence.idempotency_claim_atomic('coll' COLLATE "C", 'k9' COLLATE "C", sha256('9'::bytea), interval '1 second', interval '1 day')`, nil},
		{`SELECT outcome FROM pgfence.idempotency_claim_atomic('coll' COLLATE "C", 'new' COLLATE "C", sha256('new'::bytea), interval '1 second', interval '1 day')`, nil},
		{`SELECT pgfence.idempotency_complete_atomic('coll' COLLATE "C", 'new' COLLATE "C", 'ok'::bytea)`, nil},
		{`SELECT outcome FROM pgfence.idempotency_claim('coll' COLLATE "C", 'leased' COLLATE "C", sha256('l'::bytea), interval '1 minute', interval '1 day')`, nil},
	}
	for _, s := range steps {
		if _, err := tx.Exec(ctx, s.sql, s.args...); err != nil {
			t.Fatalf("%s: %v", s.sql, err)
		}
	}
	rows, err := tx.Query(ctx, `SELECT relname::text, seq_scan FROM pg_stat_xact_user_tables
		WHERE schemaname = 'pgfence' AND relname IN ('leases', 'fences', 'idempotency_keys') ORDER BY relname`)
	if err != nil {
		t.Fatal(err)
	}
	scans, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Table string
		Scans int64
	}])
	if err != nil {
		t.Fatal(err)
	}
	if len(scans) != 3 {
		t.Fatalf("statistics of %d tables, want 3: %+v", len(scans), scans)
	}
	for _, s := range scans {
		if s.Scans != 0 {
			t.Errorf("pgfence.%s: %d sequential scans for keys of collation \"C\", want none", s.Table, s.Scans)
		}
	}
}

// A key compared in a case-insensitive (nondeterministic) collation is still
// its own key: 'CASE/1' is not the lease of 'case/1', its grant does not land
// in that row, and a paused prefix is compared with it (PostgreSQL refuses
// starts_with in a nondeterministic collation).
func TestKeysOfACaseInsensitiveCollationStayExact(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE COLLATION public.pgfence_test_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`)
	if pgerr.Code(err) == "0A000" {
		t.Skipf("this server has no ICU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// A paused prefix makes every grant compare its key with the prefix.
	if _, err := pool.Exec(ctx, `SELECT pgfence.pause_grants('elsewhere/', 'a pause that concerns other keys')`); err != nil {
		t.Fatal(err)
	}
	var lower, upper int64
	var acquired bool
	if err := pool.QueryRow(ctx, `SELECT acquired, token FROM pgfence.try_acquire('case/1', interval '1 minute')`).Scan(&acquired, &lower); err != nil || !acquired {
		t.Fatalf("case/1: acquired %v, %v", acquired, err)
	}
	if err := pool.QueryRow(ctx, `SELECT acquired, coalesce(token, 0) FROM pgfence.try_acquire('CASE/1' COLLATE public.pgfence_test_ci, interval '1 minute')`).Scan(&acquired, &upper); err != nil || !acquired {
		t.Fatalf("CASE/1 in a case-insensitive collation: acquired %v, %v (held by case/1's grant?)", acquired, err)
	}
	var keys []string
	rows, err := pool.Query(ctx, `SELECT key FROM pgfence.leases WHERE lower(key) = 'case/1' AND released_at IS NULL ORDER BY key COLLATE "C"`)
	if err == nil {
		keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(keys) != 2 || keys[0] != "CASE/1" || keys[1] != "case/1" {
		t.Errorf("live lease rows %q (%v), want CASE/1 and case/1", keys, err)
	}
	// Its fenced write records CASE/1's fence row, not case/1's.
	if _, err := pool.Exec(ctx, `SELECT pgfence.fence('CASE/1' COLLATE public.pgfence_test_ci, $1)`, upper); err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT resource FROM pgfence.fences WHERE lower(resource) = 'case/1'`)
	if err == nil {
		keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(keys) != 1 || keys[0] != "CASE/1" {
		t.Errorf("fence rows %q (%v), want CASE/1's only", keys, err)
	}
}

// Every comparison of a table's key column with a function's parameter (p_…
// or an element of one, p_…[i], or the parameters of fence and check_lease, named after their columns),
// and every starts_with on a parameter, names the default collation: a function
// added without it passes every test that calls it with ordinary text, and
// reads the whole table (or fails) for a caller whose key has another
// collation.
func TestKeyComparisonsNameTheirCollation(t *testing.T) {
	compare := regexp.MustCompile(`\b\w+\.(?:key|resource|scope|prefix) = (?:p_\w+(?:\[\w+\])?|fence\.resource\b|check_lease\.key\b)( COLLATE)?`)
	prefix := regexp.MustCompile(`starts_with\(p_\w+(?:\[\w+\])?( COLLATE)?`)
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("migrations: %v %v", names, err)
	}
	checked := 0
	for _, name := range names {
		b, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "--") {
				continue
			}
			for _, re := range []*regexp.Regexp{compare, prefix} {
				for _, m := range re.FindAllStringSubmatch(line, -1) {
					checked++
					if m[1] == "" {
						t.Errorf("%s:%d: %q compares a parameter in the caller's collation; add COLLATE pg_catalog.\"default\"", name, i+1, m[0])
					}
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d comparisons found: the patterns no longer match the migrations", checked)
	}
}

// A service role granted the prefix "case/" is checked against the key's
// exact text: 'case/9' from a case-insensitive column is its key, 'CASE/9'
// is not (PF014), and neither check fails on the collation.
func TestServiceRolePrefixWithACaseInsensitiveKey(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	_, err := db.Pool.Exec(ctx, `CREATE COLLATION public.pgfence_test_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`)
	if pgerr.Code(err) == "0A000" {
		t.Skipf("this server has no ICU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	name, app := loginRole(t, db, "pgfence_app")
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.revoke_prefix($1::regrole, $2)`, name, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, $2)`, name, "case/"); err != nil {
		t.Fatal(err)
	}
	var acquired bool
	if err := app.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire('case/9' COLLATE public.pgfence_test_ci, interval '1 minute')`).Scan(&acquired); err != nil || !acquired {
		t.Fatalf("case/9 under the granted prefix: acquired %v, %v", acquired, err)
	}
	err = app.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire('CASE/9' COLLATE public.pgfence_test_ci, interval '1 minute')`).Scan(&acquired)
	if pgerr.Code(err) != pgerr.CodeNotGranted {
		t.Fatalf("CASE/9 outside the granted prefix: %v, want %s", err, pgerr.CodeNotGranted)
	}
}
