package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "github.com/lib/pq"              // the "postgres" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgfence/pgfence/migrations"
)

func openSQL(t *testing.T, driverName, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// A Migrator on a *sql.DB of either driver installs, reports, rolls back and
// reinstalls the schema, checks trust as on pgx, and leaves the *sql.DB
// open.
func TestNewDB(t *testing.T) {
	for _, driverName := range []string{"pgx", "postgres"} {
		t.Run(driverName, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			db := blankDatabase(t)
			sdb := openSQL(t, driverName, db.URL)
			m, err := migrations.NewDB(sdb, nil)
			if err != nil {
				t.Fatal(err)
			}
			applied, err := m.Up(ctx)
			if err != nil || len(applied) == 0 {
				t.Fatalf("Up: %v, %v", applied, err)
			}
			if current, latest, err := m.Version(ctx); err != nil || current != latest {
				t.Fatalf("Version: %d of %d, %v", current, latest, err)
			}
			status, err := m.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range status {
				if !s.Applied || s.AppliedAt.IsZero() {
					t.Errorf("status %+v after Up", s)
				}
			}
			if _, err := m.DownTo(ctx, 0); err != nil {
				t.Fatal(err)
			}
			if objs := pgfenceObjects(t, db.Pool); len(objs) != 0 {
				t.Fatalf("objects left after DownTo(0): %v", objs)
			}
			if _, err := m.Up(ctx); err != nil {
				t.Fatal(err)
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			var max int64
			if err := sdb.QueryRowContext(ctx, `SELECT pgfence.max_token()`).Scan(&max); err != nil || max == 0 {
				t.Fatalf("the *sql.DB after Close: %d, %v", max, err)
			}

			// The trust check reads the session's search_path through this
			// driver too.
			pinned := openSQL(t, driverName, db.URL+"&search_path=public,pg_catalog")
			m2, err := migrations.NewDB(pinned, nil)
			if err != nil {
				t.Fatal(err)
			}
			var ue *migrations.UntrustedError
			if _, err := m2.Up(ctx); !errors.As(err, &ue) || ue.Findings[0].Object != "search_path" {
				t.Fatalf("Up under search_path = public, pg_catalog: %v, want a search_path finding", err)
			}
		})
	}
}

// The migration lock's heartbeat needs a second connection.
func TestNewDBNeedsTwoConnections(t *testing.T) {
	sdb, err := sql.Open("postgres", "postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	sdb.SetMaxOpenConns(1)
	if _, err := migrations.NewDB(sdb, nil); err == nil || !strings.Contains(err.Error(), "needs 2") {
		t.Fatalf("NewDB with one connection: %v", err)
	}
	if _, err := migrations.NewDB(nil, nil); err == nil {
		t.Fatal("NewDB(nil) succeeded")
	}
}

// The path the package documents for a team that runs its own goose
// migrations on the same *sql.DB (lib/pq here): pgfence's Migrator first,
// then the team's provider (goose's default table, goose's advisory session
// lock), whose migrations may use pgfence (protect a table). Each records
// its versions in its own table; running both again changes nothing; each
// rolls back only its own.
func TestGooseNextToOurs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := blankDatabase(t)
	sdb := openSQL(t, "postgres", db.URL)
	teamFS := fstest.MapFS{
		"00001_stock.sql": {Data: []byte("-- +goose Up\nCREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL);\n-- +goose Down\nDROP TABLE stock;\n")},
		"00002_protect_stock.sql": {Data: []byte("-- +goose Up\nSELECT pgfence.protect('stock', 'sku', 'stock:');\n" +
			"-- +goose Down\nSELECT pgfence.unprotect('stock');\n")},
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		t.Fatal(err)
	}
	team, err := goose.NewProvider(goose.DialectPostgres, sdb, teamFS, goose.WithDisableGlobalRegistry(true), goose.WithSessionLocker(locker))
	if err != nil {
		t.Fatal(err)
	}
	ours, err := migrations.NewDB(sdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ours.Close()
	for round := range 2 {
		if _, err := ours.Up(ctx); err != nil {
			t.Fatalf("round %d: pgfence Up: %v", round, err)
		}
		if _, err := team.Up(ctx); err != nil {
			t.Fatalf("round %d: the team's goose Up: %v", round, err)
		}
	}
	if v, err := team.GetDBVersion(ctx); err != nil || v != 2 {
		t.Fatalf("the team's version: %d, %v; want 2", v, err)
	}
	if current, latest, err := ours.Version(ctx); err != nil || current != latest {
		t.Fatalf("pgfence's version: %d of %d, %v", current, latest, err)
	}
	if got := hostVersions(t, sdb); got != "0:true 1:true 2:true " {
		t.Fatalf("the team's goose_db_version: %s (pgfence's versions must not appear there)", got)
	}
	var protected int
	if err := sdb.QueryRowContext(ctx, `SELECT count(*) FROM pgfence.protected_tables() WHERE relation = 'stock'::regclass`).Scan(&protected); err != nil || protected != 1 {
		t.Fatalf("stock protected by the team's migration: %d, %v", protected, err)
	}
	if _, err := team.DownTo(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if current, latest, err := ours.Version(ctx); err != nil || current != latest {
		t.Fatalf("pgfence's version after the team rolled back: %d of %d, %v", current, latest, err)
	}
}
