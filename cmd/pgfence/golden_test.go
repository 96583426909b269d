package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The golden files under testdata/golden are the JSON contract: one per
// command, the command's --json output with its volatile values (times,
// holder ids, tokens, durations, database names, measurements) replaced by
// placeholders that name what they stand for. A key added, removed or
// renamed fails the test; so does a value that breaks the rules (a time
// that is not RFC 3339 in UTC, a duration that is not an integer).
//
//	go test ./cmd/pgfence -run TestGolden -update
//
// rewrites them from the commands' output.
var update = flag.Bool("update", false, "rewrite testdata/golden/*.json from the commands' output")

// goldenCase is one command's golden test.
type goldenCase struct {
	// name names the golden file: testdata/golden/<name>.json.
	name string
	// args is the command line, without --json.
	args []string
	// db: the command runs against a fresh database; setup, if set, prepares
	// it first.
	db    bool
	setup func(t *testing.T, ctx context.Context, db *pgfencetest.Database)
	// rules are the command's own placeholders, by key, on top of
	// defaultRules.
	rules map[string]string
	// collapse names arrays reduced to their first element: their length
	// depends on what is installed, not on the contract.
	collapse []string
	// numbers makes every other number a placeholder (measurements), except
	// the keys in keep.
	numbers bool
	keep    []string
	// code is the exit code the command must return.
	code int
	// lines: the command prints one JSON object per line (JSON Lines); the
	// golden file holds the normalized objects, one per line.
	lines bool
}

// defaultRules are the placeholders of every command's output, by key; a
// key ending in _at is a time, _ms milliseconds, _us microseconds, _token a
// token.
var defaultRules = map[string]string{
	"at":             "time",
	"holder":         "uuid",
	"op":             "uuid",
	"token":          "int",
	"id":             "int",
	"client_version": "text",
}

func ruleFor(key string, rules map[string]string) string {
	if r, ok := rules[key]; ok {
		return r
	}
	if r, ok := defaultRules[key]; ok {
		return r
	}
	switch {
	case strings.HasSuffix(key, "_at"):
		return "time"
	case strings.HasSuffix(key, "_ms"):
		return "ms"
	case strings.HasSuffix(key, "_us"):
		return "us"
	case strings.HasSuffix(key, "_token"):
		return "int"
	}
	return ""
}

var (
	uuidPattern  = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	demoRunIDPat = regexp.MustCompile(`sku-42-[0-9a-f]{8}`)
	errorResult  = regexp.MustCompile(`^(rejected|error): .*`)
	integer      = regexp.MustCompile(`^-?[0-9]+$`)
)

// placeholder returns what stands for v under rule, or v itself, marked, when
// v breaks the rule.
func placeholder(rule string, v any) any {
	broken := func() any { return fmt.Sprintf("<not %s: %v>", rule, v) }
	switch rule {
	case "time":
		s, ok := v.(string)
		if _, err := time.Parse(time.RFC3339Nano, s); !ok || err != nil || !strings.HasSuffix(s, "Z") {
			return broken()
		}
	case "ms", "us", "int":
		n, ok := v.(json.Number)
		if !ok || !integer.MatchString(n.String()) {
			return broken()
		}
	case "number":
		if _, ok := v.(json.Number); !ok {
			return broken()
		}
	case "uuid":
		if s, ok := v.(string); !ok || !uuidPattern.MatchString(s) || len(s) != 36 {
			return broken()
		}
	case "text":
		if _, ok := v.(string); !ok {
			return broken()
		}
	case "status":
		if s, ok := v.(string); !ok || !slices.Contains([]string{statusOK, statusWarn, statusFail}, s) {
			return broken()
		}
	default:
		return broken()
	}
	return "<" + rule + ">"
}

// normalize replaces the volatile values of v, decoded JSON, and checks
// that every key is snake_case.
func normalize(t *testing.T, c goldenCase, key string, v any) any {
	t.Helper()
	if rule := ruleFor(key, c.rules); rule != "" {
		if list, ok := v.([]any); ok {
			for i := range list {
				list[i] = placeholder(rule, list[i])
			}
			return list
		}
		if v == nil {
			return nil
		}
		return placeholder(rule, v)
	}
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if !snakeCase(k) {
				t.Errorf("%s: key %q is not snake_case", c.name, k)
			}
			v[k] = normalize(t, c, k, x)
		}
		return v
	case []any:
		if slices.Contains(c.collapse, key) && len(v) > 1 {
			v = v[:1]
		}
		for i := range v {
			v[i] = normalize(t, c, key, v[i])
		}
		return v
	case json.Number:
		if c.numbers && !slices.Contains(c.keep, key) {
			return placeholder("number", v)
		}
		return v
	case string:
		v = uuidPattern.ReplaceAllString(v, "<uuid>")
		v = demoRunIDPat.ReplaceAllString(v, "sku-42-<run>")
		return errorResult.ReplaceAllString(v, "$1: <error>")
	}
	return v
}

func TestGolden(t *testing.T) {
	t.Parallel()
	for _, c := range goldenCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var environ map[string]string
			if c.db {
				db := pgfencetest.NewDatabase(t)
				if c.setup != nil {
					c.setup(t, ctx, db)
				}
				environ = map[string]string{"DATABASE_URL": db.URL}
			}
			code, out, errOut := cli(t, environ, append(slices.Clone(c.args), "--json")...)
			if code != c.code {
				t.Fatalf("%q --json: code %d, want %d\n%s%s", c.args, code, c.code, out, errOut)
			}
			var got []byte
			if c.lines {
				got = goldenLines(t, c, out)
			} else {
				dec := json.NewDecoder(strings.NewReader(out))
				dec.UseNumber()
				var v any
				if err := dec.Decode(&v); err != nil {
					t.Fatalf("%q --json: %v\n%s", c.args, err, out)
				}
				if dec.More() {
					t.Fatalf("%q --json printed more than one JSON value:\n%s", c.args, out)
				}
				if _, ok := v.(map[string]any); !ok {
					t.Fatalf("%q --json: %T at the top level, want an object:\n%s", c.args, v, out)
				}
				var buf bytes.Buffer
				enc := json.NewEncoder(&buf)
				enc.SetEscapeHTML(false) // <time>, not \u003ctime\u003e
				enc.SetIndent("", "  ")
				if err := enc.Encode(normalize(t, c, "", v)); err != nil {
					t.Fatal(err)
				}
				got = buf.Bytes()
			}
			file := filepath.Join("testdata", "golden", c.name+".json")
			if *update {
				if err := os.WriteFile(file, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (go test ./cmd/pgfence -run TestGolden -update writes it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%q --json no longer matches %s (the JSON contract; if the change is meant, rerun with -update and say so in cmd/pgfence/README.md)\ngot:\n%s\nwant:\n%s", c.args, file, got, want)
			}
		})
	}
}

// goldenLines checks JSON Lines output (one object per line, each on one
// line) and returns the normalized objects, one per line.
func goldenLines(t *testing.T, c goldenCase, out string) []byte {
	t.Helper()
	var buf bytes.Buffer
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if out == "" {
		t.Fatalf("%q --json printed nothing", c.args)
	}
	for _, line := range lines {
		dec := json.NewDecoder(strings.NewReader(line))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil || dec.More() {
			t.Fatalf("%q --json: line %q is not one JSON value: %v", c.args, line, err)
		}
		if _, ok := v.(map[string]any); !ok {
			t.Fatalf("%q --json: %T on a line, want an object:\n%s", c.args, v, out)
		}
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(normalize(t, c, "", v)); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// goldenCases lists one case per command. Each prepares its database so that
// every key of the output appears, optional ones included where they can.
func goldenCases() []goldenCase {
	migrate := map[string]string{"version": "int", "latest": "int", "from": "int", "to": "int", "name": "text", "sql": "text"}
	doctorRules := map[string]string{"status": "status", "detail": "text"}
	measured := []string{"workers", "rounds", "x", "cycles", "keys"}
	return []goldenCase{
		{name: "migrate_up", args: []string{"migrate", "up"}, db: true, setup: dropSchema, rules: migrate, collapse: []string{"migrations"}},
		{name: "migrate_down", args: []string{"migrate", "down"}, db: true, rules: migrate, collapse: []string{"migrations"}},
		{name: "migrate_status", args: []string{"migrate", "status"}, db: true, rules: migrate, collapse: []string{"migrations"}},
		{name: "migrate_sql", args: []string{"migrate", "sql"}, rules: migrate},

		{name: "leases_list", args: []string{"leases", "list"}, db: true, setup: goldenLeases},
		{name: "leases_show", args: []string{"leases", "show", "jobs/nightly"}, db: true, setup: goldenLeases},
		{name: "leases_watch", args: []string{"leases", "watch", "jobs/watched", "--history", "4", "--count", "5"}, db: true, setup: goldenWatch, lines: true},
		{name: "leases_release", args: []string{"leases", "release", "jobs/nightly", "--force", "--reason", "stuck after deploy"}, db: true, setup: goldenLeases},
		{name: "leases_pause", args: []string{"leases", "pause", "deploy/", "--reason", "rollout 7"}, db: true},
		{name: "leases_resume", args: []string{"leases", "resume", "billing/", "--reason", "done"}, db: true, setup: goldenLeases},

		{name: "fences_list", args: []string{"fences", "list"}, db: true, setup: goldenFences},
		{name: "fences_show", args: []string{"fences", "show", "stock/apple"}, db: true, setup: goldenFences},

		{name: "tables_list", args: []string{"tables", "list"}, db: true, setup: goldenTables},
		{name: "tables_protect", args: []string{"tables", "protect", "public.stock", "--resource-column", "sku", "--prefix", "shop/"}, db: true, setup: goldenTables},
		{name: "tables_unprotect", args: []string{"tables", "unprotect", "public.stock"}, db: true, setup: goldenTables},

		{name: "floor_show", args: []string{"floor", "show", "--column", "public.reports.fence"}, db: true, setup: goldenFloor},
		{name: "floor_raise", args: []string{"floor", "raise", "--column", "public.reports.fence", "--reason", "restored from backup"}, db: true, setup: goldenFloor},

		{name: "keys_list", args: []string{"keys", "list", "orders"}, db: true, setup: goldenKeys},
		{name: "keys_show", args: []string{"keys", "show", "orders", "o-1"}, db: true, setup: goldenKeys},
		{name: "keys_gc", args: []string{"keys", "gc"}, db: true, setup: goldenKeys},
		{name: "keys_abandoned", args: []string{"keys", "abandoned", "--scope-prefix", "ord"}, db: true, setup: goldenAbandoned},
		{name: "keys_fail-abandoned", args: []string{"keys", "fail-abandoned"}, db: true, setup: goldenAbandoned},

		{name: "tasks_list", args: []string{"tasks", "list", "--prefix", "sku/", "--limit", "3"}, db: true, setup: goldenTasks, rules: map[string]string{"next_after": "int"}},
		{name: "tasks_show", args: []string{"tasks", "show", "1"}, db: true, setup: goldenTasks},
		{name: "tasks_retry", args: []string{"tasks", "retry", "2", "--reason", "stock refilled"}, db: true, setup: goldenTasks},
		{name: "tasks_skip", args: []string{"tasks", "skip", "2", "--reason", "order cancelled"}, db: true, setup: goldenTasks},

		{name: "maintenance_schedule", args: []string{"maintenance", "schedule", "--dry-run"}},

		{name: "doctor", args: []string{"doctor"}, db: true, rules: doctorRules},
		{name: "demo", args: []string{"demo", "--ttl", "300ms"}, db: true, rules: map[string]string{"database": "text", "detail": "text"}},

		{name: "bench_compare", args: []string{"bench", "compare", "--cases", "raw-update", "--workers", "1", "--duration", "100ms", "--warmup", "0s", "--peers", "none"}, db: true,
			rules: map[string]string{"machine": "text", "settings": "text", "comparisons": "text"}, numbers: true, keep: measured},
		{name: "bench_curves", args: []string{"bench", "curves", "--curves", "resources,churn", "--max-resources", "1", "--cycles", "10", "--workers", "1", "--duration", "100ms", "--warmup", "0s"}, db: true,
			rules: map[string]string{"machine": "text", "settings": "text", "comparisons": "text"}, numbers: true, keep: measured},
		{name: "bench_contention", args: []string{"bench", "contention", "--workers", "3", "--keys", "1", "--duration", "300ms", "--ttl", "100ms", "--pause", "400ms", "--pause-first", "--hold", "50ms"}, db: true,
			rules: map[string]string{"machine": "text", "settings": "text", "key": "text", "detail": "text"}, numbers: true, keep: measured, collapse: []string{"per_key"}},
		{name: "bench_contention_tasks", args: []string{"bench", "contention", "--mode", "tasks", "--workers", "2", "--keys", "1", "--duration", "200ms", "--ttl", "2s"}, db: true,
			rules: map[string]string{"machine": "text", "settings": "text", "key": "text", "detail": "text"}, numbers: true, keep: append(measured, "consumers"), collapse: []string{"per_key"}},
	}
}

func goldenExec(t *testing.T, ctx context.Context, db *pgfencetest.Database, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func dropSchema(t *testing.T, ctx context.Context, db *pgfencetest.Database) {
	goldenExec(t, ctx, db, `DROP SCHEMA pgfence CASCADE`)
}

// goldenLeases: a live lease renewed once (jobs/nightly), a released one with
// history, and a paused prefix.
func goldenLeases(t *testing.T, ctx context.Context, db *pgfencetest.Database) {
	t.Helper()
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	worker1 := &leases.AcquireOptions{HolderInfo: "worker-1"}
	l, err := client.TryAcquire(ctx, "jobs/nightly", time.Hour, worker1)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	done, err := client.TryAcquire(ctx, "jobs/done", time.Hour, worker1)
	if err != nil {
		t.Fatal(err)
	}
	if err := done.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := client.PauseGrants(ctx, "billing/", "rollout 7"); err != nil {
		t.Fatal(err)
	}
}

// goldenWatch: a grant with holder info, a change of it, a force-release
// with a reason, and a second grant that has expired (backdated).
func goldenWatch(t *testing.T, ctx context.Context, db *pgfencetest.Database) {
	t.Helper()
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	l, err := client.TryAcquire(ctx, "jobs/watched", time.Hour, &leases.AcquireOptions{HolderInfo: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetHolderInfo(ctx, "worker-1 at 10.0.0.7:8080"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ForceRelease(ctx, "jobs/watched", "drill"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.TryAcquire(ctx, "jobs/watched", time.Hour, &leases.AcquireOptions{HolderInfo: "worker-2"}); err != nil {
		t.Fatal(err)
	}
	goldenExec(t, ctx, db, `UPDATE pgfence.leases SET expires_at = granted_at WHERE key = 'jobs/watched'`)
}

// goldenFences: an accepted token with an operation id, and two rejected
// writes (one with a trace id).
func goldenFences(t *testing.T, ctx context.Context, db *pgfencetest.Database) {
	t.Helper()
	pgfencetest.IssueToken(t, db.Pool, "stock/apple", 9)
	goldenExec(t, ctx, db, `SELECT pgfence.fence('stock/apple', 9, gen_random_uuid())`)
	goldenExec(t, ctx, db, `SELECT pgfence.record_fence_rejection('stock/apple', 7, 9, 'stale_token', NULL, 'exec', gen_random_uuid(), '0123456789abcdef0123456789abcdef')`)
	goldenExec(t, ctx, db, `SELECT pgfence.record_fence_rejection('stock/apple', 8, NULL, 'lease_not_held', 'expired', NULL, NULL, NULL)`)
}

// goldenTables: public.stock protected with prefix stock/.
func goldenTables(t *testing.T, ctx context.Context, db *pgfencetest.Database) {
	t.Helper()
	goldenExec(t, ctx, db, `CREATE TABLE public.stock (sku text PRIMARY KEY, qty int NOT NULL)`)
	goldenExec(t, ctx, db, `SELECT pgfence.protect('public.stock', 'sku', 'stock/')`)
}

// goldenFloor: a table of the application's own that holds a token.
func goldenFloor(t *testing.T, ctx context.Context, db *pgfencetest.Database) {
	t.Helper()
	goldenExec(t, ctx, db, `CREATE TABLE public.reports (id int PRIMARY KEY, fence bigint); INSERT INTO public.reports VALUES (1, 1::bigint << 50)`)
}

// goldenKeys: a completed atomic key (o-1), a leased one in progress with a
// recovery point (o-2), a failed one (o-3), and an expired one GC deletes.
func goldenKeys(t *testing.T, ctx context.Context, db *pgfencetest.Database) {
	t.Helper()
	store, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil }
	for _, key := range []string{"o-1", "old"} {
		if _, err := store.Do(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: key}, ok); err != nil {
			t.Fatal(err)
		}
	}
	o, err := store.Claim(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: "o-2"})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Attempt.Advance(ctx, "charged", nil); err != nil {
		t.Fatal(err)
	}
	failed, err := store.Claim(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: "o-3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failed.Attempt.Fail(ctx, &idempotency.Failure{Code: "card_declined", Message: "declined"}); err != nil {
		t.Fatal(err)
	}
	goldenExec(t, ctx, db, `UPDATE pgfence.idempotency_keys
		SET created_at = created_at - interval '1 hour', updated_at = updated_at - interval '1 hour',
		    completed_at = completed_at - interval '1 hour', expires_at = clock_timestamp() - interval '1 second'
		WHERE key = 'old'`)
}

// goldenAbandoned: goldenKeys with the lease of o-2 (leased, in progress, at
// recovery point "charged") over an hour ago.
func goldenAbandoned(t *testing.T, ctx context.Context, db *pgfencetest.Database) {
	t.Helper()
	goldenKeys(t, ctx, db)
	goldenExec(t, ctx, db, `UPDATE pgfence.idempotency_keys
		SET lease_expires_at = clock_timestamp() - interval '1 hour', trace_id = '0123456789abcdef0123456789abcdef'
		WHERE key = 'o-2'`)
}

// Every command has its golden file: a command added without one has no
// contract.
func TestGoldenCoversEveryCommand(t *testing.T) {
	var have []string
	for _, c := range goldenCases() {
		have = append(have, c.name)
	}
	for _, c := range commands() {
		if c.noun == "ui" {
			continue // a server: its one JSON line (the URL) is checked by TestUIJSON
		}
		if name := strings.ReplaceAll(c.name(), " ", "_"); !slices.Contains(have, name) {
			t.Errorf("command %q has no golden case %q", c.name(), name)
		}
	}
}
