package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

// envWorkerURL makes the test binary a migrating worker process (see
// TestConcurrentProcesses).
const envWorkerURL = "PGFENCE_MIGRATE_WORKER_URL"

func TestMain(m *testing.M) {
	if url := os.Getenv(envWorkerURL); url != "" {
		os.Exit(migrateWorker(url))
	}
	container.Main(m)
}

func migrateWorker(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	m, err := migrations.New(pool, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// blankDatabase returns a fresh database without any pgfence object.
func blankDatabase(t *testing.T) *pgfencetest.Database {
	t.Helper()
	db := pgfencetest.NewDatabase(t)
	if _, err := db.Pool.Exec(context.Background(), `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	return db
}

func newMigrator(t *testing.T, pool *pgxpool.Pool) *migrations.Migrator {
	t.Helper()
	m, err := migrations.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// pgfenceObjects lists the tables and functions in schema pgfence, goose's
// version table and the migration lock's table aside.
func pgfenceObjects(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT 'table ' || c.relname FROM pg_class c
		WHERE c.relnamespace = 'pgfence'::regnamespace AND c.relkind = 'r' AND c.relname NOT IN ('goose_db_version', 'migration_lock')
		UNION ALL
		SELECT 'function ' || p.proname FROM pg_proc p WHERE p.pronamespace = 'pgfence'::regnamespace
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := blankDatabase(t)
	m := newMigrator(t, db.Pool)

	pending, err := pendingOf(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(pending)) == 0 || pending[len(pending)-1].Version != migrations.Latest() {
		t.Fatalf("fresh database: pending = %+v, want every migration up to %d", pending, migrations.Latest())
	}

	applied, err := m.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != len(pending) {
		t.Fatalf("Up applied %d migrations, want %d", len(applied), len(pending))
	}
	after := pgfenceObjects(t, db.Pool)
	for _, want := range []string{"table leases", "table lease_events", "table token_floor", "function next_token"} {
		if !contains(after, want) {
			t.Errorf("after Up: %s missing; have %v", want, after)
		}
	}
	status, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range status {
		if !s.Applied || s.AppliedAt.IsZero() {
			t.Errorf("after Up: migration %d not applied: %+v", s.Version, s)
		}
	}
	if again, err := m.Up(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second Up = %v, %v; want nothing to apply", again, err)
	}

	if _, err := m.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if left := pgfenceObjects(t, db.Pool); len(left) != 0 {
		t.Fatalf("after DownTo(0) these remain: %v", left)
	}
	current, _, err := m.Version(ctx)
	if err != nil || current != 0 {
		t.Fatalf("Version after DownTo(0) = %d, %v; want 0", current, err)
	}

	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if again := pgfenceObjects(t, db.Pool); strings.Join(again, ",") != strings.Join(after, ",") {
		t.Fatalf("up-down-up changed the schema:\nfirst  %v\nsecond %v", after, again)
	}
}

func TestConcurrentProcesses(t *testing.T) {
	t.Parallel()
	db := blankDatabase(t)
	const n = 4
	cmds := make([]*exec.Cmd, n)
	outs := make([]*strings.Builder, n)
	for i := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envWorkerURL+"="+db.URL)
		outs[i] = &strings.Builder{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("worker %d: %v: %s", i, err, outs[i])
		}
	}
	m := newMigrator(t, db.Pool)
	current, latest, err := m.Version(context.Background())
	if err != nil || current != latest {
		t.Fatalf("after 4 concurrent migrations: version %d of %d, %v", current, latest, err)
	}
	var rows int
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgfence.goose_db_version WHERE version_id > 0`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	status, err := m.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rows != len(status) { // versions need not be contiguous (00002 may land after 00003)
		t.Fatalf("version table has %d applied rows, want %d (each migration once)", rows, len(status))
	}
}

// The host application's own goose migrations use goose's default table and
// lock; ours must neither touch them nor wait for them.
func TestHostGooseUntouched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := blankDatabase(t)
	hostFS := fstest.MapFS{
		"00001_orders.sql": {Data: []byte("-- +goose Up\nCREATE TABLE orders (id int PRIMARY KEY);\n-- +goose Down\nDROP TABLE orders;\n")},
		"00002_items.sql":  {Data: []byte("-- +goose Up\nCREATE TABLE items (id int PRIMARY KEY);\n-- +goose Down\nDROP TABLE items;\n")},
	}
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	host, err := goose.NewProvider(goose.DialectPostgres, sqlDB, hostFS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := host.Up(ctx); err != nil {
		t.Fatal(err)
	}
	before := hostVersions(t, sqlDB)

	m := newMigrator(t, db.Pool)
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if after := hostVersions(t, sqlDB); after != before {
		t.Fatalf("host goose table changed:\nbefore %s\nafter  %s", before, after)
	}
	if v, err := host.GetDBVersion(ctx); err != nil || v != 2 {
		t.Fatalf("host version = %d, %v; want 2", v, err)
	}

	// While our migrator runs, paused right after it took its lock, the
	// host's goose with goose's own session lock (an advisory lock) still
	// runs; then ours finishes.
	vs := migrations.Versions()
	if _, err := m.DownTo(ctx, vs[len(vs)-2]); err != nil {
		t.Fatal(err)
	}
	resume, done := pausedUp(t, ctx, db.Pool)
	sessionLocker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		t.Fatal(err)
	}
	locked, err := goose.NewProvider(goose.DialectPostgres, sqlDB, hostFS, goose.WithDisableGlobalRegistry(true),
		goose.WithSessionLocker(sessionLocker))
	if err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, herr := locked.DownTo(hctx, 1)
	resume()
	if herr != nil {
		t.Fatalf("host migration blocked or failed while pgfence's migrator held its lock: %v", herr)
	}
	if err := <-done; err != nil {
		t.Fatalf("our Up after the host's migration: %v", err)
	}
	if v, err := locked.GetDBVersion(ctx); err != nil || v != 1 {
		t.Fatalf("host version = %d, %v; want 1", v, err)
	}
}

// pendingOf reports the migrations m's database has not applied.
func pendingOf(ctx context.Context, m *migrations.Migrator) ([]migrations.Status, error) {
	ss, err := m.Status(ctx)
	var out []migrations.Status
	for _, s := range ss {
		if !s.Applied {
			out = append(out, s)
		}
	}
	return out, err
}

func hostVersions(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT version_id, is_applied FROM public.goose_db_version ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var v int64
		var applied bool
		if err := rows.Scan(&v, &applied); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%d:%v ", v, applied)
	}
	return b.String()
}

// A schema that records a migration this build does not know, from a newer
// build or from one before the first release (versions 5 to 17), is refused
// by every call and by a script, and nothing in it changes.
func TestUnknownSchemaVersionRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		versions string // the versions recorded besides 0
		want     string
	}{
		{"newer build", fmt.Sprint(migrations.Latest() + 100), "upgrade pgfence"},
		{"before the first release", "1, 2, 3, 4, 12", "DROP SCHEMA pgfence CASCADE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := blankDatabase(t).Pool
			// The version table as goose creates it, recording the versions.
			if _, err := pool.Exec(ctx, `CREATE SCHEMA pgfence;
				CREATE TABLE pgfence.goose_db_version (id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
				    version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp NOT NULL DEFAULT now());
				INSERT INTO pgfence.goose_db_version (version_id, is_applied)
				SELECT v, true FROM unnest('{0, `+tc.versions+`}'::bigint[]) v`); err != nil {
				t.Fatal(err)
			}
			versionRows := func() (rows string) {
				t.Helper()
				if err := pool.QueryRow(ctx, `SELECT string_agg(version_id::text, ',' ORDER BY id) FROM pgfence.goose_db_version`).Scan(&rows); err != nil {
					t.Fatal(err)
				}
				return rows
			}
			before := versionRows()
			refused := func(call string, err error) {
				t.Helper()
				if !errors.Is(err, migrations.ErrSchemaTooNew) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: %v, want ErrSchemaTooNew saying %q", call, err, tc.want)
				}
			}
			m := newMigrator(t, pool)
			_, err := m.Up(ctx)
			refused("Up", err)
			_, err = m.Status(ctx)
			refused("Status", err)
			_, _, err = m.Version(ctx)
			refused("Version", err)
			_, err = m.DownTo(ctx, 0)
			refused("DownTo", err)
			script, err := migrations.Script(0, migrations.Latest())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, script); err == nil || !strings.Contains(err.Error(), "this script starts from version 0") {
				t.Errorf("script from 0: %v, want a refusal", err)
			}
			if after := versionRows(); after != before {
				t.Errorf("a refused call changed the version table: %s, was %s", after, before)
			}
		})
	}
}

func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	// A port that refuses, and a listener that accepts but never answers.
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := refused.Addr().String()
	refused.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()

	for name, addr := range map[string]string{"refused": refusedAddr, "silent": silent.Addr().String()} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			pool, err := pgxpool.New(ctx, "postgres://u@"+addr+"/db?sslmode=disable")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			m := newMigrator(t, pool)
			start := time.Now()
			_, err = m.Up(ctx)
			if err == nil {
				t.Fatal("Up against an unreachable server succeeded")
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Up returned after %s, long past the 2s deadline", took)
			}
			if !strings.Contains(err.Error(), addr) {
				t.Errorf("error does not name %s: %v", addr, err)
			}
		})
	}
}

func TestSQLExport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	up, err := migrations.Script(0, migrations.Latest())
	if err != nil {
		t.Fatal(err)
	}
	down, err := migrations.Script(migrations.Latest(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(up, "+goose") || strings.Contains(down, "+goose") {
		t.Fatal("exported SQL still has goose annotations")
	}
	if _, err := migrations.Script(0, 12); err == nil || !strings.Contains(err.Error(), "not a pgfence migration") {
		t.Fatalf("Script(0, 12) = %v, want an unknown version refused", err)
	}
	// The exported SQL installs the same schema as the migrator, and removes it.
	plain := blankDatabase(t)
	if _, err := plain.Pool.Exec(ctx, up); err != nil {
		t.Fatalf("apply exported up SQL: %v", err)
	}
	viaGoose := pgfencetest.NewPool(t)
	if a, b := pgfenceObjects(t, plain.Pool), pgfenceObjects(t, viaGoose); strings.Join(a, ",") != strings.Join(b, ",") {
		t.Fatalf("exported SQL and migrator disagree:\nsql   %v\ngoose %v", a, b)
	}
	// The script records its versions in goose's table, as the migrator does.
	m := newMigrator(t, plain.Pool)
	if current, latest, err := m.Version(ctx); err != nil || current != latest {
		t.Fatalf("Version after the exported up SQL = %d of %d, %v", current, latest, err)
	}
	if rs, err := m.Up(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("Up after the exported up SQL = %v, %v; want nothing to apply", rs, err)
	}
	if pending, err := pendingOf(ctx, m); err != nil || len(pending) != 0 {
		t.Fatalf("Pending after the exported up SQL = %v, %v", pending, err)
	}
	if _, err := plain.Pool.Exec(ctx, down); err != nil {
		t.Fatalf("apply exported down SQL: %v", err)
	}
	if left := pgfenceObjects(t, plain.Pool); len(left) != 0 {
		t.Fatalf("after exported down SQL these remain: %v", left)
	}
	if current, _, err := m.Version(ctx); err != nil || current != 0 {
		t.Fatalf("Version after the exported down SQL = %d, %v", current, err)
	}
	if rs, err := m.Up(ctx); err != nil || len(rs) != len(migrations.Versions()) {
		t.Fatalf("Up after the exported down SQL applied %d, %v", len(rs), err)
	}
	if _, err := migrations.Script(0, migrations.Latest()+1); err == nil {
		t.Fatal("Script to an unknown version succeeded")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
