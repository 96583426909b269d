package pgfence_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestProtect(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	mustExec(t, pool, `CREATE TABLE acct (id int PRIMARY KEY, owner text, balance int NOT NULL)`)
	mustExec(t, pool, `INSERT INTO acct VALUES (1, 'alice', 10), (2, 'bob', 20)`)
	tbl := pgx.Identifier{"acct"}
	if err := pgfence.Protect(ctx, pool, tbl, "id", "acct:"); err != nil {
		t.Fatal(err)
	}
	issue(t, pool, "acct:1", "acct:2", "acct:3", "acct:4")
	unfenced := func(what string, err error) {
		t.Helper()
		if !errors.Is(pgfence.MapError(err), pgfence.ErrUnfencedWrite) {
			t.Errorf("%s: want ErrUnfencedWrite (PF006), got %v", what, err)
		}
	}
	for _, q := range []string{
		`UPDATE acct SET balance = 0 WHERE id = 1`,
		`DELETE FROM acct WHERE id = 2`,
		`INSERT INTO acct VALUES (3, 'carol', 0)`,
		`TRUNCATE acct`,
	} {
		_, err := pool.Exec(ctx, q)
		unfenced(q, err)
	}
	write := func(resource string, token int64, sql string) error {
		_, err := pgfence.Write(ctx, pool, pgfence.LeaseOf(resource, "", token), func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sql)
			return err
		})
		return err
	}
	if err := write("acct:1", 5, `UPDATE acct SET balance = 11 WHERE id = 1`); err != nil {
		t.Fatalf("fenced update: %v", err)
	}
	if err := write("acct:3", 1, `INSERT INTO acct VALUES (3, 'carol', 0)`); err != nil {
		t.Fatalf("fenced insert: %v", err)
	}
	// The token of one row does not open another.
	unfenced("update of row 2 fenced for row 1", write("acct:1", 5, `UPDATE acct SET balance = 0 WHERE id = 2`))
	unfenced("multi-row update fenced for one row", write("acct:1", 5, `UPDATE acct SET balance = 0`))
	// Moving a row to another resource needs both tokens.
	unfenced("re-key with the old token only", write("acct:3", 1, `UPDATE acct SET id = 4 WHERE id = 3`))
	if _, err := pgfence.Write(ctx, pool, pgfence.LeaseOf("acct:3", "", 1), func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pgfence.fence('acct:4', 1)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE acct SET id = 4 WHERE id = 3`)
		return err
	}); err != nil {
		t.Fatalf("re-key with both tokens: %v", err)
	}
	// A stale token cannot open the door; neither can a fence that was rolled
	// back to a savepoint, nor a hand-made session setting.
	if err := write("acct:1", 4, `UPDATE acct SET balance = 0 WHERE id = 1`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Errorf("stale token: %v", err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, `SAVEPOINT s`)
	mustExec(t, tx, `SELECT pgfence.fence('acct:1', 6)`)
	mustExec(t, tx, `ROLLBACK TO SAVEPOINT s`)
	mustExec(t, tx, `SELECT set_config('pgfence.token', '6', true), set_config('pgfence.resource', 'acct:1', true)`)
	_, err = tx.Exec(ctx, `UPDATE acct SET balance = 0 WHERE id = 1`)
	unfenced("fence rolled back to a savepoint", err)
	_ = tx.Rollback(ctx)
	// A fence accepted in another transaction does not count.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `SELECT pgfence.fence('acct:2', 1)`)
	_, err = tx.Exec(ctx, `DELETE FROM acct WHERE id = 2`)
	unfenced("fence committed by another transaction", err)
	_ = tx.Rollback(ctx)
	// Exec (one round trip) passes the guard.
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("acct:2", "", 2), `DELETE FROM acct WHERE id = $1`, 2); err != nil {
		t.Fatalf("fenced delete via Exec: %v", err)
	}

	list, err := pgfence.Protected(ctx, pool)
	if err != nil || len(list) != 1 || list[0] != (pgfence.ProtectedTable{Table: "acct", ResourceColumn: "id", Prefix: "acct:"}) {
		t.Fatalf("Protected: %+v, %v", list, err)
	}
	if had, err := pgfence.Unprotect(ctx, pool, tbl); err != nil || !had {
		t.Fatalf("Unprotect: %v %v", had, err)
	}
	if had, err := pgfence.Unprotect(ctx, pool, tbl); err != nil || had {
		t.Fatalf("Unprotect again: %v %v", had, err)
	}
	mustExec(t, pool, `UPDATE acct SET balance = 0`)
	if list, err := pgfence.Protected(ctx, pool); err != nil || len(list) != 0 {
		t.Fatalf("Protected after Unprotect: %+v, %v", list, err)
	}
	var rows []struct {
		ID      int
		Owner   string
		Balance int
	}
	r, _ := pool.Query(ctx, `SELECT id, owner, balance FROM acct ORDER BY id`)
	rows, err = pgx.CollectRows(r, pgx.RowToStructByPos[struct {
		ID      int
		Owner   string
		Balance int
	}])
	if err != nil || len(rows) != 2 || rows[0].ID != 1 || rows[1].ID != 4 {
		t.Fatalf("rows %+v, %v", rows, err)
	}
}

func TestProtectInvalid(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	mustExec(t, pool, `CREATE TABLE "Odd Name" (k text, "Res Col" text)`)
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"Odd Name"}, "nope", ""); !errors.Is(err, pgfence.ErrInvalid) {
		t.Fatalf("missing column: %v", err)
	}
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"missing"}, "k", ""); sqlstate(err) != "42P01" {
		t.Fatalf("missing table: %v", err)
	}
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"Odd Name"}, "Res Col", `p\x`); err != nil {
		t.Fatal(err)
	}
	list, err := pgfence.Protected(ctx, pool)
	if err != nil || len(list) != 1 || list[0] != (pgfence.ProtectedTable{Table: `"Odd Name"`, ResourceColumn: "Res Col", Prefix: `p\x`}) {
		t.Fatalf("Protected: %+v, %v", list, err)
	}
	issue(t, pool, `p\xr`)
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf(`p\xr`, "", 1), `INSERT INTO "Odd Name" VALUES ('k', 'r')`); err != nil {
		t.Fatalf("write under an odd prefix: %v", err)
	}
	// NULL resource: no token can cover it.
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf(`p\xr`, "", 1), `INSERT INTO "Odd Name" VALUES ('k', NULL)`); !errors.Is(err, pgfence.ErrUnfencedWrite) {
		t.Fatalf("NULL resource: %v", err)
	}
}

// A resource column must print the same in every session and have one text
// per value: the guard builds the resource from its text in the writer's
// session, and a timestamptz (by TimeZone), a float (by extra_float_digits)
// or an interval (by IntervalStyle) would make one row several resources,
// fenced apart; so would a numeric (1.0 and 1.00 are one key) and a char(n)
// (its padding is not part of the key).
func TestProtectResourceColumnTypes(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	mustExec(t, pool, `CREATE DOMAIN sku_code AS text CHECK (VALUE <> '')`)
	mustExec(t, pool, `CREATE TABLE typed (at timestamptz, f float8, iv interval, n numeric, i int8, u uuid, c char(4), v varchar, d sku_code, b bytea)`)
	for col, ok := range map[string]bool{
		"at": false, "f": false, "iv": false, "b": false, "n": false, "c": false,
		"i": true, "u": true, "v": true, "d": true,
	} {
		err := pgfence.Protect(ctx, pool, pgx.Identifier{"typed"}, col, "t:")
		switch {
		case ok && err != nil:
			t.Errorf("protect on a %s column: %v", col, err)
		case !ok && (!errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), "must be text")):
			t.Errorf("protect on a %s column: %v, want ErrInvalid naming the allowed types", col, err)
		}
	}
}

func TestTokenFloor(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	mustExec(t, pool, `CREATE TABLE jobs (id int PRIMARY KEY, fence bigint)`)
	mustExec(t, pool, `INSERT INTO jobs VALUES (1, 1::bigint << 50)`)
	l := grant(t, pool, "k")
	// The highest token is one that only a fence keeps: lease r issued it,
	// and its row is gone since (deleted, or lost in a restore).
	pgfencetest.IssueToken(t, pool, "r", l.Token+7)
	mustExec(t, pool, `SELECT pgfence.fence('r', $1)`, l.Token+7)
	mustExec(t, pool, `DELETE FROM pgfence.leases WHERE key = 'r'`)
	maxToken, err := pgfence.MaxStoredToken(ctx, pool)
	if err != nil || maxToken != l.Token+7 {
		t.Fatalf("MaxStoredToken: %d %v, want %d", maxToken, err, l.Token+7)
	}
	maxToken, err = pgfence.MaxStoredToken(ctx, pool, pgfence.Column{Table: pgx.Identifier{"jobs"}, Name: "fence"})
	if err != nil || maxToken != 1<<50 {
		t.Fatalf("MaxStoredToken with jobs.fence: %d %v", maxToken, err)
	}
	prev, err := pgfence.RaiseTokenFloor(ctx, pool, maxToken, "restored from backup")
	if err != nil || prev != 0 {
		t.Fatalf("raise: %d %v", prev, err)
	}
	if _, err := pgfence.RaiseTokenFloor(ctx, pool, maxToken, "again"); err != nil {
		t.Fatalf("raise to the same floor: %v", err)
	}
	if _, err := pgfence.RaiseTokenFloor(ctx, pool, maxToken-1, "lower"); !errors.Is(err, pgfence.ErrFloorLowered) {
		t.Fatalf("lower: want ErrFloorLowered, got %v", err)
	}
	if _, err := pgfence.RaiseTokenFloor(ctx, pool, maxToken+1, ""); !errors.Is(err, pgfence.ErrInvalid) {
		t.Fatalf("empty reason: %v", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pgfence.raise_token_floor(-1, 'x')`); sqlstate(err) != "PF008" {
		t.Fatalf("negative floor in SQL: %v", err)
	}
	mustExec(t, pool, expireSQL, "k")
	if l2 := grant(t, pool, "k"); l2.Token <= maxToken {
		t.Fatalf("token %d after the floor was raised to %d", l2.Token, maxToken)
	}
	var fresh int64
	if err := pool.QueryRow(ctx, `SELECT pgfence.next_token(NULL)`).Scan(&fresh); err != nil || fresh != maxToken+1 {
		t.Fatalf("next_token(NULL) = %d %v, want %d", fresh, err, maxToken+1)
	}
}

// The Down migration removes the guard from protected tables and every fence
// object; Up installs them again.
func TestMigrationDownUp(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	mustExec(t, pool, `CREATE TABLE t (r text)`)
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"t"}, "r", ""); err != nil {
		t.Fatal(err)
	}
	m, err := migrations.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.DownTo(ctx, 2); err != nil {
		t.Fatalf("down: %v", err)
	}
	mustExec(t, pool, `INSERT INTO t VALUES ('free')`)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgfence'::regnamespace AND proname IN ('fence', 'guard', 'protect')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d fence functions left after down (%v)", n, err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up: %v", err)
	}
	issue(t, pool, "r")
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("r", "", 1), `SELECT 1`); err != nil {
		t.Fatal(err)
	}
}
