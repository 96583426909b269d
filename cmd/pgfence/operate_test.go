package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestLeasesCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// Not kept alive: the holder renews it by hand below.
	l, err := client.TryAcquire(ctx, "jobs/nightly", time.Minute, &leases.AcquireOptions{NoKeepAlive: true, HolderInfo: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}

	code, out, errOut := cli(t, environ, "leases", "list")
	if code != exitOK || !strings.Contains(out, "jobs/nightly") || !strings.Contains(out, "held") || !strings.Contains(out, "worker-1") {
		t.Fatalf("leases list: code %d\n%s%s", code, out, errOut)
	}
	code, out, _ = cli(t, environ, "leases", "show", "jobs/nightly", "--json")
	var shown leaseShowJSON
	if code != exitOK || json.Unmarshal([]byte(out), &shown) != nil {
		t.Fatalf("leases show --json: code %d\n%s", code, out)
	}
	if shown.Lease.Token != l.Token() || !shown.Lease.Live || len(shown.History) != 1 || shown.History[0].Event != "acquired" {
		t.Fatalf("leases show: %+v, want the live grant with token %d and one 'acquired' entry", shown, l.Token())
	}

	if code, _, errOut := cli(t, environ, "leases", "release", "jobs/nightly"); code != exitUsage || !strings.Contains(errOut, "--force") {
		t.Fatalf("release without --force: code %d, %s", code, errOut)
	}
	if code, _, errOut := cli(t, environ, "leases", "release", "jobs/nightly", "--force"); code != exitUsage || !strings.Contains(errOut, "--reason") {
		t.Fatalf("release without --reason: code %d, %s", code, errOut)
	}
	code, out, errOut = cli(t, environ, "leases", "release", "jobs/nightly", "--force", "--reason", "stuck after deploy")
	if code != exitOK || !strings.Contains(out, "released the live grant") {
		t.Fatalf("force release: code %d\n%s%s", code, out, errOut)
	}
	// The holder's own lease is gone: its renewal says so.
	if err := l.Renew(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("renew after force release: %v, want ErrLeaseLost", err)
	}
	code, out, _ = cli(t, environ, "leases", "show", "jobs/nightly")
	if code != exitOK || !strings.Contains(out, "force_released") || !strings.Contains(out, "stuck after deploy") {
		t.Fatalf("history lacks the force release:\n%s", out)
	}
	if code, _, errOut := cli(t, environ, "leases", "show", "no/such/key"); code != exitFailure || !strings.Contains(errOut, "no lease") {
		t.Fatalf("show unknown key: code %d, %s", code, errOut)
	}
}

func TestFenceCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.stock (sku text PRIMARY KEY, qty int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, environ, "tables", "protect", "public.stock", "--resource-column", "sku", "--prefix", "stock/")
	if code != exitOK || !strings.Contains(out, "protected") {
		t.Fatalf("protect: code %d\n%s%s", code, out, errOut)
	}
	// A write without a token is now refused, whatever the client.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO public.stock VALUES ('apple', 10)`); !errors.Is(pgfenceErr(err), pgfence.ErrUnfencedWrite) {
		t.Fatalf("unfenced insert into a protected table: %v, want PF006", err)
	}
	pgfencetest.IssueToken(t, db.Pool, "stock/apple", 7)
	if _, err := pgfence.Exec(ctx, db.Pool, pgfence.LeaseOf("stock/apple", "", 7), `INSERT INTO public.stock VALUES ('apple', 10)`); err != nil {
		t.Fatal(err)
	}
	code, out, _ = cli(t, environ, "fences", "list")
	if code != exitOK || !strings.Contains(out, "stock/apple") {
		t.Fatalf("fences list: code %d\n%s", code, out)
	}
	code, out, _ = cli(t, environ, "tables", "list")
	if code != exitOK || !strings.Contains(out, "stock") || !strings.Contains(out, `"stock/" || sku`) {
		t.Fatalf("tables list: code %d\n%s", code, out)
	}
	code, out, _ = cli(t, environ, "fences", "show", "stock/apple", "--json")
	var shown fenceShowJSON
	if code != exitOK || json.Unmarshal([]byte(out), &shown) != nil || shown.Fence == nil || shown.Fence.Token != 7 {
		t.Fatalf("fences show stock/apple --json: code %d\n%s", code, out)
	}
	// Protecting again with the same settings says nothing more; with other
	// settings it says what it replaced.
	if code, out, errOut = cli(t, environ, "tables", "protect", "public.stock", "--resource-column", "sku", "--prefix", "stock/"); code != exitOK || strings.Contains(out, "replaced") {
		t.Fatalf("protect again, same settings: code %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut = cli(t, environ, "tables", "protect", "public.stock", "--resource-column", "sku", "--prefix", "shop/"); code != exitOK || !strings.Contains(out, `it was protected with resource "stock/" || sku before; that setting is replaced`) {
		t.Fatalf("protect again, another prefix: code %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut = cli(t, environ, "tables", "protect", "public.stock", "--resource-column", "sku", "--prefix", "stock/"); code != exitOK {
		t.Fatalf("protect back: code %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := cli(t, environ, "tables", "protect", "public.nope", "--resource-column", "sku"); code == exitOK || !strings.Contains(errOut, "hint:") {
		t.Fatalf("protect a missing table: code %d, %s", code, errOut)
	}
	code, out, _ = cli(t, environ, "tables", "unprotect", "public.stock")
	if code != exitOK || !strings.Contains(out, "unprotected") {
		t.Fatalf("unprotect: code %d\n%s", code, out)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE public.stock SET qty = 9`); err != nil {
		t.Fatalf("write after unprotect: %v", err)
	}
	code, out, _ = cli(t, environ, "tables", "unprotect", "public.stock")
	if code != exitOK || !strings.Contains(out, "was not protected") {
		t.Fatalf("second unprotect: code %d\n%s", code, out)
	}
}

// pgfenceErr maps a raw pgx error from a plain statement the way the pgfence
// package does, so the test can speak in sentinels.
func pgfenceErr(err error) error {
	if pgerr.Code(err) == pgerr.CodeUnfencedWrite {
		return pgfence.ErrUnfencedWrite
	}
	return err
}

func TestFloorCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.reports (id int PRIMARY KEY, fence bigint); INSERT INTO public.reports VALUES (1, 1::bigint << 50)`); err != nil {
		t.Fatal(err)
	}
	code, out, _ := cli(t, environ, "floor", "show", "--column", "public.reports.fence")
	if code != exitOK || !strings.Contains(out, "highest stored token: 1125899906842624") || !strings.Contains(out, "retention floor: 0 (never advanced)") {
		t.Fatalf("floor show: code %d\n%s", code, out)
	}
	// The retention floor and when it last advanced, absent before the
	// first time (a value never recorded is left out).
	retention := func() (n int64, at *time.Time) {
		t.Helper()
		code, out, errOut := cli(t, environ, "floor", "show", "--json")
		var v floorShowJSON
		if err := json.Unmarshal([]byte(out), &v); code != exitOK || err != nil {
			t.Fatalf("floor show --json: code %d, %v\n%s%s", code, err, out, errOut)
		}
		if (v.RetentionAt != nil) != strings.Contains(out, `"retention_at"`) {
			t.Fatalf("floor show --json: retention_at %v, printed as\n%s", v.RetentionAt, out)
		}
		return v.Retention, v.RetentionAt
	}
	if n, at := retention(); n != 0 || at != nil {
		t.Fatalf("floor show --json before any advance: retention %d at %v, want 0 and no retention_at", n, at)
	}
	var advanced int64
	var advancedAt time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT pgfence.advance_retention()`).Scan(&advanced); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT retention_at FROM pgfence.token_floor`).Scan(&advancedAt); err != nil {
		t.Fatal(err)
	}
	if n, at := retention(); n != advanced || at == nil || !at.Equal(advancedAt) {
		t.Fatalf("floor show --json after advance_retention: retention %d at %v, want %d at %v", n, at, advanced, advancedAt)
	}
	if code, _, errOut := cli(t, environ, "floor", "raise", "--column", "public.reports.fence"); code != exitUsage || !strings.Contains(errOut, "--reason") {
		t.Fatalf("raise without reason: code %d, %s", code, errOut)
	}
	code, out, errOut := cli(t, environ, "floor", "raise", "--column", "public.reports.fence", "--reason", "restored from backup")
	if code != exitOK || !strings.Contains(out, "to 1125899906842624") {
		t.Fatalf("floor raise: code %d\n%s%s", code, out, errOut)
	}
	var next int64
	if err := db.Pool.QueryRow(ctx, `SELECT pgfence.next_token(NULL)`).Scan(&next); err != nil || next <= 1<<50 {
		t.Fatalf("next token after raising the floor = %d, %v; want > 2^50", next, err)
	}
	code, _, errOut = cli(t, environ, "floor", "raise", "--to", "5", "--reason", "oops")
	if code != exitFailure || !strings.Contains(errOut, "may only be raised") {
		t.Fatalf("lowering the floor: code %d, %s", code, errOut)
	}
	// A floor that leaves no room for tokens, or a negative one (once taken
	// as "the highest stored token"), is refused before anything changes.
	for _, to := range []string{"9223372036854775807", "4611686018427387905", "-5"} {
		code, _, errOut = cli(t, environ, "floor", "raise", "--to", to, "--reason", "typo")
		if code != exitUsage || !strings.Contains(errOut, "must be 0 to") {
			t.Fatalf("floor raise --to %s: code %d, %s", to, code, errOut)
		}
	}
	if err := db.Pool.QueryRow(ctx, `SELECT pgfence.next_token(NULL)`).Scan(&next); err != nil || next > 1<<51 {
		t.Fatalf("next token after the refused raises = %d, %v; want the floor unchanged", next, err)
	}
}

func TestKeysGC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b", "c"} {
		if _, err := store.Do(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: key}, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			return []byte("ok"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE pgfence.idempotency_keys
		 SET created_at = created_at - interval '1 hour', updated_at = updated_at - interval '1 hour',
		     completed_at = completed_at - interval '1 hour', expires_at = clock_timestamp() - interval '1 second'
		 WHERE key IN ('a', 'b')`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, environ, "keys", "gc", "--batch-size", "1", "--json")
	var res struct{ Deleted, Batches int }
	if code != exitOK || json.Unmarshal([]byte(out), &res) != nil || res.Deleted != 2 {
		t.Fatalf("keys gc: code %d\n%s%s", code, out, errOut)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.idempotency_keys`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("%d keys left (%v), want the unexpired one", left, err)
	}
	if code, _, _ := cli(t, environ, "keys", "gc", "--batch-size", "0"); code != exitUsage {
		t.Fatalf("--batch-size 0: code %d, want usage error", code)
	}
}

// An abandoned leased key is listed, then failed by the CLI; the client's
// retry gets the stored failure instead of running the side effect again, and
// a key whose owner is still alive is neither listed nor touched.
func TestKeysFailAbandoned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(key string) *idempotency.Outcome {
		t.Helper()
		o, err := store.Claim(ctx, db.Pool, idempotency.Request{Scope: "payments/capture", Key: key, Payload: []byte(key)})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	if err := claim("dead").Attempt.Advance(ctx, "charged", nil); err != nil {
		t.Fatal(err)
	}
	live := claim("live")
	if _, err := db.Pool.Exec(ctx, `UPDATE pgfence.idempotency_keys
		SET lease_expires_at = clock_timestamp() - interval '10 minutes' WHERE key = 'dead'`); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := cli(t, environ, "keys", "abandoned", "--expired-for", "5m", "--json")
	var listed struct {
		Keys []struct {
			Key           string
			RecoveryPoint string `json:"recovery_point"`
		}
	}
	if code != exitOK || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Keys) != 1 || listed.Keys[0].RecoveryPoint != "charged" {
		t.Fatalf("keys abandoned: code %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := cli(t, environ, "keys", "abandoned", "--expired-for", "1h", "--json"); code != exitOK || !strings.Contains(out, `"keys": []`) {
		t.Fatalf("keys abandoned --expired-for 1h: code %d, %s; want none (the lease ended 10 minutes ago)", code, out)
	}

	code, out, errOut = cli(t, environ, "keys", "fail-abandoned", "--json")
	var res struct{ Found, Failed, Skipped int }
	if code != exitOK || json.Unmarshal([]byte(out), &res) != nil || res.Found != 1 || res.Failed != 1 {
		t.Fatalf("keys fail-abandoned: code %d\n%s%s", code, out, errOut)
	}
	retry := claim("dead")
	if !retry.Replayed || retry.Failure == nil || retry.Failure.Code != "abandoned" {
		t.Fatalf("retry of the failed key: %+v, want the stored failure \"abandoned\"", retry)
	}
	if _, err := live.Attempt.Complete(ctx, []byte("done")); err != nil {
		t.Fatalf("the live owner lost its key to the completer: %v", err)
	}

	// An operator runs the completer within the prefixes granted to it: with
	// none, it is refused with the statement that grants one, and nothing
	// changes; once granted, it fails the key.
	if err := claim("dead-2").Attempt.Advance(ctx, "charged", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE pgfence.idempotency_keys
		SET lease_expires_at = clock_timestamp() - interval '10 minutes' WHERE key = 'dead-2'`); err != nil {
		t.Fatal(err)
	}
	operator := newRole(t, db, "pgfence_t_keys_op_", "LOGIN PASSWORD 'not-a-secret' IN ROLE pgfence_operator")
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	asOperator := map[string]string{"DATABASE_URL": fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=not-a-secret", cfg.Host, cfg.Port, cfg.Database, operator)}
	code, _, errOut = cli(t, asOperator, "keys", "fail-abandoned")
	if code != exitFailure || !strings.Contains(errOut, "PF014") || !strings.Contains(errOut, "pgfence.grant_prefix") {
		t.Fatalf("operator without a prefix grant: code %d, %s; want a refusal naming grant_prefix", code, errOut)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, 'payments/')`, operator); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut = cli(t, asOperator, "keys", "fail-abandoned", "--json"); code != exitOK || json.Unmarshal([]byte(out), &res) != nil || res.Failed != 1 {
		t.Fatalf("operator with the prefix granted: code %d\n%s%s", code, out, errOut)
	}

	for _, args := range [][]string{{"--limit", "0"}, {"--expired-for", "-1s"}, {"--scope-prefix", "a\x00b"}} {
		if code, _, _ := cli(t, environ, append([]string{"keys", "fail-abandoned"}, args...)...); code != exitUsage {
			t.Fatalf("keys fail-abandoned %q: code %d, want usage error", args, code)
		}
	}
}

// grantClientVersion is the client version c recorded with its grant of key:
// "pgfence-go/" and the module's version (package leases checks it is its
// own).
func grantClientVersion(t *testing.T, c *leases.Client, key string) string {
	t.Helper()
	st, err := c.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(st.ClientVersion, "pgfence-go/") || len(st.ClientVersion) == len("pgfence-go/") {
		t.Fatalf("%s: client version %q, want pgfence-go/<version>", key, st.ClientVersion)
	}
	return st.ClientVersion
}

func TestLeasesPauseCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	if code, _, errOut := cli(t, environ, "leases", "pause", "deploy/"); code != exitUsage || !strings.Contains(errOut, "--reason") {
		t.Fatalf("pause without --reason: code %d, %s", code, errOut)
	}
	code, out, errOut := cli(t, environ, "leases", "pause", "deploy/", "--reason", "rollout 7")
	if code != exitOK || !strings.Contains(out, "paused") {
		t.Fatalf("pause: code %d\n%s%s", code, out, errOut)
	}
	if _, err := client.TryAcquire(ctx, "deploy/web", time.Minute, nil); !errors.Is(err, pgfence.ErrGrantsPaused) {
		t.Fatalf("TryAcquire after `leases pause`: want ErrGrantsPaused, got %v", err)
	}
	l, err := client.TryAcquire(ctx, "batch/1", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	version := grantClientVersion(t, client, "batch/1")
	code, out, _ = cli(t, environ, "leases", "list")
	if code != exitOK || !strings.Contains(out, `"deploy/"`) || !strings.Contains(out, "rollout 7") || !strings.Contains(out, version) {
		t.Fatalf("leases list shows neither the pause nor the client version:\n%s", out)
	}
	code, out, _ = cli(t, environ, "leases", "show", "batch/1")
	if code != exitOK || !strings.Contains(out, "client") || !strings.Contains(out, version) {
		t.Fatalf("leases show lacks the client version:\n%s", out)
	}
	_ = l.Release(ctx)
	code, out, _ = cli(t, environ, "doctor", "--json")
	var res struct{ Checks []check }
	if json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("doctor --json: code %d\n%s", code, out)
	}
	found := false
	for _, c := range res.Checks {
		if c.Name == "grant pauses" {
			found = true
			if c.Status != statusWarn || !strings.Contains(c.Detail, "'deploy/'") || !strings.Contains(c.Detail, "rollout 7") {
				t.Errorf("doctor grant pauses = %+v, want a warning naming the prefix and reason", c)
			}
		}
	}
	if !found {
		t.Errorf("doctor has no grant pauses check: %s", out)
	}
	// With a member of pgfence_app, the roles check is satisfied.
	member := "pgfence_t_cli_" + strings.ReplaceAll(db.Name[len(db.Name)-12:], "_", "")
	if _, err := db.Pool.Exec(ctx, `CREATE ROLE `+member+` NOLOGIN IN ROLE pgfence_app`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+member) })
	_, out, _ = cli(t, environ, "doctor", "--json")
	res.Checks = nil
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	found = false
	for _, c := range res.Checks {
		if c.Name == "roles" {
			found = true
			if c.Status != statusOK || !strings.Contains(c.Detail, "member(s) of pgfence_app") {
				t.Errorf("doctor roles check with a pgfence_app member = %+v", c)
			}
		}
	}
	if !found {
		t.Errorf("doctor has no roles check: %s", out)
	}

	code, out, errOut = cli(t, environ, "leases", "resume", "deploy/", "--reason", "done")
	if code != exitOK || !strings.Contains(out, "allowed again") {
		t.Fatalf("resume: code %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := cli(t, environ, "leases", "resume", "deploy/"); code != exitOK || !strings.Contains(out, "was not paused") {
		t.Fatalf("resume again: code %d\n%s", code, out)
	}
	l, err = client.TryAcquire(ctx, "deploy/web", time.Minute, nil)
	if err != nil {
		t.Fatalf("TryAcquire after `leases resume`: %v", err)
	}
	_ = l.Release(ctx)
	if code, out, _ := cli(t, environ, "leases", "list"); code != exitOK || strings.Contains(out, "paused") {
		t.Fatalf("leases list still shows a pause:\n%s", out)
	}
}

// Operating commands explain what went wrong with the exit code that fits:
// a bad argument is a usage error, a missing schema says to migrate, a missing
// privilege names the role to use, and text from the database cannot forge
// table rows.
func TestOperatingErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.stock (sku text PRIMARY KEY, quantity int)`); err != nil {
		t.Fatal(err)
	}
	expect := func(wantCode int, wantErr string, args ...string) {
		t.Helper()
		code, out, errOut := cli(t, environ, args...)
		if code != wantCode || !strings.Contains(errOut, wantErr) || strings.Contains(errOut, "pgfence: pgfence:") {
			t.Errorf("%q: code %d, want %d with %q:\n%s%s", args, code, wantCode, wantErr, out, errOut)
		}
	}
	// Keys, prefixes and reasons the leases package refuses.
	expect(exitUsage, "key: must not be empty", "leases", "show", "")
	expect(exitUsage, "key: must be valid UTF-8", "leases", "show", "\xff")
	expect(exitUsage, "512 bytes", "leases", "show", strings.Repeat("k", 600))
	expect(exitUsage, "key: must not be empty", "leases", "release", "", "--force", "--reason", "r")
	expect(exitUsage, "prefix", "leases", "resume", "\xff")
	// A --column that names nothing is the caller's mistake, not the schema's.
	expect(exitUsage, "check the --column flags", "floor", "show", "--column", "nosuch.col")
	expect(exitUsage, "check the --column flags", "floor", "show", "--column", "public.stock.nosuch")
	expect(exitUsage, "check the --column flags", "floor", "show", "--column", "nosuch.t.c")

	// Control characters in a key are quoted in the table, not printed.
	client, err := leases.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	l, err := client.TryAcquire(ctx, "weird\tkey\nforged row", time.Minute, &leases.AcquireOptions{HolderInfo: "a\nb"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	code, out, errOut := cli(t, environ, "leases", "list")
	if code != exitOK || !strings.Contains(out, `"weird\tkey\nforged row"`) || !strings.Contains(out, `"a\nb"`) || strings.Contains(out, "\nforged row") {
		t.Errorf("leases list with a control character in a key: code %d\n%s%s", code, out, errOut)
	}

	// A role without the privilege is told which role to use.
	role := fmt.Sprintf("pgfence_nobody_%d", time.Now().UnixNano())
	if _, err := db.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD 'not-a-secret'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role) })
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	weak := map[string]string{"DATABASE_URL": fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=not-a-secret", cfg.Host, cfg.Port, cfg.Database, role)}
	code, out, errOut = cli(t, weak, "tables", "protect", "public.stock", "--resource-column", "sku")
	if code != exitFailure || !strings.Contains(errOut, "pgfence_operator") {
		t.Errorf("protect without the privilege: code %d\n%s%s", code, out, errOut)
	}

	// Without the schema, protect and unprotect say to migrate.
	if _, err := db.Pool.Exec(ctx, `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	expect(exitSchema, "migrate up", "tables", "protect", "public.stock", "--resource-column", "sku")
	expect(exitSchema, "migrate up", "tables", "unprotect", "public.stock")
	expect(exitSchema, "migrate up", "floor", "show", "--column", "public.stock.quantity")
}

// TestOperateJSONShape pins what scripts parse: every key of every --json
// output of leases and tables is snake_case, and a time the database never
// recorded is absent rather than printed as year 1.
func TestOperateJSONShape(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// Not kept alive: it is never renewed.
	l, err := client.TryAcquire(ctx, "jobs/json", time.Minute, &leases.AcquireOptions{NoKeepAlive: true, HolderInfo: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.items (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := cli(t, environ, "tables", "protect", "public.items", "--resource-column", "id"); code != exitOK {
		t.Fatalf("protect: code %d\n%s%s", code, out, errOut)
	}

	// run runs one --json command and returns its output decoded, after
	// checking every object key in it.
	run := func(args ...string) any {
		t.Helper()
		code, out, errOut := cli(t, environ, append(args, "--json")...)
		var v any
		if code != exitOK || json.Unmarshal([]byte(out), &v) != nil {
			t.Fatalf("%v --json: code %d\n%s%s", args, code, out, errOut)
		}
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch v := v.(type) {
			case map[string]any:
				for k, x := range v {
					if !snakeCase(k) {
						t.Errorf("%v --json: key %s%q is not snake_case", args, path, k)
					}
					walk(path+k+".", x)
				}
			case []any:
				for _, x := range v {
					walk(path, x)
				}
			}
		}
		walk("", v)
		return v
	}

	list := run("leases", "list").(map[string]any)["leases"].([]any)
	if len(list) != 1 {
		t.Fatalf("leases list --json: %v, want one lease", list)
	}
	row := list[0].(map[string]any)
	if row["key"] != "jobs/json" || row["state"] != "held" || row["live"] != true || row["token"] != float64(l.Token()) ||
		row["holder_info"] != "worker-1" || row["client_version"] != grantClientVersion(t, client, "jobs/json") {
		t.Fatalf("leases list --json: %v", row)
	}
	if ms, ok := row["remaining_ms"].(float64); !ok || ms <= 0 || ms > 60000 {
		t.Fatalf("remaining_ms = %v, want 0 < ms <= 60000", row["remaining_ms"])
	}
	for _, k := range []string{"granted_at", "expires_at"} {
		if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(row[k])); err != nil {
			t.Errorf("%s = %v: %v", k, row[k], err)
		}
	}
	for _, k := range []string{"renewed_at", "released_at"} {
		if v, ok := row[k]; ok {
			t.Errorf("a lease never renewed nor released has %s = %v", k, v)
		}
	}

	released := run("leases", "release", "jobs/json", "--force", "--reason", "json shape").(map[string]any)
	if released["key"] != "jobs/json" || released["released"] != true || released["was_live"] != true || released["token"] != float64(l.Token()) {
		t.Fatalf("leases release --json: %v", released)
	}
	shown := run("leases", "show", "jobs/json").(map[string]any)
	lease := shown["lease"].(map[string]any)
	if lease["state"] != "released" || lease["live"] != false || lease["remaining_ms"] != float64(0) || lease["released_at"] == nil {
		t.Fatalf("leases show --json after release: %v", lease)
	}
	history := shown["history"].([]any)
	if len(history) != 2 || history[0].(map[string]any)["event"] != "force_released" || history[0].(map[string]any)["reason"] != "json shape" {
		t.Fatalf("leases show --json history: %v", history)
	}
	run("leases", "pause", "jobs/", "--reason", "json shape")
	run("leases", "resume", "jobs/")

	tables := run("tables", "list").(map[string]any)["tables"].([]any)
	if len(tables) != 1 || tables[0].(map[string]any)["table"] != "items" || tables[0].(map[string]any)["resource_column"] != "id" {
		t.Fatalf("tables list --json: %v", tables)
	}
}

func snakeCase(k string) bool {
	if k == "" || k[0] < 'a' || k[0] > 'z' {
		return false
	}
	for _, r := range k {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}
