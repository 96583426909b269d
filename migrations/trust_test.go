package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// otherRole creates a NOLOGIN role with a unique name (roles are
// cluster-wide), dropped with what it owns in db when the test ends.
func otherRole(t *testing.T, db *pgfencetest.Database) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "pgfence_t_other_" + hex.EncodeToString(b[:])
	mustExecPool(t, db.Pool, `CREATE ROLE `+name+` NOLOGIN`)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+name+` CASCADE`)
		if _, err := db.Pool.Exec(context.Background(), `DROP ROLE `+name); err != nil {
			t.Logf("drop role %s: %v", name, err)
		}
	})
	return name
}

// fingerprint describes what a refused migration must leave as it was:
// every object of schema pgfence with its owner and privileges, the
// version table's rows, the pgfence roles and the default privileges.
func fingerprint(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT 'schema ' || n.nspname || ' ' || n.nspowner::regrole::text || ' ' || coalesce(n.nspacl::text, '')
		  FROM pg_namespace n WHERE n.nspname = 'pgfence'
		UNION ALL
		SELECT 'relation ' || c.relname || ' ' || c.relowner::regrole::text || ' ' || coalesce(c.relacl::text, '')
		  FROM pg_class c WHERE c.relnamespace = to_regnamespace('pgfence')
		UNION ALL
		SELECT 'function ' || p.oid::regprocedure::text || ' ' || p.proowner::regrole::text || ' ' || md5(p.prosrc)
		  FROM pg_proc p WHERE p.pronamespace = to_regnamespace('pgfence')
		UNION ALL
		SELECT 'type ' || t.typname || ' ' || t.typowner::regrole::text
		  FROM pg_type t WHERE t.typnamespace = to_regnamespace('pgfence')
		UNION ALL
		SELECT 'role ' || r.rolname || ' ' || concat(r.rolcanlogin, r.rolsuper, r.rolcreatedb, r.rolcreaterole, r.rolreplication, r.rolbypassrls)
		  FROM pg_roles r WHERE r.rolname LIKE 'pgfence\_%' AND r.rolname NOT LIKE 'pgfence\_t\_%'
		UNION ALL
		SELECT 'default acl ' || d.defaclobjtype::text || ' ' || d.defaclacl::text FROM pg_default_acl d
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var versions string
	if err := pool.QueryRow(context.Background(), `SELECT CASE WHEN to_regclass('pgfence.goose_db_version') IS NULL THEN 'none'
		ELSE (SELECT coalesce(string_agg(version_id::text, ',' ORDER BY id), '') FROM pgfence.goose_db_version) END`).Scan(&versions); err != nil {
		// The version table exists but cannot be read as one query: fall back.
		versions = "?"
	}
	return strings.Join(lines, "\n") + "\nversions " + versions
}

// applyPsql applies a script with psql, as the README says.
func applyPsql(t *testing.T, url, script string) (string, error) {
	t.Helper()
	psql, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("psql not on PATH")
		}
		t.Skip("psql not on PATH")
	}
	file := filepath.Join(t.TempDir(), "pgfence.sql")
	if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(psql, "--no-psqlrc", "--quiet", "--single-transaction", "-v", "ON_ERROR_STOP=1", "-f", file, url).CombinedOutput()
	return string(out), err
}

// refused checks that Up and DownTo (on an installed schema), a script
// applied with pgx and, with viaPsql, with psql refuse the database of db
// with errors that say every text of want, and change nothing.
func refused(t *testing.T, db *pgfencetest.Database, script string, viaPsql bool, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := newMigrator(t, db.Pool)
	before := fingerprint(t, db.Pool)
	saysAll := func(how, msg string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: the error does not say %q:\n%s", how, w, msg)
			}
		}
	}

	_, err := m.Up(ctx)
	var ue *migrations.UntrustedError
	if !errors.As(err, &ue) || !errors.Is(err, migrations.ErrUntrusted) {
		t.Fatalf("Up: %v, want an *UntrustedError", err)
	}
	if ue.Role == "" || len(ue.Findings) == 0 {
		t.Errorf("Up: %#v: no role or no findings", ue)
	}
	saysAll("Up", err.Error())
	if after := fingerprint(t, db.Pool); after != before {
		t.Fatalf("Up changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if current, _, _ := m.Version(ctx); current > 0 {
		if _, err := m.DownTo(ctx, 0); !errors.As(err, &ue) {
			t.Fatalf("DownTo: %v, want an *UntrustedError", err)
		}
		if after := fingerprint(t, db.Pool); after != before {
			t.Fatalf("DownTo changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	}

	err = applyScript(ctx, db.Pool, script)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("script via pgx: %v, want SQLSTATE 42501", err)
	}
	saysAll("script via pgx", pe.Message+"\n"+pe.Detail+"\n"+pe.Hint)
	if after := fingerprint(t, db.Pool); after != before {
		t.Fatalf("the script changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	if viaPsql {
		out, err := applyPsql(t, db.URL, script)
		if err == nil || !strings.Contains(out, "refusing to migrate") {
			t.Fatalf("script via psql: %v\n%s", err, out)
		}
		saysAll("script via psql", out)
		if after := fingerprint(t, db.Pool); after != before {
			t.Fatalf("psql changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	}
}

// The reproduced escalation: a database owned by the application role,
// which creates schema pgfence and its own next_token before a superuser
// migrates. Every way of migrating refuses, and changes nothing.
func TestForeignSchemaRefused(t *testing.T) {
	t.Parallel()
	for _, objects := range []bool{false, true} {
		name := "empty"
		if objects {
			name = "with objects"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := blankDatabase(t)
			app := otherRole(t, db)
			mustExecPool(t, db.Pool, `ALTER DATABASE `+db.Name+` OWNER TO `+app)
			t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `ALTER DATABASE `+db.Name+` OWNER TO CURRENT_USER`) })
			stmts := []string{`SET LOCAL ROLE ` + app, `CREATE SCHEMA pgfence`}
			if objects {
				stmts = append(stmts,
					`CREATE FUNCTION pgfence.next_token(previous bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1'`,
					`CREATE TABLE pgfence.token_floor (floor bigint)`,
					`CREATE TYPE pgfence.mood AS ENUM ('x')`,
					`CREATE SEQUENCE pgfence.tokens`)
			}
			if err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
				for _, s := range stmts {
					if _, err := tx.Exec(context.Background(), s); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			want := []string{"schema pgfence", "is owned by role " + app, "DROP SCHEMA pgfence CASCADE"}
			if objects {
				want = append(want, "function pgfence.next_token(bigint)", "table pgfence.token_floor", "type pgfence.mood", "sequence pgfence.tokens")
			}
			refused(t, db, installScript(t), true, want...)
		})
	}
}

// Another role's object in a schema the migrating role owns is refused,
// whatever its kind.
func TestForeignObjectRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		kind, create, alter, named string
	}{
		{"table", `CREATE TABLE pgfence.t (a int)`, `ALTER TABLE pgfence.t`, "table pgfence.t"},
		{"partitioned table", `CREATE TABLE pgfence.pt (a int) PARTITION BY RANGE (a)`, `ALTER TABLE pgfence.pt`, "table pgfence.pt"},
		{"sequence", `CREATE SEQUENCE pgfence.s`, `ALTER SEQUENCE pgfence.s`, "sequence pgfence.s"},
		{"view", `CREATE VIEW pgfence.v AS SELECT 1 AS a`, `ALTER VIEW pgfence.v`, "view pgfence.v"},
		{"materialized view", `CREATE MATERIALIZED VIEW pgfence.mv AS SELECT 1 AS a`, `ALTER MATERIALIZED VIEW pgfence.mv`, "materialized view pgfence.mv"},
		{"function", `CREATE FUNCTION pgfence.f(int) RETURNS int LANGUAGE sql AS 'SELECT 1'`, `ALTER FUNCTION pgfence.f(int)`, "function pgfence.f(integer)"},
		{"procedure", `CREATE PROCEDURE pgfence.p() LANGUAGE sql AS 'SELECT 1'`, `ALTER PROCEDURE pgfence.p()`, "function pgfence.p()"},
		{"aggregate", `CREATE AGGREGATE pgfence.agg(int) (sfunc = int4pl, stype = int)`, `ALTER AGGREGATE pgfence.agg(int)`, "function pgfence.agg(integer)"},
		{"enum", `CREATE TYPE pgfence.e AS ENUM ('a')`, `ALTER TYPE pgfence.e`, "type pgfence.e"},
		{"composite type", `CREATE TYPE pgfence.c AS (a int)`, `ALTER TYPE pgfence.c`, "composite type pgfence.c"},
		{"range type", `CREATE TYPE pgfence.r AS RANGE (subtype = int)`, `ALTER TYPE pgfence.r`, "type pgfence.r"},
		{"domain", `CREATE DOMAIN pgfence.d AS int`, `ALTER DOMAIN pgfence.d`, "type pgfence.d"},
		{"operator", `CREATE OPERATOR pgfence.=== (leftarg = int, rightarg = int, function = int4eq)`, `ALTER OPERATOR pgfence.=== (int, int)`, "operator pgfence.===(integer,integer)"},
		{"operator family", `CREATE OPERATOR FAMILY pgfence.fam USING btree`, `ALTER OPERATOR FAMILY pgfence.fam USING btree`, "operator family pgfence.fam"},
		{"collation", `CREATE COLLATION pgfence.coll FROM "C"`, `ALTER COLLATION pgfence.coll`, "collation pgfence.coll"},
		{"conversion", `CREATE CONVERSION pgfence.conv FOR 'LATIN1' TO 'UTF8' FROM iso8859_1_to_utf8`, `ALTER CONVERSION pgfence.conv`, "conversion pgfence.conv"},
		{"text search dictionary", `CREATE TEXT SEARCH DICTIONARY pgfence.dict (TEMPLATE = simple)`, `ALTER TEXT SEARCH DICTIONARY pgfence.dict`, "text search dictionary pgfence.dict"},
		{"text search configuration", `CREATE TEXT SEARCH CONFIGURATION pgfence.cfg (COPY = simple)`, `ALTER TEXT SEARCH CONFIGURATION pgfence.cfg`, "text search configuration pgfence.cfg"},
		{"statistics", `CREATE TABLE pgfence.st (a int, b int); CREATE STATISTICS pgfence.stx ON a, b FROM pgfence.st`, `ALTER STATISTICS pgfence.stx`, "statistics object pgfence.stx"},
	} {
		t.Run(c.kind, func(t *testing.T) {
			t.Parallel()
			db := blankDatabase(t)
			other := otherRole(t, db)
			mustExecPool(t, db.Pool, `CREATE SCHEMA pgfence`)
			mustExecPool(t, db.Pool, c.create)
			mustExecPool(t, db.Pool, c.alter+` OWNER TO `+other)
			refused(t, db, installScript(t), false, c.named, "is owned by role "+other)
		})
	}
}

// On an installed schema every run checks again: a pgfence function handed
// to another role, a CREATE or TRIGGER privilege granted, a default
// privilege that would grant writes on what the migrations create.
func TestInstalledSchemaRechecked(t *testing.T) {
	t.Parallel()
	down, err := migrations.Script(migrations.Latest(), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		blank  bool
		setup  string // %s is the other role
		script string
		want   []string
	}{
		{name: "function owner", setup: `ALTER FUNCTION pgfence.next_token(bigint) OWNER TO %s`, script: down,
			want: []string{"function pgfence.next_token(bigint) is owned by role %s"}},
		{name: "schema CREATE", setup: `GRANT CREATE ON SCHEMA pgfence TO %s`, script: down,
			want: []string{"schema pgfence grants CREATE to %s", "REVOKE CREATE ON SCHEMA pgfence FROM %s;"}},
		{name: "schema CREATE to PUBLIC", setup: `GRANT CREATE ON SCHEMA pgfence TO PUBLIC`, script: down,
			want: []string{"schema pgfence grants CREATE to PUBLIC"}},
		{name: "table TRIGGER", setup: `GRANT TRIGGER ON pgfence.leases TO %s`, script: down,
			want: []string{"table pgfence.leases grants TRIGGER to %s", "REVOKE TRIGGER ON pgfence.leases FROM %s;"}},
		{name: "table UPDATE", setup: `GRANT UPDATE ON pgfence.token_floor TO pgfence_operator`, script: down,
			want: []string{"table pgfence.token_floor grants UPDATE to pgfence_operator"}},
		{name: "default privileges on tables", blank: true, setup: `ALTER DEFAULT PRIVILEGES GRANT INSERT, SELECT ON TABLES TO %s`,
			want: []string{"default privileges of role", "grant INSERT on every new tables to %s", "REVOKE INSERT ON TABLES FROM %s;"}},
		{name: "default privileges on functions", blank: true, setup: `ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO %s`,
			want: []string{"grant EXECUTE on every new functions to %s"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var db *pgfencetest.Database
			script := c.script
			if c.blank {
				db, script = blankDatabase(t), installScript(t)
			} else {
				db = pgfencetest.NewDatabase(t)
			}
			other := otherRole(t, db)
			mustExecPool(t, db.Pool, strings.ReplaceAll(c.setup, "%s", other))
			var want []string
			for _, w := range c.want {
				want = append(want, strings.ReplaceAll(w, "%s", other))
			}
			refused(t, db, script, false, want...)
			// Reading needs no trust: doctor and status still work.
			if _, err := newMigrator(t, db.Pool).Status(context.Background()); err != nil {
				t.Fatalf("Status: %v", err)
			}
		})
	}
}

// A search_path that puts a schema before pg_catalog (which the owner of
// the database can set for every session) is refused by the migrator: goose
// records versions with statements the migrator does not write. A script
// pins search_path first, so a function planted in public is never bound
// into pgfence's objects, nor run while migrating.
func TestHostileSearchPath(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := blankDatabase(t)
	mustExecPool(t, db.Pool, `CREATE TABLE public.hijacked (who text)`)
	mustExecPool(t, db.Pool, `CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql
		AS $$ INSERT INTO public.hijacked VALUES (current_user); SELECT pg_catalog.now() $$`)
	mustExecPool(t, db.Pool, `ALTER DATABASE `+db.Name+` SET search_path = public, pg_catalog`)
	hostile, err := pgxpool.New(ctx, db.URL) // new sessions get the setting
	if err != nil {
		t.Fatal(err)
	}
	defer hostile.Close()

	m := newMigrator(t, hostile)
	_, err = m.Up(ctx)
	var ue *migrations.UntrustedError
	if !errors.As(err, &ue) || ue.Findings[0].Object != "search_path" || !strings.Contains(err.Error(), "puts public before pg_catalog") {
		t.Fatalf("Up under search_path = public, pg_catalog: %v, want a search_path finding", err)
	}
	noSchema(t, db.Pool)

	if err := applyScript(ctx, hostile, installScript(t)); err != nil {
		t.Fatalf("script under search_path = public, pg_catalog: %v", err)
	}
	var ran, bound int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM public.hijacked),
		(SELECT count(*) FROM pg_depend WHERE refobjid = 'public.clock_timestamp()'::regprocedure)`).Scan(&ran, &bound); err != nil {
		t.Fatal(err)
	}
	if ran != 0 || bound != 0 {
		t.Fatalf("the script ran public.clock_timestamp() %d times and bound it into %d objects", ran, bound)
	}
}

// Roles named pgfence_app or pgfence_operator that someone created with
// attributes (or in another role) are refused, not adopted. Roles are
// cluster-wide: this test has a cluster of its own.
func TestPreexistingRolesRefused(t *testing.T) {
	t.Parallel()
	cluster := pgfencetest.NewCluster(t, nil)
	admin := cluster.NewDatabase(t)
	script := installScript(t)
	for _, c := range []struct {
		role, grant, revoke string
		want                []string
		psql                bool
	}{
		{"pgfence_app", `ALTER ROLE pgfence_app LOGIN`, `ALTER ROLE pgfence_app NOLOGIN`, []string{"role pgfence_app exists with LOGIN", "ALTER ROLE pgfence_app NOLOGIN;"}, true},
		{"pgfence_app", `ALTER ROLE pgfence_app SUPERUSER`, `ALTER ROLE pgfence_app NOSUPERUSER`, []string{"role pgfence_app exists with SUPERUSER", "ALTER ROLE pgfence_app NOSUPERUSER;"}, false},
		{"pgfence_operator", `ALTER ROLE pgfence_operator CREATEDB`, `ALTER ROLE pgfence_operator NOCREATEDB`, []string{"role pgfence_operator exists with CREATEDB"}, false},
		{"pgfence_operator", `ALTER ROLE pgfence_operator CREATEROLE`, `ALTER ROLE pgfence_operator NOCREATEROLE`, []string{"role pgfence_operator exists with CREATEROLE"}, false},
		{"pgfence_app", `ALTER ROLE pgfence_app REPLICATION BYPASSRLS`, `ALTER ROLE pgfence_app NOREPLICATION NOBYPASSRLS`, []string{"role pgfence_app exists with REPLICATION, BYPASSRLS", "ALTER ROLE pgfence_app NOREPLICATION NOBYPASSRLS;"}, false},
		{"pgfence_operator", `GRANT pg_read_all_data TO pgfence_operator`, `REVOKE pg_read_all_data FROM pgfence_operator`, []string{"role pgfence_operator is a member of role pg_read_all_data", "REVOKE pg_read_all_data FROM pgfence_operator;"}, true},
	} {
		t.Run(c.grant, func(t *testing.T) {
			mustExecPool(t, admin.Pool, c.grant)
			defer mustExecPool(t, admin.Pool, c.revoke)
			db := cluster.NewDatabase(t)
			if _, err := db.Pool.Exec(context.Background(), `DROP SCHEMA pgfence CASCADE`); err != nil {
				t.Fatal(err)
			}
			refused(t, db, script, c.psql, c.want...)
		})
	}
	// And a plain group passes.
	db := cluster.NewDatabase(t)
	if _, err := newMigrator(t, db.Pool).Up(context.Background()); err != nil {
		t.Fatalf("Up with plain roles: %v", err)
	}
}

// Audit runs the trust check for a role other than the session's: on a
// clean installation it finds nothing for the role that installed it, and
// names the schema's owner for any other role, as the migrator would
// refuse it; kinds follow the check's ranks.
func TestAudit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	var owner string
	if err := db.Pool.QueryRow(ctx, `SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'pgfence'`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if f, err := migrations.Audit(ctx, db.Pool, owner); err != nil || len(f) != 0 {
		t.Fatalf("Audit(%s) of a clean installation: %+v, %v; want nothing", owner, f, err)
	}
	other := otherRole(t, db)
	mustExecPool(t, db.Pool, `CREATE SEQUENCE pgfence.s; ALTER SEQUENCE pgfence.s OWNER TO `+other)
	f, err := migrations.Audit(ctx, db.Pool, owner)
	if err != nil || len(f) != 1 || f[0].Kind != "object owner" || f[0].Object != "sequence pgfence.s" {
		t.Fatalf("Audit(%s) with a sequence %s owns: %+v, %v", owner, other, f, err)
	}
	f, err = migrations.Audit(ctx, db.Pool, other)
	if err != nil || len(f) == 0 || f[0].Kind != "schema owner" || !strings.Contains(f[0].Problem, "is owned by role "+owner) {
		t.Fatalf("Audit(%s): %+v, %v; want the schema's owner first", other, f, err)
	}
}
