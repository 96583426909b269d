package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/demo"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) {
	// The demo starts its worker A as `<own executable> demo-worker`: in tests
	// that is this test binary.
	if len(os.Args) > 1 && os.Args[1] == demo.WorkerCommand {
		os.Exit(run(context.Background(), os.Args[1:], &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}))
	}
	container.Main(m)
}

// cli runs one command line in-process and returns exit code, stdout, stderr.
func cli(t *testing.T, environ map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	e := &env{stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return environ[k] }}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := run(ctx, args, e)
	return code, stdout.String(), stderr.String()
}

func TestMigrateLifecycle(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	if _, err := db.Pool.Exec(context.Background(), `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	environ := map[string]string{"DATABASE_URL": db.URL}

	code, out, errOut := cli(t, environ, "migrate", "status")
	if code != exitOK || !strings.Contains(out, "pending") || !strings.Contains(out, "schema version 0 of") {
		t.Fatalf("status on a blank database: code %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, environ, "migrate", "up")
	if code != exitOK || !strings.Contains(out, "up   00001_schema") {
		t.Fatalf("up: code %d\n%s%s", code, out, errOut)
	}
	code, out, _ = cli(t, environ, "migrate", "up")
	if code != exitOK || !strings.Contains(out, "no migrations to apply") {
		t.Fatalf("second up: code %d\n%s", code, out)
	}
	code, out, _ = cli(t, environ, "migrate", "status", "--json")
	var st migrateStatusJSON
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.Version != st.Latest || st.Version != migrations.Latest() {
		t.Fatalf("status --json: code %d, %+v\n%s", code, st, out)
	}
	code, out, errOut = cli(t, environ, "migrate", "down", "--to", "0")
	if code != exitOK || !strings.Contains(out, "schema at version 0") {
		t.Fatalf("down --to 0: code %d\n%s%s", code, out, errOut)
	}
	code, out, _ = cli(t, environ, "migrate", "down")
	if code != exitOK || !strings.Contains(out, "nothing to roll back") {
		t.Fatalf("down on an empty schema: code %d\n%s", code, out)
	}
}

func TestMigrateSQL(t *testing.T) {
	t.Parallel()
	code, out, _ := cli(t, nil, "migrate", "sql")
	if code != exitOK || !strings.Contains(out, "CREATE TABLE pgfence.leases") || strings.Contains(out, "+goose") {
		t.Fatalf("migrate sql: code %d\n%.300s", code, out)
	}
	code, out, _ = cli(t, nil, "migrate", "sql", "--direction", "down")
	if code != exitOK || !strings.Contains(out, "DROP TABLE pgfence.leases") {
		t.Fatalf("migrate sql --direction down: code %d\n%.300s", code, out)
	}
	if code, _, errOut := cli(t, nil, "migrate", "sql", "--direction", "sideways"); code != exitUsage || !strings.Contains(errOut, "hint:") {
		t.Fatalf("bad direction: code %d, %s", code, errOut)
	}
}

func TestMigrateErrors(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := l.Addr().String()
	l.Close()

	newer := pgfencetest.NewDatabase(t)
	if _, err := newer.Pool.Exec(context.Background(),
		`INSERT INTO pgfence.goose_db_version (version_id, is_applied) VALUES ($1, true)`, migrations.Latest()+100); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name     string
		args     []string
		environ  map[string]string
		wantCode int
		wantMsg  string
	}{
		{"no database", []string{"migrate", "up"}, nil, exitUsage, "no database"},
		{"bad url", []string{"migrate", "up", "--database-url", "postgres://u:secret@[::1"}, nil, exitUsage, "invalid database URL"},
		{"unreachable", []string{"migrate", "up", "--database-url", "postgres://u:secret@" + closedAddr + "/db", "--connect-timeout", "2s"}, nil, exitUnavailable, closedAddr},
		{"schema newer", []string{"migrate", "up"}, map[string]string{"DATABASE_URL": newer.URL}, exitSchema, "does not know: database is at version"},
		{"unknown subcommand", []string{"migrate", "sideways"}, nil, exitUsage, "unknown subcommand"},
		{"unknown command", []string{"frobnicate"}, nil, exitUsage, "unknown command"},
		{"bad flag", []string{"migrate", "up", "--nope"}, nil, exitUsage, "flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := cli(t, tc.environ, tc.args...)
			if code != tc.wantCode || !strings.Contains(errOut, tc.wantMsg) {
				t.Fatalf("code %d (want %d), stderr:\n%s(want it to contain %q)", code, tc.wantCode, errOut, tc.wantMsg)
			}
			if strings.Contains(errOut, "secret") {
				t.Fatalf("error output leaks the password: %s", errOut)
			}
			if !strings.Contains(errOut, "hint:") && tc.wantCode != exitUsage {
				t.Fatalf("no hint in: %s", errOut)
			}
		})
	}
}

// A failed `migrate up` says why in one line with a hint, and never first
// that there was nothing to do (it printed "no migrations to apply", or [],
// before looking at the error).
func TestMigrateUpFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	// pgfence objects the version table does not record.
	if _, err := db.Pool.Exec(ctx, `DROP TABLE pgfence.goose_db_version`); err != nil {
		t.Fatal(err)
	}
	environ := map[string]string{"DATABASE_URL": db.URL}
	for _, args := range [][]string{{"migrate", "up"}, {"migrate", "up", "--json"}} {
		code, out, errOut := cli(t, environ, args...)
		if code != exitFailure || out != "" {
			t.Errorf("%q: code %d, stdout %q; want %d and nothing on stdout", args, code, out, exitFailure)
		}
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], "00001_schema") || !strings.Contains(lines[0], "already exists") ||
			strings.Contains(lines[0], "CREATE TABLE") || !strings.HasPrefix(lines[1], "hint: ") {
			t.Errorf("%q: stderr, want the migration and the server's message in one line, then a hint:\n%s", args, errOut)
		}
	}
}

// `migrate down` reports the version the schema is at afterwards, and --to
// above it is a usage error: it once printed "schema at version 999".
func TestMigrateDownTo(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	latest := migrations.Latest()

	code, out, errOut := cli(t, environ, "migrate", "down", "--to", "999")
	if code != exitUsage || strings.Contains(out, "schema at version") || !strings.Contains(errOut, "above the schema's version "+itoa(latest)) {
		t.Fatalf("down --to 999: code %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, environ, "migrate", "down", "--to", itoa(latest))
	if code != exitOK || !strings.Contains(out, "nothing to roll back") || strings.Contains(out, "no migrations to apply") ||
		!strings.Contains(out, "schema at version "+itoa(latest)) {
		t.Fatalf("down --to %d: code %d\n%s%s", latest, code, out, errOut)
	}
	versions := migrations.Versions()
	previous := versions[len(versions)-2]
	code, out, errOut = cli(t, environ, "migrate", "down")
	if code != exitOK || !strings.Contains(out, "schema at version "+itoa(previous)) {
		t.Fatalf("down: code %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, environ, "migrate", "down", "--to", "1", "--json")
	var rs migrateJSON
	if code != exitOK || json.Unmarshal([]byte(out), &rs) != nil || len(rs.Migrations) != len(versions)-2 || rs.Version == nil || *rs.Version != 1 {
		t.Fatalf("down --to 1 --json: code %d\n%s%s", code, out, errOut)
	}
}

// Commands that read, and rollbacks with nothing to undo, create nothing on
// a database without pgfence: goose created its version table (and so the
// schema pgfence) on every call.
func TestMigrateReadOnlyCreatesNothing(t *testing.T) {
	t.Parallel()
	db := blankDB(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	for _, args := range [][]string{
		{"migrate", "status"},
		{"migrate", "status", "--json"},
		{"doctor"},
		{"migrate", "down"},
		{"migrate", "down", "--to", "0"},
	} {
		code, out, errOut := cli(t, environ, args...)
		wantCode := exitOK
		if args[0] == "doctor" {
			wantCode = exitFailure
		}
		if code != wantCode {
			t.Errorf("%q: code %d, want %d\n%s%s", args, code, wantCode, out, errOut)
		}
		var exists bool
		if err := db.Pool.QueryRow(context.Background(), `SELECT to_regnamespace('pgfence') IS NOT NULL`).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists {
			t.Fatalf("%q created the schema pgfence:\n%s", args, out)
		}
	}
	if c := doctorCheck(t, environ, "schema"); c.Status != statusFail || !strings.Contains(c.Detail, "not installed") {
		t.Fatalf("doctor's schema check on a blank database: %+v", c)
	}
}

// A run whose migration lock was taken over is finished by running the same
// direction again: after a rollback, migrate up would re-apply what it was
// removing.
func TestMigrateLockLostHint(t *testing.T) {
	lost := fmt.Errorf("migrations: down: %w", migrations.ErrLockLost)
	for _, c := range []struct {
		err  error
		want string
	}{
		{migrateError(lost), "run `pgfence migrate up` again"},
		{migrateDownError(lost, 7), "run `pgfence migrate down --to 7` again"},
	} {
		var ce *cliError
		if !errors.As(c.err, &ce) || ce.code != exitFailure || !strings.Contains(ce.hint, c.want) || !errors.Is(c.err, migrations.ErrLockLost) {
			t.Errorf("lock lost: %+v, want exit 1 with hint %q", c.err, c.want)
		}
	}
}
