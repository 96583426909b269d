package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/migrations"
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
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("base:x", "", 1), `INSERT INTO child VALUES ('x')`); err != nil {
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

// Tables that come below a protected table after protect() are guarded when
// they come: a partition created or attached (with the rows it holds), an
// inheritance child created or added. TRUNCATE of each, and every unfenced
// write, is refused; a fenced write is accepted. A role that owns the table
// but may not protect has its new partition refused. Without the event trigger
// (a migration not run as a superuser), a new partition refuses every write,
// fenced or not, until the table is protected again.
func TestProtectTablesAddedLater(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	pool := db.Pool
	for _, q := range []string{
		`CREATE TABLE orders (region text, id int, PRIMARY KEY (region, id)) PARTITION BY LIST (region)`,
		`CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu')`,
		`CREATE TABLE base (k text PRIMARY KEY)`,
	} {
		mustExecPool(t, pool, q)
	}
	for table, column := range map[string]string{"orders": "region", "base": "k"} {
		if err := pgfence.Protect(ctx, pool, pgx.Identifier{table}, column, table+":"); err != nil {
			t.Fatal(err)
		}
	}
	code := func(q string) string {
		t.Helper()
		_, err := pool.Exec(ctx, q)
		return pgerr.Code(err)
	}
	guarded := func(table, row, resource string) {
		t.Helper()
		if c := code(`TRUNCATE ` + table); c != "PF006" {
			t.Errorf("TRUNCATE %s: SQLSTATE %q, want PF006", table, c)
		}
		if c := code(`INSERT INTO ` + table + ` VALUES ` + row); c != "PF006" {
			t.Errorf("unfenced INSERT INTO %s: SQLSTATE %q, want PF006", table, c)
		}
		if c := code(`DELETE FROM ` + table); c != "PF006" && c != "" {
			t.Errorf("unfenced DELETE FROM %s: SQLSTATE %q, want PF006", table, c)
		}
		pgfencetest.IssueToken(t, pool, resource, 1)
		if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf(resource, "", 1), `INSERT INTO `+table+` VALUES `+row); err != nil {
			t.Errorf("fenced INSERT INTO %s: %v", table, err)
		}
	}

	mustExecPool(t, pool, `CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us')`)
	guarded("orders_us", `('us', 1)`, "orders:us")
	mustExecPool(t, pool, `CREATE TABLE orders_jp (region text, id int, PRIMARY KEY (region, id))`)
	mustExecPool(t, pool, `INSERT INTO orders_jp VALUES ('jp', 1)`)
	mustExecPool(t, pool, `ALTER TABLE orders ATTACH PARTITION orders_jp FOR VALUES IN ('jp')`)
	guarded("orders_jp", `('jp', 2)`, "orders:jp")
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders_jp`).Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("orders_jp holds %d rows (%v), want the attached row and the fenced one", rows, err)
	}
	mustExecPool(t, pool, `CREATE TABLE child () INHERITS (base)`)
	guarded("child", `('c')`, "base:c")
	mustExecPool(t, pool, `CREATE TABLE adopted (k text PRIMARY KEY)`)
	mustExecPool(t, pool, `ALTER TABLE adopted INHERIT base`)
	guarded("adopted", `('a')`, "base:a")

	// The owner of a protected table that may not protect cannot add a
	// partition to it.
	owner, ownerPool := loginRole(t, db, "")
	mustExecPool(t, pool, `CREATE TABLE owned (k text PRIMARY KEY) PARTITION BY LIST (k)`)
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"owned"}, "k", ""); err != nil {
		t.Fatal(err)
	}
	mustExecPool(t, pool, `ALTER TABLE owned OWNER TO `+pgx.Identifier{owner}.Sanitize())
	mustExecPool(t, pool, `GRANT CREATE ON SCHEMA public TO `+pgx.Identifier{owner}.Sanitize())
	if _, err := ownerPool.Exec(ctx, `CREATE TABLE owned_a PARTITION OF owned FOR VALUES IN ('a')`); err == nil {
		t.Error("a role that may not protect added a partition to a protected table")
	}

	// Without the event trigger: a new partition takes no write until the
	// table is protected again.
	mustExecPool(t, pool, `ALTER EVENT TRIGGER pgfence_guard_new_tables DISABLE`)
	mustExecPool(t, pool, `CREATE TABLE orders_br PARTITION OF orders FOR VALUES IN ('br')`)
	pgfencetest.IssueToken(t, pool, "orders:br", 1)
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("orders:br", "", 1), `INSERT INTO orders_br VALUES ('br', 1)`); !errors.Is(err, pgfence.ErrUnfencedWrite) {
		t.Errorf("fenced INSERT into a partition added without the event trigger: %v, want ErrUnfencedWrite", err)
	}
	mustExecPool(t, pool, `ALTER EVENT TRIGGER pgfence_guard_new_tables ENABLE`)
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"orders"}, "region", "orders:"); err != nil {
		t.Fatal(err)
	}
	mustExecPool(t, pool, `ALTER EVENT TRIGGER pgfence_guard_new_tables DISABLE`)
	defer mustExecPool(t, pool, `ALTER EVENT TRIGGER pgfence_guard_new_tables ENABLE`)
	guarded("orders_br", `('br', 2)`, "orders:br")
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
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("jobs:B", "", 5), `INSERT INTO jobs VALUES ('B', 'x')`); pgerr.Code(err) != "PF006" {
		t.Fatalf("fenced for jobs:B, stored as jobs:b: %v, want PF006", err)
	}
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("jobs:b", "", 5), `INSERT INTO jobs VALUES ('B', 'x')`); err != nil {
		t.Fatalf("fenced for the resource the row is stored under: %v", err)
	}
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("gen:r1", "", 1), `INSERT INTO gen (id) VALUES (1)`); err != nil {
		t.Fatalf("fenced insert, generated resource column: %v", err)
	}
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("gen:r1", "", 2), `INSERT INTO gen (id) VALUES (2)`); pgerr.Code(err) != "PF006" {
		t.Fatalf("insert of gen:r2 fenced for gen:r1: %v, want PF006", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM gen)`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d rows stored (%v), want the two fenced ones", n, err)
	}
}

// Migrated by a role that is not a superuser (a database owner, as on a
// managed service), the schema installs without the event trigger, and a
// partition added to a protected table refuses writes until the table is
// protected again.
func TestMigratedWithoutSuperuser(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := pgfencetest.NewDatabase(t)
	owner, _ := loginRole(t, admin, "")
	name := "pgfence_nosu_" + strings.TrimPrefix(owner, "pgfence_t__")
	mustExecPool(t, admin.Pool, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()+` OWNER `+pgx.Identifier{owner}.Sanitize())
	t.Cleanup(func() {
		_, _ = admin.Pool.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
	})
	cfg, err := pgxpool.ParseConfig(admin.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database, cfg.ConnConfig.User, cfg.ConnConfig.Password = name, owner, "pgfence-test-password"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool); err != nil {
		t.Fatalf("migrating as a database owner that is not a superuser: %v", err)
	}
	var triggers int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_event_trigger WHERE evtname = 'pgfence_guard_new_tables'`).Scan(&triggers); err != nil || triggers != 0 {
		t.Fatalf("%d event triggers (%v), want none without a superuser", triggers, err)
	}
	mustExecPool(t, pool, `CREATE TABLE orders (region text PRIMARY KEY) PARTITION BY LIST (region)`)
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"orders"}, "region", ""); err != nil {
		t.Fatal(err)
	}
	mustExecPool(t, pool, `CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us')`)
	pgfencetest.IssueToken(t, pool, "us", 1)
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("us", "", 1), `INSERT INTO orders VALUES ('us')`); !errors.Is(err, pgfence.ErrUnfencedWrite) {
		t.Fatalf("fenced INSERT into a partition added after protect: %v, want ErrUnfencedWrite until protected again", err)
	}
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"orders"}, "region", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("us", "", 1), `INSERT INTO orders VALUES ('us')`); err != nil {
		t.Fatalf("fenced INSERT once protected again: %v", err)
	}
	if _, err := pool.Exec(ctx, `TRUNCATE orders_us`); pgerr.Code(err) != "PF006" {
		t.Fatalf("TRUNCATE of the partition once protected again: %v, want PF006", err)
	}
}
