package migrations_test

import (
	"context"
	"slices"
	"testing"
)

// TestProtectedTablesKeepsSettings checks that 00010, which replaces
// pgfence.protected_tables(), keeps settings put on the function before it
// (by a least-privilege migration or an operator) in both directions, and that
// its up direction lists a unicode column and a backslash prefix exactly.
func TestProtectedTablesKeepsSettings(t *testing.T) {
	ctx := context.Background()
	db := blankDatabase(t)
	m := newMigrator(t, db.Pool)
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.DownTo(ctx, 9); err != nil {
		t.Fatal(err)
	}
	const fn = `pgfence.protected_tables()`
	for _, q := range []string{
		`ALTER FUNCTION ` + fn + ` SET search_path = pg_catalog, "odd ""schema"""`,
		`ALTER FUNCTION ` + fn + ` SET lock_timeout = '5s'`,
		`ALTER FUNCTION ` + fn + ` SECURITY DEFINER`,
		`CREATE TABLE public."t é" ("cöl" text)`,
		`SELECT pgfence.protect('public."t é"', 'cöl', 'p\000\')`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	settings := func(when string) {
		t.Helper()
		var cfg []string
		var secdef bool
		if err := db.Pool.QueryRow(ctx, `SELECT proconfig, prosecdef FROM pg_proc WHERE oid = $1::regprocedure`, fn).Scan(&cfg, &secdef); err != nil {
			t.Fatal(err)
		}
		want := []string{`search_path=pg_catalog, "odd ""schema"""`, "lock_timeout=5s"}
		if !slices.Equal(cfg, want) || !secdef {
			t.Fatalf("%s: proconfig %q, security definer %v; want %q, true", when, cfg, secdef, want)
		}
	}
	listed := func() (col, prefix string) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT resource_column, prefix FROM pgfence.protected_tables()`).Scan(&col, &prefix); err != nil {
			t.Fatal(err)
		}
		return col, prefix
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	settings("after up")
	if col, prefix := listed(); col != "cöl" || prefix != `p\000\` {
		t.Fatalf("protected_tables() lists column %q prefix %q, want %q %q", col, prefix, "cöl", `p\000\`)
	}
	if _, err := m.DownTo(ctx, 9); err != nil {
		t.Fatal(err)
	}
	settings("after down")
	if col, _ := listed(); col == "cöl" {
		t.Fatalf("down did not restore the 00003 body (it lists %q exactly)", col)
	}
}
