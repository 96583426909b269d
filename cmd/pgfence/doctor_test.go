package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestDoctor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}

	code, out, errOut := cli(t, environ, "doctor")
	if code != exitOK {
		t.Fatalf("doctor on a healthy database: code %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"schema version", "synchronous_commit", "idle_in_transaction_session_timeout", "no transaction-mode pooler"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}

	// An expired, unreleased lease and a fenced-looking table without a trigger.
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at)
		VALUES ('job', gen_random_uuid(), pgfence.next_token(NULL), clock_timestamp() - interval '1 minute', clock_timestamp() - interval '30 seconds');
		CREATE TABLE public.reports (id int PRIMARY KEY, fence_token bigint NOT NULL);
		-- protected on a timestamptz column, which protect() refuses, by hand
		CREATE TABLE public.slots (at timestamptz PRIMARY KEY);
		CREATE TRIGGER pgfence_guard BEFORE INSERT OR UPDATE OR DELETE ON public.slots
		    FOR EACH ROW EXECUTE FUNCTION pgfence.guard('at', 'slot:')`); err != nil {
		t.Fatal(err)
	}
	code, out, _ = cli(t, environ, "doctor", "--json")
	var res struct {
		Checks []check
		Failed int
	}
	if code != exitOK || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("doctor --json: code %d\n%s", code, out)
	}
	got := map[string]check{}
	for _, c := range res.Checks {
		got[c.Name] = c
	}
	if c := got["leases"]; c.Status != statusWarn || !strings.Contains(c.Detail, "1 past expiry") {
		t.Errorf("leases check = %+v, want a warning about 1 expired lease", c)
	}
	if c := got["protected tables"]; c.Status != statusWarn || !strings.Contains(c.Detail, "public.reports") {
		t.Errorf("protected tables check = %+v, want a warning naming public.reports", c)
	}
	if c := got["protected resource columns"]; c.Status != statusWarn || !strings.Contains(c.Detail, "slots.at (timestamp with time zone)") {
		t.Errorf("protected resource columns check = %+v, want a warning naming slots.at", c)
	}

	// A missing schema fails the doctor.
	if _, err := db.Pool.Exec(ctx, `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, environ, "doctor")
	if code != exitFailure || !strings.Contains(out, "migrate up") || !strings.Contains(errOut, "check(s) failed") {
		t.Fatalf("doctor without schema: code %d\n%s%s", code, out, errOut)
	}
}

// A schema whose version table records nothing (installed by a script from
// before `migrate sql` recorded its versions) is not "not installed": `migrate
// up` would fail on the objects that exist.
func TestDoctorUnrecordedSchema(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	if _, err := db.Pool.Exec(context.Background(), `DELETE FROM pgfence.goose_db_version WHERE version_id > 0`); err != nil {
		t.Fatal(err)
	}
	c := doctorCheck(t, map[string]string{"DATABASE_URL": db.URL}, "schema")
	if c.Status != statusFail || !strings.Contains(c.Detail, "records no migration") || strings.Contains(c.Detail, "not installed") {
		t.Fatalf("schema check = %+v, want a failure naming the unrecorded objects", c)
	}
}

// The doctor names every way past a protected table's guard that
// protected_tables() does not show.
func TestDoctorGuardGaps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	exec := func(q string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE public.clean (k text PRIMARY KEY)`)
	exec(`SELECT pgfence.protect('public.clean', 'k', 'c:')`)
	// A BEFORE trigger named to sort before the guard is harmless.
	exec(`CREATE FUNCTION public.lower_k() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN NEW.k := lower(NEW.k); RETURN NEW; END'`)
	exec(`CREATE TRIGGER a_lower BEFORE INSERT ON public.clean FOR EACH ROW EXECUTE FUNCTION public.lower_k()`)
	if c := doctorCheck(t, environ, "protected table guards"); c.Status != statusOK {
		t.Fatalf("guards of a correctly protected table: %+v", c)
	}

	// A BEFORE guard, made by hand (protect() makes an AFTER guard), and a
	// BEFORE trigger that runs after it; with protect()'s AFTER guard the
	// same trigger is harmless.
	exec(`CREATE TABLE public.jobs (k text PRIMARY KEY)`)
	exec(`CREATE TRIGGER pgfence_guard BEFORE INSERT OR UPDATE OR DELETE ON public.jobs
	          FOR EACH ROW EXECUTE FUNCTION pgfence.guard('k', 'jobs:')`)
	exec(`CREATE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON public.jobs
	          FOR EACH STATEMENT EXECUTE FUNCTION pgfence.reject_truncate()`)
	exec(`CREATE TRIGGER set_key BEFORE INSERT ON public.jobs FOR EACH ROW EXECUTE FUNCTION public.lower_k()`)
	exec(`CREATE TRIGGER set_key BEFORE INSERT ON public.clean FOR EACH ROW EXECUTE FUNCTION public.lower_k()`)
	exec(`CREATE TABLE public.off (k text PRIMARY KEY)`)
	exec(`SELECT pgfence.protect('public.off', 'k', 'off:')`)
	exec(`ALTER TABLE public.off ENABLE REPLICA TRIGGER pgfence_guard`)
	// A partition attached and a child created after protect(), without the
	// event trigger that guards them when they come (a migration not run as
	// a superuser): protect() covered those that existed
	// (TestProtectDescendants), not these.
	exec(`ALTER EVENT TRIGGER pgfence_guard_new_tables DISABLE`)
	exec(`CREATE TABLE public.parts (k text PRIMARY KEY) PARTITION BY LIST (k)`)
	exec(`SELECT pgfence.protect('public.parts', 'k', 'p:')`)
	exec(`CREATE TABLE public.parts_a PARTITION OF public.parts FOR VALUES IN ('a')`)
	exec(`CREATE TABLE public.base (k text PRIMARY KEY)`)
	exec(`SELECT pgfence.protect('public.base', 'k', 'b:')`)
	exec(`CREATE TABLE public.child () INHERITS (public.base)`)
	c := doctorCheck(t, environ, "protected table guards")
	if c.Status != statusWarn {
		t.Fatalf("guard gaps: %+v, want a warning", c)
	}
	for _, want := range []string{
		"jobs: BEFORE trigger set_key fires after its BEFORE guard",
		"off: its pgfence_guard trigger is disabled",
		"parts_a: TRUNCATE is not refused",
		"child: has no pgfence_guard trigger",
		"child: TRUNCATE is not refused",
		"the event trigger pgfence_guard_new_tables is missing or disabled",
	} {
		if !strings.Contains(c.Detail, want) {
			t.Errorf("guard gaps lack %q:\n%s", want, c.Detail)
		}
	}
	if strings.Contains(c.Detail, "clean") || strings.Contains(c.Detail, "parts_a: has no") {
		t.Errorf("guard gaps name a table without a gap:\n%s", c.Detail)
	}
}

// doctorTrap shadows, in schema trap, the pg_catalog functions and operators
// the doctor's catalog statements use, except those that statements of the
// libraries it calls resolve on the caller's search_path
// (pgfence.protected_tables(): = on names and oids; the migrator's version
// check: to_regclass). Each raises when called.
const doctorTrap = `
CREATE SCHEMA trap;
CREATE FUNCTION trap.sprung() RETURNS boolean LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'search_path trap sprung'; END$$;
-- The settings the doctor reads spring it; others (read by code the doctor
-- does not own) pass through.
CREATE FUNCTION trap.current_setting(name text) RETURNS text LANGUAGE sql SET search_path = pg_catalog AS $$
    SELECT CASE WHEN name IN ('server_version', 'synchronous_commit', 'synchronous_standby_names',
                              'idle_in_transaction_session_timeout', 'lock_timeout')
                THEN (SELECT 'x' WHERE trap.sprung()) ELSE current_setting(name) END$$;
CREATE FUNCTION trap.pg_is_in_recovery() RETURNS boolean LANGUAGE sql AS 'SELECT trap.sprung()';
CREATE FUNCTION trap.pg_backend_pid() RETURNS integer LANGUAGE sql AS 'SELECT 1 WHERE trap.sprung()';
CREATE FUNCTION trap.format_type(oid, integer) RETURNS text LANGUAGE sql AS 'SELECT ''x'' WHERE trap.sprung()';
CREATE FUNCTION trap.count_step(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint WHERE trap.sprung()';
CREATE AGGREGATE trap.count(*) (SFUNC = trap.count_step, STYPE = bigint, INITCOND = '0');
CREATE FUNCTION trap.text_eq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT trap.sprung()';
CREATE OPERATOR trap.= (LEFTARG = text, RIGHTARG = text, FUNCTION = trap.text_eq);
CREATE FUNCTION trap.char_eq("char", "char") RETURNS boolean LANGUAGE sql AS 'SELECT trap.sprung()';
CREATE OPERATOR trap.= (LEFTARG = "char", RIGHTARG = "char", FUNCTION = trap.char_eq);
CREATE FUNCTION trap.name_ne(name, name) RETURNS boolean LANGUAGE sql AS 'SELECT trap.sprung()';
CREATE OPERATOR trap.<> (LEFTARG = name, RIGHTARG = name, FUNCTION = trap.name_ne);
CREATE FUNCTION trap.name_gt(name, name) RETURNS boolean LANGUAGE sql AS 'SELECT trap.sprung()';
CREATE OPERATOR trap.> (LEFTARG = name, RIGHTARG = name, FUNCTION = trap.name_gt);
CREATE FUNCTION trap.name_like(name, text) RETURNS boolean LANGUAGE sql AS 'SELECT trap.sprung()';
CREATE OPERATOR trap.~~ (LEFTARG = name, RIGHTARG = text, FUNCTION = trap.name_like);
CREATE FUNCTION trap.int2_and(smallint, integer) RETURNS integer LANGUAGE sql AS 'SELECT 1 WHERE trap.sprung()';
CREATE OPERATOR trap.& (LEFTARG = smallint, RIGHTARG = integer, FUNCTION = trap.int2_and)`

// The doctor checks what is there, whatever the session's search_path: a
// role or database whose search_path puts other functions and operators
// before pg_catalog's changes none of its statements.
func TestDoctorIgnoresSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	if _, err := db.Pool.Exec(ctx, doctorTrap); err != nil {
		t.Fatal(err)
	}
	// Something for every check to find: a fenced-looking table, a
	// protected one whose resource column depends on session settings, and
	// a BEFORE guard with a BEFORE trigger after it.
	if _, err := db.Pool.Exec(ctx, `
		CREATE TABLE public.reports (id int PRIMARY KEY, fence_token bigint NOT NULL);
		CREATE TABLE public.slots (at timestamptz PRIMARY KEY);
		CREATE TRIGGER pgfence_guard BEFORE INSERT OR UPDATE OR DELETE ON public.slots
		    FOR EACH ROW EXECUTE FUNCTION pgfence.guard('at', 'slot:');
		CREATE FUNCTION public.noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
		CREATE TRIGGER set_key BEFORE INSERT ON public.slots FOR EACH ROW EXECUTE FUNCTION public.noop();
		SELECT pgfence.grant_prefix('pgfence_operator', 'stock:');
		SELECT pgfence.grant_prefix('pgfence_app', 'stock')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db.Name}.Sanitize()+` SET search_path = trap, pg_catalog, public`); err != nil {
		t.Fatal(err)
	}
	environ := map[string]string{"DATABASE_URL": db.URL}
	// The trap works: an unqualified statement in such a session springs it.
	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var setting string
	if err := pool.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&setting); err == nil || !strings.Contains(err.Error(), "trap sprung") {
		t.Fatalf("an unqualified call with the trap on the search_path: %q, %v; want the trap", setting, err)
	}

	_, out, errOut := cli(t, environ, "doctor", "--json")
	var res doctorJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("doctor --json: %v\n%s%s", err, out, errOut)
	}
	got := map[string]check{}
	for _, c := range res.Checks {
		got[c.Name] = c
		if c.Status == statusFail || strings.Contains(c.Detail, "trap") {
			t.Errorf("check %+v: the search_path reached it", c)
		}
	}
	for name, want := range map[string]string{
		"protected tables":           "public.reports",
		"protected resource columns": "slots.at",
		"protected table guards":     "BEFORE trigger set_key",
		"prefix grants":              "pgfence_app 'stock' and pgfence_operator 'stock:'",
	} {
		if c := got[name]; c.Status != statusWarn || !strings.Contains(c.Detail, want) {
			t.Errorf("check %q = %+v, want a warning naming %s", name, c, want)
		}
	}
	if len(res.Checks) < 12 {
		t.Errorf("doctor ran %d checks, want every one:\n%s", len(res.Checks), out)
	}
}

// Two services whose prefixes start one another ('stock' over 'stock:') may
// both use the names under the longer one: grant_prefix warns as it grants,
// and the doctor lists every such pair, also those granted before.
func TestDoctorPrefixOverlaps(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	stock := newRole(t, db, "stock_service_", "NOLOGIN IN ROLE pgfence_app")
	orders := newRole(t, db, "orders_service_", "NOLOGIN IN ROLE pgfence_app")
	reports := newRole(t, db, "reports_service_", "NOLOGIN IN ROLE pgfence_app")
	mustExec(t, db, `SELECT pgfence.grant_prefix('`+stock+`', 'stock:'), pgfence.grant_prefix('`+orders+`', 'orders/'),
		pgfence.grant_prefix('`+stock+`', 'stock/')`)
	if c := doctorCheck(t, environ, "prefix grants"); c.Status != statusOK {
		t.Fatalf("prefix grants check with apart prefixes = %+v, want ok", c)
	}

	mustExec(t, db, `SELECT pgfence.grant_prefix('`+orders+`', 'stock'), pgfence.grant_prefix('`+reports+`', 'orders/')`)
	c := doctorCheck(t, environ, "prefix grants")
	for _, want := range []string{
		orders + " 'stock' and " + stock + " 'stock:' share the names under 'stock:'",
		orders + " 'stock' and " + stock + " 'stock/'",
		"'orders/' and ",
	} {
		if c.Status != statusWarn || !strings.Contains(c.Detail, want) {
			t.Errorf("prefix grants check = %+v, want a warning naming %q", c, want)
		}
	}
	if n := strings.Count(c.Detail, "share the names"); n != 3 {
		t.Errorf("prefix grants check lists %d pairs, want 3 (each once): %s", n, c.Detail)
	}
}
