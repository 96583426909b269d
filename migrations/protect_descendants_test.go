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
// all of it. A generated resource column is refused: the guard runs before
// it is computed.
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
	if _, err := pgfence.Exec(ctx, pool, "base:x", 1, `INSERT INTO child VALUES ('x')`); err != nil {
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

	mustExecPool(t, pool, `CREATE TABLE gen (id int PRIMARY KEY, k text GENERATED ALWAYS AS ('r' || id) STORED)`)
	err := pgfence.Protect(ctx, pool, pgx.Identifier{"gen"}, "k", "")
	if pgerr.Code(err) != pgerr.CodeInvalid {
		t.Fatalf("protect on a generated column: %v, want PF008", err)
	}
}
