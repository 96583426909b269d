package console

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestUpper(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"orders:", "orders;", true},
		{"a", "b", true},
		{"é", "ê", true},
		{"x\U0010FFFF", "y", true},
		{"\uD7FF", "\uE000", true}, // the next code point after the surrogates
		{"\U0010FFFF", "", false},
	} {
		got, ok := upper(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("upper(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	// Every string with the prefix sorts inside the range, byte-wise.
	for _, s := range []string{"orders:", "orders:\U0010FFFF", "orders:~~~", "orders:1"} {
		if up, _ := upper("orders:"); !(s >= "orders:" && s < up) {
			t.Errorf("%q is outside [orders:, %q)", s, up)
		}
	}
}

// seed fills db with n leases (half under orders:, half under stock:),
// 10n lease events, n fences, n idempotency keys and n/10 rejections, as the
// schema's owner, and returns a pool of a role that is a member of
// pgfence_app with the prefix orders: granted: the role a service uses.
func seed(t testing.TB, db *pgfencetest.Database, n int) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	role := fmt.Sprintf("console_app_%d", time.Now().UnixNano())
	for _, sql := range []string{
		`CREATE ROLE ` + role + ` LOGIN IN ROLE pgfence_app`,
		`SELECT pgfence.grant_prefix('` + role + `', 'orders:')`,
		`CREATE TEMP TABLE names AS SELECT g, CASE WHEN g % 2 = 0 THEN 'orders:' ELSE 'stock:' END || lpad(g::text, 7, '0') AS key
		   FROM generate_series(1, ` + fmt.Sprint(n) + `) g`,
		`INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at, released_at, holder_info)
		 SELECT key, gen_random_uuid(), 10, t - interval '1 hour', t + CASE WHEN g % 100 = 0 THEN interval '1 hour' ELSE -interval '1 minute' END,
		        CASE WHEN g % 3 = 0 THEN t - interval '2 minutes' END, 'worker ' || g
		   FROM names, (SELECT clock_timestamp() AS t) c`,
		`INSERT INTO pgfence.lease_events (key, event, holder, token, at)
		 SELECT key, CASE WHEN e = 1 THEN 'acquired' WHEN e % 2 = 0 THEN 'released' ELSE 'taken_over' END, gen_random_uuid(), e, clock_timestamp() - (11 - e) * interval '1 minute'
		   FROM names, generate_series(1, 10) e`,
		`INSERT INTO pgfence.fences (resource, token, writes) SELECT key, 10, 3 FROM names`,
		`INSERT INTO pgfence.idempotency_keys (scope, key, fingerprint, mode, status, result, retention, completed_at, expires_at)
		 SELECT key, 'k', sha256(g::text::bytea), 'atomic', 'succeeded', '\x6f6b', interval '1 day', t, t + interval '1 day'
		   FROM names, (SELECT clock_timestamp() AS t) c`,
		`INSERT INTO pgfence.fence_rejections (resource, presented_token, accepted_token, reason, at)
		 SELECT key, 9, 10, 'stale_token', clock_timestamp() FROM names WHERE g % 10 = 0`,
		`ANALYZE pgfence.leases, pgfence.lease_events, pgfence.fences, pgfence.idempotency_keys, pgfence.fence_rejections`,
	} {
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%.80s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `SELECT pgfence.revoke_prefix('`+role+`', 'orders:')`)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // as the CLI sends them
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // before the role is dropped: cleanups run last first
	return pool
}

// The prefix-filtered lists use an index on the key, also as a role under
// row-level security: a range on the key, not a LIKE.
func TestPrefixFiltersUseAnIndex(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	pool := seed(t, db, 5000)
	ctx := context.Background()
	s, err := New(ctx, &Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.byteOrdered {
		t.Fatal("the test cluster's collation is C: the console should know it")
	}
	for _, tc := range []struct {
		name, format, table string
		ranges              [][2]string
		keyset              []string
		after               []any
	}{
		{"leases", sqlLeases, "leases", [][2]string{{"l.key", "orders:0001"}}, []string{"l.key"}, nil},
		{"leases, next page", sqlLeases, "leases", [][2]string{{"l.key", "orders:"}}, []string{"l.key"}, []any{"orders:0002000"}},
		{"fences", sqlFences, "fences", [][2]string{{"f.resource", "orders:0001"}}, []string{"f.resource"}, nil},
		{"idempotency keys", sqlKeys, "idempotency_keys", [][2]string{{"k.scope", "orders:0001"}}, []string{"k.scope", "k.key"}, []any{"orders:0001000", "k"}},
		{"elections", sqlElections, "leases", [][2]string{{"l.key", "orders:0001"}}, []string{"l.key"}, nil},
		{"elections' events", sqlElections, "lease_events", [][2]string{{"l.key", "orders:0001"}}, []string{"l.key"}, nil},
	} {
		sql, args := s.listSQL(tc.format, tc.ranges, tc.keyset, tc.after...)
		var plan []map[string]any
		if err := pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		scans := map[string]bool{}
		var walk func(n map[string]any)
		walk = func(n map[string]any) {
			if rel, ok := n["Relation Name"].(string); ok && rel == tc.table {
				scans[n["Node Type"].(string)] = true
			}
			children, _ := n["Plans"].([]any)
			for _, c := range children {
				walk(c.(map[string]any))
			}
		}
		walk(plan[0]["Plan"].(map[string]any))
		indexed := scans["Index Scan"] || scans["Index Only Scan"] || scans["Bitmap Heap Scan"]
		if !indexed || scans["Seq Scan"] {
			b, _ := json.MarshalIndent(plan, "", " ")
			t.Errorf("%s: pgfence.%s is scanned by %v, want an index:\n%s\n%s", tc.name, tc.table, scans, sql, strings.TrimSpace(string(b)))
		}
	}
}
