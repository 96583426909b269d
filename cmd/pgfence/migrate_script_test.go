package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// blankDB returns a fresh database without any pgfence object.
func blankDB(t *testing.T) *pgfencetest.Database {
	t.Helper()
	db := pgfencetest.NewDatabase(t)
	if _, err := db.Pool.Exec(context.Background(), `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	return db
}

// applyScript runs a `migrate sql` script the way psql --single-transaction
// does: every statement in one transaction (pgx's simple protocol runs a
// multi-statement string as one implicit transaction).
func applyScript(t *testing.T, pool *pgxpool.Pool, args ...string) error {
	t.Helper()
	code, script, errOut := cli(t, nil, append([]string{"migrate", "sql"}, args...)...)
	if code != exitOK {
		t.Fatalf("migrate sql %q: code %d\n%s", args, code, errOut)
	}
	_, err := pool.Exec(context.Background(), script)
	return err
}

func schemaVersion(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	m, err := migrations.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	current, _, err := m.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return current
}

// A schema installed with `pgfence migrate sql | psql` is one the migrator,
// `migrate status` and `doctor` recognise: the script records its versions in
// goose's table, so a later `migrate up` applies only newer migrations. It
// once recorded nothing: status said version 0, doctor "not installed", and
// `migrate up` failed on `relation "token_floor" already exists`.
func TestMigrateSQLScriptRecordsVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := blankDB(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	latest := migrations.Latest()

	if err := applyScript(t, db.Pool); err != nil {
		t.Fatalf("apply the up script: %v", err)
	}
	if v := schemaVersion(t, db.Pool); v != latest {
		t.Fatalf("after the up script: version %d, want %d", v, latest)
	}
	code, out, errOut := cli(t, environ, "migrate", "status", "--json")
	var st migrateStatusJSON
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.Version != latest {
		t.Fatalf("status after the up script: code %d\n%s%s", code, out, errOut)
	}
	for _, s := range st.Migrations {
		if !s.Applied || s.AppliedAt == nil {
			t.Errorf("status after the up script: %+v not applied", s)
		}
	}
	code, out, errOut = cli(t, environ, "migrate", "up")
	if code != exitOK || !strings.Contains(out, "no migrations to apply") || !strings.Contains(out, "schema at version "+itoa(latest)) {
		t.Fatalf("up after the up script: code %d\n%s%s", code, out, errOut)
	}
	if c := doctorCheck(t, environ, "schema"); c.Status != statusOK {
		t.Fatalf("doctor after the up script: %+v", c)
	}
	// goose's own table: a version-0 row, then one row per migration.
	var rows, zero int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE version_id = 0) FROM pgfence.goose_db_version WHERE is_applied`).Scan(&rows, &zero); err != nil {
		t.Fatal(err)
	}
	if want := len(migrations.Versions()) + 1; rows != want || zero != 1 {
		t.Fatalf("version table: %d applied rows (%d at version 0), want %d (1)", rows, zero, want)
	}

	// The same script on an installed schema stops at its check, changing nothing.
	if err := applyScript(t, db.Pool); err == nil || !strings.Contains(err.Error(), "the schema is at version "+itoa(latest)) {
		t.Fatalf("up script on an installed schema: %v, want a refusal", err)
	}

	// Down to 2 with the migrator, then an upgrade script from 2.
	m, err := migrations.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.DownTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := applyScript(t, db.Pool, "--to", "3"); err == nil || !strings.Contains(err.Error(), "the schema is at version 2") {
		t.Fatalf("a script from 0 on a schema at version 2: %v, want refused naming version 2", err)
	}
	if err := applyScript(t, db.Pool, "--from", "2"); err != nil {
		t.Fatalf("apply the script from 2: %v", err)
	}
	if v := schemaVersion(t, db.Pool); v != latest {
		t.Fatalf("after the script from 2: version %d, want %d", v, latest)
	}

	// The down script removes everything and its records; Up reinstalls.
	if err := applyScript(t, db.Pool, "--direction", "down", "--to", "1"); err != nil {
		t.Fatalf("apply the down script to 1: %v", err)
	}
	if v := schemaVersion(t, db.Pool); v != 1 {
		t.Fatalf("after the down script to 1: version %d", v)
	}
	if err := applyScript(t, db.Pool, "--direction", "down"); err == nil || !strings.Contains(err.Error(), "the schema is at version 1") {
		t.Fatalf("a down script from the latest version on a schema at version 1: %v, want refused naming version 1", err)
	}
	if err := applyScript(t, db.Pool, "--direction", "down", "--from", "1"); err != nil {
		t.Fatalf("apply the down script from 1: %v", err)
	}
	if v := schemaVersion(t, db.Pool); v != 0 {
		t.Fatalf("after the down script: version %d", v)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relnamespace = 'pgfence'::regnamespace AND relname NOT LIKE 'goose_db_version%' AND relname NOT LIKE 'migration_lock%'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("after the down script %d relations remain", left)
	}
	if rs, err := m.Up(ctx); err != nil || len(rs) != len(migrations.Versions()) {
		t.Fatalf("Up after the down script: %d applied, %v", len(rs), err)
	}
}

func TestMigrateSQLFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--from", "3", "--to", "1"},
		{"--direction", "down", "--from", "1", "--to", "3"},
		{"--to", itoa(migrations.Latest() + 1)},
		{"--from", "-2"},
	} {
		if code, _, errOut := cli(t, nil, append([]string{"migrate", "sql"}, args...)...); code != exitUsage || !strings.Contains(errOut, "hint:") {
			t.Errorf("migrate sql %q: code %d, want %d\n%s", args, code, exitUsage, errOut)
		}
	}
	code, out, _ := cli(t, nil, "migrate", "sql", "--from", "2")
	if code != exitOK || strings.Contains(out, "00002_") || !strings.Contains(out, "00003_") || strings.Contains(out, "CREATE TABLE IF NOT EXISTS pgfence.goose_db_version") {
		t.Fatalf("migrate sql --from 2: code %d\n%.500s", code, out)
	}
}

func doctorCheck(t *testing.T, environ map[string]string, name string) check {
	t.Helper()
	_, out, errOut := cli(t, environ, "doctor", "--json")
	var res struct{ Checks []check }
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("doctor --json: %v\n%s%s", err, out, errOut)
	}
	for _, c := range res.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("doctor reports no %q check:\n%s", name, out)
	return check{}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// The README's install path, with psql itself when it is installed.
func TestMigrateSQLWithPsql(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("psql not on PATH: under CI=true the README's install path must be tested (.ci/run installs the PostgreSQL client)")
		}
		t.Skip("psql not on PATH")
	}
	db := blankDB(t)
	code, script, _ := cli(t, nil, "migrate", "sql")
	if code != exitOK {
		t.Fatalf("migrate sql: code %d", code)
	}
	file := filepath.Join(t.TempDir(), "pgfence.sql")
	if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(psql, "--no-psqlrc", "--quiet", "--single-transaction", "-v", "ON_ERROR_STOP=1", "-f", file, db.URL).CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	if v := schemaVersion(t, db.Pool); v != migrations.Latest() {
		t.Fatalf("after psql: version %d, want %d", v, migrations.Latest())
	}
	out, err = exec.Command(psql, "--no-psqlrc", "--quiet", "--single-transaction", "-v", "ON_ERROR_STOP=1", "-f", file, db.URL).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "the schema is at version") || !strings.Contains(string(out), "there is nothing to run") {
		t.Fatalf("psql on an installed schema: %v\n%s", err, out)
	}
	// A script that starts elsewhere names the one to generate, with both
	// ends: without --to, a down script would go all the way to 0.
	latest := migrations.Latest()
	versions := migrations.Versions()
	prev := versions[len(versions)-2]
	for _, c := range []struct {
		direction string
		from, to  int64
		want      string
	}{
		{"up", prev, latest, "there is nothing to run"},
		{"up", 0, prev, fmt.Sprintf("--direction down --from %d --to %d", latest, prev)},
		{"down", prev, 1, fmt.Sprintf("--direction down --from %d --to 1", latest)},
	} {
		code, script, errOut := cli(t, nil, "migrate", "sql", "--direction", c.direction, "--from", fmt.Sprint(c.from), "--to", fmt.Sprint(c.to))
		if code != exitOK {
			t.Fatalf("migrate sql --from %d --to %d: code %d %s", c.from, c.to, code, errOut)
		}
		if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(psql, "--no-psqlrc", "--quiet", "--single-transaction", "-v", "ON_ERROR_STOP=1", "-f", file, db.URL).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Fatalf("psql with the script from %d to %d on a schema at %d: %v, want a hint with %q\n%s", c.from, c.to, latest, err, c.want, out)
		}
	}
}
