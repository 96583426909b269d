package pgfencetest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

// Two parallel tests write the same table name and never see each other.
func TestIsolatedDatabases(t *testing.T) {
	names := make(chan string, 2)
	for i := range 2 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgfencetest.NewDatabase(t)
			names <- db.Name
			if _, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Pool.Exec(ctx, `INSERT INTO orders VALUES ($1)`, i); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("orders has %d rows (%v), want only this test's 1", n, err)
			}
			var version int64
			if err := db.Pool.QueryRow(ctx, `SELECT max(version_id) FROM pgfence.goose_db_version`).Scan(&version); err != nil {
				t.Fatal(err)
			}
			if version != migrations.Latest() {
				t.Fatalf("database at version %d, want migrated to %d", version, migrations.Latest())
			}
		})
	}
	t.Cleanup(func() {
		close(names)
		a, b := <-names, <-names
		if a == b {
			t.Errorf("both tests got database %q", a)
		}
	})
}

// The database is dropped when its test ends.
func TestDatabaseDropped(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		name = pgfencetest.NewDatabase(t).Name
	})
	other := pgfencetest.NewPool(t)
	var exists bool
	if err := other.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %s still exists after its test ended", name)
	}
}

// A dedicated cluster survives fast and immediate restarts with its data, and
// crash recovery after SIGKILL.
func TestClusterControl(t *testing.T) {
	ctx := context.Background()
	c := pgfencetest.NewCluster(t, &pgfencetest.ClusterOptions{Settings: map[string]string{"application_name": "ctl"}})
	db := c.NewDatabase(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE kept (v int); INSERT INTO kept VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		conn, err := pgx.Connect(ctx, db.URL)
		if err != nil {
			t.Fatalf("connect after restart: %v", err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM kept`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, mode := range []string{"restart", "crash"} {
		addr := c.Addr()
		var err error
		if mode == "restart" {
			err = c.Restart(ctx)
		} else if err = c.Kill(); err == nil {
			err = c.Start(ctx)
		}
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if c.Addr() != addr {
			t.Fatalf("restart moved the server from %s to %s", addr, c.Addr())
		}
		if n := count(); n != 1 {
			t.Fatalf("after %v restart: %d rows, want 1", mode, n)
		}
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := pgx.Connect(sctx, db.URL); err == nil {
		t.Fatal("connected to a stopped server")
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatalf("start after SIGKILL: %v", err)
	}
	if n := count(); n != 1 {
		t.Fatalf("after crash recovery: %d rows, want 1", n)
	}
}

// BenchmarkNewDatabase measures what one test pays for a fresh, migrated
// database cloned from the template.
func BenchmarkNewDatabase(b *testing.B) {
	pgfencetest.NewPool(b) // template built outside the timed loop
	b.ResetTimer()
	for b.Loop() {
		db, err := pgfencetest.Open()
		if err != nil {
			b.Fatal(err)
		}
		if err := db.Pool.Ping(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
