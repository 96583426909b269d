package pgfencetest_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// With no URL, Start starts a throwaway cluster, says so, installs the schema,
// and Close removes every trace of it.
func TestStartThrowaway(t *testing.T) {
	if _, err := pgcluster.FindBinaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	db, err := pgfencetest.Start(ctx, &pgfencetest.StartOptions{Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if !db.Throwaway() {
		t.Fatal("no URL given, but the database is not embedded")
	}
	if !strings.Contains(progress.String(), "throwaway local PostgreSQL") || !strings.Contains(progress.String(), "ready on 127.0.0.1:") {
		t.Fatalf("progress does not say what happens:\n%s", progress.String())
	}
	var version int64
	if err := db.Pool.QueryRow(ctx, `SELECT max(version_id) FROM pgfence.goose_db_version`).Scan(&version); err != nil || version != migrations.Latest() {
		t.Fatalf("schema version %d (%v), want %d", version, err, migrations.Latest())
	}
	var dataDir string
	if err := db.Pool.QueryRow(ctx, `SHOW data_directory`).Scan(&dataDir); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("cluster directory %s left behind: %v", dataDir, err)
	}
}

// A given URL is used as is, migrated, and not dropped by Close.
func TestStartGivenURL(t *testing.T) {
	ctx := context.Background()
	target := pgfencetest.NewDatabase(t)
	if _, err := target.Pool.Exec(ctx, `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	db, err := pgfencetest.Start(ctx, &pgfencetest.StartOptions{URL: target.URL})
	if err != nil {
		t.Fatal(err)
	}
	if db.Throwaway() {
		t.Fatal("a URL was given, but a throwaway cluster started")
	}
	var n int
	if err := target.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases`).Scan(&n); err != nil {
		t.Fatalf("schema not installed on the given database: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := target.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases`).Scan(&n); err != nil {
		t.Fatalf("the given database is gone after Close: %v", err)
	}
	if _, err := pgfencetest.Start(ctx, &pgfencetest.StartOptions{URL: "postgres://u@[::1"}); err == nil || !strings.Contains(err.Error(), "invalid database URL") {
		t.Fatalf("bad URL: %v", err)
	}
}

// A connection string with a password that cannot be used (bad syntax, no
// server) gives an error that does not contain the password.
func TestStartErrorsHideThePassword(t *testing.T) {
	const pw = "s3cr3t-PW"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, url := range []string{
		"postgres://app:" + pw + "@127.0.0.1:1/orders?connect_timeout=2",
		"postgres://app:" + pw + "@127.0.0.1:notaport/orders",
		"host=127.0.0.1 port=1 user=app password=" + pw + " dbname=orders connect_timeout=2",
		"host=127.0.0.1 port=1 user=app password='" + pw + " x' dbname=orders connect_timeout=2",
		"host=127.0.0.1 port=notaport user=app password=" + pw,
	} {
		db, err := pgfencetest.Start(ctx, &pgfencetest.StartOptions{URL: url, Progress: &bytes.Buffer{}})
		if err == nil {
			db.Close()
			t.Fatalf("Start(%q) succeeded", url)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("Start: the password leaked: %v", err)
		}
	}
}

// runChild, when set, makes this test binary a program that calls Run.
const runChild = "PGFENCETEST_RUN_CHILD"

// Run opens the database, gives it to the program and closes it, and exits
// 1 with the program's name and error when it fails.
func TestRun(t *testing.T) {
	target := pgfencetest.NewDatabase(t)
	for _, mode := range []string{"ok", "fail"} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestRunChild$")
		cmd.Env = append(os.Environ(), runChild+"="+mode, "DATABASE_URL="+target.URL)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case mode == "ok" && err != nil:
			t.Fatalf("a program that succeeds: %v\n%s", err, out)
		case mode == "fail" && (!errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "child: it failed")):
			t.Fatalf("a program that fails: %v, want exit 1 and its error\n%s", err, out)
		}
	}
}

// TestRunChild is the program TestRun starts.
func TestRunChild(t *testing.T) {
	mode := os.Getenv(runChild)
	if mode == "" {
		t.Skip("run by TestRun")
	}
	pgfencetest.Run("child", func(ctx context.Context, db *pgfencetest.Database) error {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases`).Scan(&n); err != nil {
			return err
		}
		if mode == "fail" {
			return errors.New("it failed")
		}
		return nil
	})
}
