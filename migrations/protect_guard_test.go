package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// protect() guards every table below the one it is given: TRUNCATE of a
// partition, and writes to an inheritance child (directly or through the
// parent), are refused like writes to the table itself; unprotect() lifts
// all of it.
func TestProtectDescendants(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	pool := db.Pool
	for _, q := range []string{
		`CREATE TABLE parts (k text PRIMARY KEY) PARTITION BY LIST (k)`,
		`CREATE TABLE parts_a PARTITION OF parts FOR VALUES IN ('a')`,
		`CREATE TABLE parts_b PARTITION OF parts FOR VALUES IN ('b', 'c') PARTITION BY LIST (k)`,
		`CREATE TABLE parts_b1 PARTITION OF parts_b FOR VALUES IN ('b')`,
		`CREATE TABLE base (k text PRIMARY KEY)`,
		`CREATE TABLE child () INHERITS (base)`,
		`CREATE TABLE grandchild () INHERITS (child)`,
	} {
		mustExecPool(t, pool, q)
	}
	for _, table := range []string{"parts", "base"} {
		if err := pgfence.Protect(ctx, pool, pgx.Identifier{table}, "k", table+":"); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what, q string) {
		t.Helper()
		if _, err := pool.Exec(ctx, q); pgerr.Code(err) != "PF006" {
			t.Errorf("%s: %v, want PF006", what, err)
		}
	}
	for _, table := range []string{"parts", "parts_a", "parts_b", "parts_b1", "base", "child", "grandchild"} {
		refused("TRUNCATE "+table, `TRUNCATE `+table)
	}
	refused("insert into a partition", `INSERT INTO parts_b1 VALUES ('b')`)
	refused("insert into a child", `INSERT INTO child VALUES ('x')`)
	refused("insert into a grandchild", `INSERT INTO grandchild VALUES ('y')`)
	// A fenced write through the child is accepted.
	pgfencetest.IssueToken(t, pool, "base:x", 1)
	if _, err := pgfence.ExecToken(ctx, pool, "base:x", 1, `INSERT INTO child VALUES ('x')`); err != nil {
		t.Fatalf("fenced insert into a child: %v", err)
	}
	refused("update of a child's row through the parent", `UPDATE base SET k = 'z' WHERE k = 'x'`)
	refused("delete of a child's row through the parent", `DELETE FROM base WHERE k = 'x'`)

	for _, table := range []string{"parts", "base"} {
		if _, err := pgfence.Unprotect(ctx, pool, pgx.Identifier{table}); err != nil {
			t.Fatal(err)
		}
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgfence_guard%'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d pgfence triggers left after unprotect (%v), want 0", left, err)
	}
	mustExecPool(t, pool, `TRUNCATE parts_a`)
	mustExecPool(t, pool, `INSERT INTO grandchild VALUES ('y')`)

}

// The row guard checks the row as stored, after every BEFORE trigger and
// generated column: a table's own BEFORE trigger (named to run after a
// BEFORE guard) cannot move a fenced row to a resource the transaction never
// fenced, and a generated resource column is fenced like any other (a
// BEFORE guard saw NULL in it and refused every write).
func TestProtectChecksTheStoredRow(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgfencetest.NewPool(t)
	for _, q := range []string{
		`CREATE TABLE jobs (k text PRIMARY KEY, v text)`,
		`CREATE FUNCTION lower_k() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN NEW.k := lower(NEW.k); RETURN NEW; END'`,
		`CREATE TRIGGER set_key BEFORE INSERT OR UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION lower_k()`,
		`CREATE TABLE gen (id int PRIMARY KEY, k text GENERATED ALWAYS AS ('r' || id) STORED)`,
	} {
		mustExecPool(t, pool, q)
	}
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"jobs"}, "k", "jobs:"); err != nil {
		t.Fatal(err)
	}
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"gen"}, "k", "gen:"); err != nil {
		t.Fatal(err)
	}
	// The leases of the resources issued the tokens presented below.
	for _, r := range []string{"jobs:B", "jobs:b", "gen:r1"} {
		pgfencetest.IssueToken(t, pool, r, 5)
	}
	if _, err := pgfence.ExecToken(ctx, pool, "jobs:B", 5, `INSERT INTO jobs VALUES ('B', 'x')`); pgerr.Code(err) != "PF006" {
		t.Fatalf("fenced for jobs:B, stored as jobs:b: %v, want PF006", err)
	}
	if _, err := pgfence.ExecToken(ctx, pool, "jobs:b", 5, `INSERT INTO jobs VALUES ('B', 'x')`); err != nil {
		t.Fatalf("fenced for the resource the row is stored under: %v", err)
	}
	if _, err := pgfence.ExecToken(ctx, pool, "gen:r1", 1, `INSERT INTO gen (id) VALUES (1)`); err != nil {
		t.Fatalf("fenced insert, generated resource column: %v", err)
	}
	if _, err := pgfence.ExecToken(ctx, pool, "gen:r1", 2, `INSERT INTO gen (id) VALUES (2)`); pgerr.Code(err) != "PF006" {
		t.Fatalf("insert of gen:r2 fenced for gen:r1: %v, want PF006", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM gen)`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d rows stored (%v), want the two fenced ones", n, err)
	}
}
