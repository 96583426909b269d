package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// doctorRun runs `doctor --json` and returns its exit code and checks by
// name.
func doctorRun(t *testing.T, url string) (int, map[string]check) {
	t.Helper()
	code, out, errOut := cli(t, map[string]string{"DATABASE_URL": url}, "doctor", "--json")
	var res doctorJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("doctor --json: code %d, %v\n%s%s", code, err, out, errOut)
	}
	got := map[string]check{}
	for _, c := range res.Checks {
		got[c.Name] = c
	}
	return code, got
}

// wantCheck fails the test unless check name has status and its detail
// holds every want.
func wantCheck(t *testing.T, got map[string]check, name, status string, want ...string) {
	t.Helper()
	c, ok := got[name]
	if !ok {
		t.Errorf("doctor reports no %q check", name)
		return
	}
	if c.Status != status {
		t.Errorf("check %q: status %s, want %s: %s", name, c.Status, status, c.Detail)
	}
	for _, w := range want {
		if !strings.Contains(c.Detail, w) {
			t.Errorf("check %q lacks %q: %s", name, w, c.Detail)
		}
	}
}

// newRole creates a role with a unique name (roles are cluster-wide),
// dropped with what it owns in db when the test ends.
func newRole(t *testing.T, db *pgfencetest.Database, prefix, options string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := prefix + hex.EncodeToString(b[:])
	if _, err := db.Pool.Exec(context.Background(), `CREATE ROLE `+name+` `+options); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+name+` CASCADE`)
		if _, err := db.Pool.Exec(context.Background(), `DROP ROLE `+name); err != nil {
			t.Logf("drop role %s: %v", name, err)
		}
	})
	return name
}

func mustExec(t *testing.T, db *pgfencetest.Database, sql string) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// On a clean installation every check added for the schema's trust, the
// pgfence roles, the migration lock and protected resource columns holds.
func TestDoctorTrustCleanInstall(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	mustExec(t, db, `CREATE TABLE public.accounts (id bigint PRIMARY KEY, name text COLLATE "C" UNIQUE)`)
	mustExec(t, db, `SELECT pgfence.protect('public.accounts', 'id', 'acct:')`)
	code, got := doctorRun(t, db.URL)
	if code != exitOK {
		t.Errorf("doctor on a clean installation: code %d, %+v", code, got)
	}
	wantCheck(t, got, "ownership", statusOK, "the role that migrated")
	wantCheck(t, got, "schema privileges", statusOK)
	wantCheck(t, got, "role attributes", statusOK)
	wantCheck(t, got, "security definer functions", statusOK, "search_path pinned")
	wantCheck(t, got, "migration lock", statusOK, "free")
	wantCheck(t, got, "protected resource columns", statusOK)
}

// Objects in schema pgfence another role owns, SECURITY DEFINER functions
// of another owner or without a pinned search_path, and a grant that lets
// another role write a pgfence table fail the doctor; so does the schema
// itself handed to another role.
func TestDoctorOwnership(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	other := newRole(t, db, "pgfence_t_doc_other_", "NOLOGIN")
	var migrator string
	if err := db.Pool.QueryRow(context.Background(), `SELECT current_user`).Scan(&migrator); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE pgfence.planted_table (a int)`,
		`ALTER TABLE pgfence.planted_table OWNER TO ` + other,
		`CREATE SEQUENCE pgfence.planted_seq`,
		`ALTER SEQUENCE pgfence.planted_seq OWNER TO ` + other,
		`CREATE TYPE pgfence.planted_type AS ENUM ('a')`,
		`ALTER TYPE pgfence.planted_type OWNER TO ` + other,
		// SECURITY DEFINER, another owner, no search_path.
		`CREATE FUNCTION pgfence.planted_definer() RETURNS int LANGUAGE sql SECURITY DEFINER AS 'SELECT 1'`,
		`ALTER FUNCTION pgfence.planted_definer() OWNER TO ` + other,
		// SECURITY DEFINER, the schema's owner, a search_path that
		// searches public first.
		`CREATE FUNCTION pgfence.planted_path() RETURNS int LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_catalog AS 'SELECT 1'`,
		// SECURITY DEFINER, the schema's owner, pinned: nothing to say.
		`CREATE FUNCTION pgfence.planted_pinned() RETURNS int LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS 'SELECT 1'`,
		`GRANT INSERT ON pgfence.leases TO ` + other,
	} {
		mustExec(t, db, q)
	}
	code, got := doctorRun(t, db.URL)
	if code != exitFailure {
		t.Errorf("doctor with foreign objects in schema pgfence: code %d, want %d", code, exitFailure)
	}
	wantCheck(t, got, "ownership", statusFail,
		"table pgfence.planted_table is owned by role "+other,
		"sequence pgfence.planted_seq is owned by role "+other,
		"type pgfence.planted_type is owned by role "+other,
		"function pgfence.planted_definer() is owned by role "+other,
		"not by the migrating role "+migrator)
	wantCheck(t, got, "security definer functions", statusFail,
		"function pgfence.planted_definer() is owned by role "+other+", not by the schema's owner "+migrator,
		"function pgfence.planted_definer() sets no search_path",
		"function pgfence.planted_path() sets search_path=public, pg_catalog")
	if c := got["security definer functions"]; strings.Contains(c.Detail, "planted_pinned") || strings.Contains(c.Detail, "pgfence.next_token") {
		t.Errorf("security definer functions name a pinned function of the schema's owner: %s", c.Detail)
	}
	wantCheck(t, got, "schema privileges", statusFail, "grants INSERT to "+other, "REVOKE INSERT ON pgfence.leases FROM "+other)

	// The schema handed to another role: the role that migrated still owns
	// everything in it, and the doctor says to give the schema back.
	db2 := pgfencetest.NewDatabase(t)
	mustExec(t, db2, `ALTER SCHEMA pgfence OWNER TO `+other)
	t.Cleanup(func() { _, _ = db2.Pool.Exec(context.Background(), `DROP SCHEMA pgfence CASCADE`) })
	code, got = doctorRun(t, db2.URL)
	if code != exitFailure {
		t.Errorf("doctor on a schema handed to %s: code %d, want %d", other, code, exitFailure)
	}
	wantCheck(t, got, "ownership", statusFail,
		"schema pgfence is owned by role "+other+", not by the migrating role "+migrator,
		"ALTER SCHEMA pgfence OWNER TO "+migrator)
	if c := got["ownership"]; strings.Contains(c.Detail, "function pgfence.") {
		t.Errorf("ownership names the objects the role that migrated still owns: %s", c.Detail)
	}
}

// pgfence_app or pgfence_operator able to log in, with an attribute, or a
// member of another role fails the doctor. Roles are cluster-wide: this
// test has a cluster of its own.
func TestDoctorRoleAttributes(t *testing.T) {
	t.Parallel()
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	mustExec(t, db, `ALTER ROLE pgfence_app LOGIN SUPERUSER`)
	mustExec(t, db, `ALTER ROLE pgfence_operator CREATEDB CREATEROLE REPLICATION BYPASSRLS`)
	mustExec(t, db, `GRANT pg_read_all_data TO pgfence_operator`)
	code, got := doctorRun(t, db.URL)
	if code != exitFailure {
		t.Errorf("doctor with pgfence roles that have attributes: code %d, want %d", code, exitFailure)
	}
	wantCheck(t, got, "role attributes", statusFail,
		"role pgfence_app exists with LOGIN, SUPERUSER",
		"role pgfence_operator exists with CREATEDB, CREATEROLE, REPLICATION, BYPASSRLS",
		"role pgfence_operator is a member of role pg_read_all_data",
		"ALTER ROLE pgfence_app NOLOGIN NOSUPERUSER;",
		"REVOKE pg_read_all_data FROM pgfence_operator;")

	mustExec(t, db, `ALTER ROLE pgfence_app NOLOGIN NOSUPERUSER`)
	mustExec(t, db, `ALTER ROLE pgfence_operator NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS`)
	mustExec(t, db, `REVOKE pg_read_all_data FROM pgfence_operator`)
	if code, got = doctorRun(t, db.URL); code != exitOK {
		t.Errorf("doctor once the roles are plain groups again: code %d, %+v", code, got)
	}
	wantCheck(t, got, "role attributes", statusOK)
}

// The doctor says who holds the migration lock and since when, tells a
// lock whose lease lapsed (the next migration takes it over) from one a
// running migration renews, names a transaction that writes the lock
// without having committed, and waits for none of them.
func TestDoctorMigrationLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	hold := func(lease time.Duration) {
		t.Helper()
		mustExec(t, db, fmt.Sprintf(`DELETE FROM pgfence.migration_lock;
			INSERT INTO pgfence.migration_lock (holder, host, pid, application, db_user, locked_at, lease_until)
			VALUES (gen_random_uuid(), 'build-7', 4242, 'deploy', current_user, clock_timestamp() - interval '1 hour',
			        clock_timestamp() + make_interval(secs => %f))`, lease.Seconds()))
	}

	hold(-time.Minute)
	code, got := doctorRun(t, db.URL)
	if code != exitOK {
		t.Errorf("doctor with a stale migration lock: code %d (a warning, not a failure)", code)
	}
	wantCheck(t, got, "migration lock", statusWarn, "stale: held by host build-7, pid 4242, application \"deploy\"", "lease lapsed", "DELETE FROM pgfence.migration_lock")

	hold(time.Minute)
	_, got = doctorRun(t, db.URL)
	wantCheck(t, got, "migration lock", statusWarn, "held by a running migration: host build-7, pid 4242")
	if strings.Contains(got["migration lock"].Detail, "stale") {
		t.Errorf("a live lock called stale: %s", got["migration lock"].Detail)
	}

	// A script's lock row, not committed yet: invisible to readers, named
	// by the lock its transaction holds; the doctor does not wait for it.
	mustExec(t, db, `DELETE FROM pgfence.migration_lock`)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var pid int
	if err := tx.QueryRow(ctx, `INSERT INTO pgfence.migration_lock (holder, host, pid, application, db_user, locked_at, lease_until)
		VALUES (gen_random_uuid(), 'psql', pg_backend_pid(), 'psql', current_user, clock_timestamp(), 'infinity')
		RETURNING pid`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, got = doctorRun(t, db.URL)
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("doctor took %s with an uncommitted lock row", took)
	}
	wantCheck(t, got, "migration lock", statusWarn, fmt.Sprintf("pid %d", pid), "has not committed")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// A member of pgfence_operator may not read the lock: the doctor says
	// so and fails nothing for it.
	operator := newRole(t, db, "pgfence_t_doc_op_", "LOGIN PASSWORD 'not-a-secret' IN ROLE pgfence_operator")
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	hold(-time.Minute)
	_, got = doctorRun(t, fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=not-a-secret", cfg.Host, cfg.Port, cfg.Database, operator))
	wantCheck(t, got, "migration lock", statusOK, "holder not checked: only the schema's owner may read pgfence.migration_lock")
	wantCheck(t, got, "ownership", statusOK)
	wantCheck(t, got, "role attributes", statusOK)
	wantCheck(t, got, "security definer functions", statusOK)
}

// Tables protected before protect() refused char(n), numeric and
// nondeterministic collations as resource columns are reported.
func TestDoctorRefusedResourceColumns(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	guard := func(table, column string) string {
		// By hand, as protect() did before it refused these columns.
		return fmt.Sprintf(`CREATE TRIGGER pgfence_guard AFTER INSERT OR UPDATE OR DELETE ON public.%s
		    FOR EACH ROW EXECUTE FUNCTION pgfence.guard('%s', '%s:')`, table, column, table)
	}
	mustExec(t, db, `CREATE TABLE public.padded (k char(8) PRIMARY KEY)`)
	mustExec(t, db, guard("padded", "k"))
	mustExec(t, db, `CREATE TABLE public.scaled (k numeric PRIMARY KEY)`)
	mustExec(t, db, guard("scaled", "k"))
	mustExec(t, db, `CREATE TABLE public.fine (k text COLLATE "C" PRIMARY KEY)`)
	mustExec(t, db, `SELECT pgfence.protect('public.fine', 'k', 'fine:')`)
	want := []string{"padded.k (character(8))", "scaled.k (numeric)", "protect refuses such a resource column now"}
	// ICU's nondeterministic collations exist only where PostgreSQL was
	// built with ICU.
	if _, err := db.Pool.Exec(context.Background(), `CREATE COLLATION public.nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`); err != nil {
		if pgerr.Code(err) != "0A000" { // feature_not_supported: a server built without ICU
			t.Fatal(err)
		}
		t.Logf("no nondeterministic collation on this server (%v): that case is not checked", err)
	} else {
		mustExec(t, db, `CREATE TABLE public.folded (k text COLLATE public.nocase PRIMARY KEY)`)
		mustExec(t, db, guard("folded", "k"))
		want = append(want, "folded.k (text COLLATE public.nocase, nondeterministic)")
	}
	_, got := doctorRun(t, db.URL)
	wantCheck(t, got, "protected resource columns", statusWarn, want...)
	if c := got["protected resource columns"]; strings.Contains(c.Detail, "fine") {
		t.Errorf("a text column with a deterministic collation reported: %s", c.Detail)
	}
}

// The doctor reports exactly the resource columns protect() refuses: for
// each type, protect either accepts the column, or refuses it and the
// doctor names a table guarded on it by hand.
func TestDoctorResourceColumnsMatchProtect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	mustExec(t, db, `CREATE DOMAIN public.code AS text; CREATE DOMAIN public.padded AS char(3)`)
	types := []string{"text", "varchar(10)", "smallint", "integer", "bigint", "uuid", `text COLLATE "C"`, "public.code",
		"char(4)", "numeric", "numeric(10,2)", "timestamptz", "double precision", "interval", "date", "boolean", "public.padded"}
	refused := map[string]bool{}
	for i, typ := range types {
		table := fmt.Sprintf("col_%d", i)
		mustExec(t, db, fmt.Sprintf(`CREATE TABLE public.%s (k %s PRIMARY KEY)`, table, typ))
		if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`SELECT pgfence.protect('public.%s', 'k', '%s:')`, table, table)); err != nil {
			if !strings.Contains(err.Error(), "PF008") && !strings.Contains(err.Error(), "must be") {
				t.Fatalf("protect on %s: %v", typ, err)
			}
			refused[table] = true
			mustExec(t, db, fmt.Sprintf(`CREATE TRIGGER pgfence_guard AFTER INSERT OR UPDATE OR DELETE ON public.%s
			    FOR EACH ROW EXECUTE FUNCTION pgfence.guard('k', '%s:')`, table, table))
		}
	}
	if len(refused) == 0 || len(refused) == len(types) {
		t.Fatalf("protect refused %d of %d types: the test no longer tells them apart", len(refused), len(types))
	}
	_, got := doctorRun(t, db.URL)
	detail := got["protected resource columns"].Detail
	for i, typ := range types {
		table := fmt.Sprintf("col_%d", i)
		if reported := strings.Contains(detail, table+".k ("); reported != refused[table] {
			t.Errorf("%s: protect refused it: %v, the doctor reports it: %v", typ, refused[table], reported)
		}
	}
}
