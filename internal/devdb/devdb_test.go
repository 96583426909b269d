package devdb_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/devdb"
	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestMain(m *testing.M) { pgfencetest.Main(m) }

// With no URL, Open starts a throwaway cluster, says so, installs the schema,
// and Close removes every trace of it.
func TestEmbedded(t *testing.T) {
	if _, err := pgcluster.FindBinaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	db, err := devdb.Open(ctx, "", &devdb.Options{Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if !db.Embedded || db.Cluster() == nil {
		t.Fatal("no URL given, but the database is not embedded")
	}
	if !strings.Contains(progress.String(), "throwaway local PostgreSQL") || !strings.Contains(progress.String(), "ready on 127.0.0.1:") {
		t.Fatalf("progress does not say what happens:\n%s", progress.String())
	}
	var version int64
	if err := db.Pool.QueryRow(ctx, `SELECT max(version_id) FROM pgfence.goose_db_version`).Scan(&version); err != nil || version != migrations.Latest() {
		t.Fatalf("schema version %d (%v), want %d", version, err, migrations.Latest())
	}
	root := db.Cluster().Root()
	db.Close()
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("cluster directory %s left behind: %v", root, err)
	}
}

// A given URL is used as is, and migrated.
func TestGivenURL(t *testing.T) {
	ctx := context.Background()
	target := pgfencetest.NewDatabase(t)
	if _, err := target.Pool.Exec(ctx, `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	db, err := devdb.Open(ctx, target.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.Embedded {
		t.Fatal("a URL was given, but an embedded cluster started")
	}
	var n int
	if err := target.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases`).Scan(&n); err != nil {
		t.Fatalf("schema not installed on the given database: %v", err)
	}
	if _, err := devdb.Open(ctx, "postgres://u@[::1", nil); err == nil || !strings.Contains(err.Error(), "invalid database URL") {
		t.Fatalf("bad URL: %v", err)
	}
}

// A connection string with a password that cannot be used (bad syntax, no
// server) gives an error that does not contain the password.
func TestOpenErrorsHideThePassword(t *testing.T) {
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
		db, err := devdb.Open(ctx, url, &devdb.Options{Progress: &bytes.Buffer{}})
		if err == nil {
			db.Close()
			t.Fatalf("Open(%q) succeeded", url)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("Open: the password leaked: %v", err)
		}
	}
}
