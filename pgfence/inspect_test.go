package pgfence_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// searchPathTrap shadows, in schema trap, the pg_catalog functions and
// operators a read could reach by an unqualified name. A session whose
// search_path lists trap before pg_catalog runs the trap instead, which
// raises: a statement that works there is immune to search_path.
const searchPathTrap = `
CREATE SCHEMA trap;
CREATE FUNCTION trap.sprung() RETURNS boolean LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'search_path trap sprung'; END$$;
CREATE FUNCTION trap.text_eq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT trap.sprung()';
CREATE OPERATOR trap.= (LEFTARG = text, RIGHTARG = text, FUNCTION = trap.text_eq);
CREATE FUNCTION trap.oid_eq(oid, oid) RETURNS boolean LANGUAGE sql AS 'SELECT trap.sprung()';
CREATE OPERATOR trap.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = trap.oid_eq);
CREATE FUNCTION trap.starts_with(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT trap.sprung()';
CREATE FUNCTION trap.to_regclass(text) RETURNS regclass LANGUAGE sql AS 'SELECT NULL::regclass WHERE trap.sprung()'`

// trappedPool returns a pool on db whose sessions search trap first.
func trappedPool(t *testing.T, db *pgfencetest.Database) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, searchPathTrap); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "trap, pg_catalog, public"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The trap works: an unqualified comparison springs it.
	var eq bool
	if err := pool.QueryRow(ctx, `SELECT 'a'::pg_catalog.text = 'a'`).Scan(&eq); err == nil || !strings.Contains(err.Error(), "trap sprung") {
		t.Fatalf("an unqualified = with the trap on the search_path: %v, %v; want the trap", eq, err)
	}
	return pool
}

func TestInspectFences(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	before := time.Now().Add(-time.Minute)
	issue(t, db.Pool, "stock/a", "stock/b", "orders/1")
	for _, f := range []struct {
		resource string
		token    int64
	}{{"stock/b", 3}, {"stock/a", 5}, {"stock/a", 7}, {"orders/1", 2}} {
		if _, err := db.Pool.Exec(ctx, `SELECT pgfence.fence($1, $2)`, f.resource, f.token); err != nil {
			t.Fatal(err)
		}
	}
	pool := trappedPool(t, db)

	all, err := pgfence.Fences(ctx, pool, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range all {
		names = append(names, f.Resource)
	}
	if strings.Join(names, " ") != "orders/1 stock/a stock/b" {
		t.Fatalf("Fences: %v, want every resource ordered by name", names)
	}
	a := all[1]
	if a.Token != 7 || a.Writes != 2 || a.AcceptedAt.Before(before) || a.Op != (pgfence.OpID{}) {
		t.Fatalf("Fences: stock/a = %+v, want token 7 after 2 writes, no op id", a)
	}
	stock, err := pgfence.Fences(ctx, pool, "stock/", 1)
	if err != nil || len(stock) != 1 || stock[0].Resource != "stock/a" {
		t.Fatalf("Fences(stock/, 1) = %+v, %v; want stock/a only", stock, err)
	}

	got, err := pgfence.LookupFence(ctx, pool, "stock/a")
	if err != nil || got != a {
		t.Fatalf("LookupFence(stock/a) = %+v, %v; want %+v", got, err, a)
	}
	if _, err := pgfence.LookupFence(ctx, pool, "stock/none"); !errors.Is(err, pgfence.ErrNotFound) {
		t.Fatalf("LookupFence of a resource never fenced: %v, want ErrNotFound", err)
	}
	for _, bad := range []error{
		func() error { _, err := pgfence.Fences(ctx, pool, "", -1); return err }(),
		func() error { _, err := pgfence.Fences(ctx, pool, "", 100_001); return err }(),
		func() error { _, err := pgfence.Fences(ctx, pool, "a\x00", 0); return err }(),
		func() error { _, err := pgfence.LookupFence(ctx, pool, ""); return err }(),
	} {
		if !errors.Is(bad, pgfence.ErrInvalid) {
			t.Errorf("want ErrInvalid, got %v", bad)
		}
	}
}

func TestInspectTokenFloorAndProtection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.stock (sku text PRIMARY KEY);
		SELECT pgfence.protect('public.stock', 'sku', 'stock/');
		SELECT pgfence.raise_token_floor(1000, 'restored from backup')`); err != nil {
		t.Fatal(err)
	}
	pool := trappedPool(t, db)

	floor, err := pgfence.TokenFloor(ctx, pool)
	if err != nil || floor.Floor != 1000 || floor.Reason != "restored from backup" || floor.RaisedAt.IsZero() {
		t.Fatalf("TokenFloor = %+v, %v", floor, err)
	}

	// Not on the trapped pool: pgfence.protected_tables(), which ProtectionOf
	// calls, runs on the caller's search_path.
	pool = db.Pool
	p, ok, err := pgfence.ProtectionOf(ctx, pool, pgx.Identifier{"public", "stock"})
	if err != nil || !ok || p.ResourceColumn != "sku" || p.Prefix != "stock/" {
		t.Fatalf("ProtectionOf(public.stock) = %+v, %v, %v", p, ok, err)
	}
	for _, name := range []pgx.Identifier{{"public", "other"}, {"no_such_schema", "stock"}} {
		if _, ok, err := pgfence.ProtectionOf(ctx, pool, name); ok || err != nil {
			t.Errorf("ProtectionOf(%v) = %v, %v; want not protected", name, ok, err)
		}
	}
	if _, _, err := pgfence.ProtectionOf(ctx, pool, pgx.Identifier{strings.Repeat("t", 64)}); !errors.Is(err, pgfence.ErrInvalid) {
		t.Errorf("ProtectionOf of a name PostgreSQL would truncate: %v, want ErrInvalid", err)
	}
}
