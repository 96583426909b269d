package migrations_test

import (
	"context"
	"testing"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestProtectedTablesListsArgumentsExactly checks that
// pgfence.protected_tables() reports a protected table's resource column and
// prefix exactly as pgfence.protect() was given them: a column name outside
// ASCII and a prefix with backslashes (which encode(tgargs, 'escape') would
// turn into octal escapes, or cut at a literal \000).
func TestProtectedTablesListsArgumentsExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgfencetest.NewPool(t)
	for _, q := range []string{
		`CREATE TABLE public."t é" ("cöl" text)`,
		`SELECT pgfence.protect('public."t é"', 'cöl', 'p\000\')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var col, prefix string
	if err := pool.QueryRow(ctx, `SELECT resource_column, prefix FROM pgfence.protected_tables()`).Scan(&col, &prefix); err != nil {
		t.Fatal(err)
	}
	if col != "cöl" || prefix != `p\000\` {
		t.Fatalf("protected_tables() lists column %q prefix %q, want %q %q", col, prefix, "cöl", `p\000\`)
	}
}
