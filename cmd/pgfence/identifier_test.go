package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestSplitIdentifier(t *testing.T) {
	ok := map[string]pgx.Identifier{
		"stock":                   {"stock"},
		"public.stock":            {"public", "stock"},
		"Mixed.Case":              {"Mixed", "Case"}, // as written, not folded
		`"a.b"`:                   {"a.b"},
		`"a.b"."c""d"`:            {"a.b", `c"d`},
		`s."t"`:                   {"s", "t"},
		`"x""; DROP TABLE t; --"`: {`x"; DROP TABLE t; --`},
		`semi;colon`:              {"semi;colon"},
		`it's`:                    {"it's"},
		`back\slash`:              {`back\slash`},
		"e\u0301.שלום":            {"e\u0301", "שלום"},
		`""""`:                    {`"`},
		`a.b.c`:                   {"a", "b", "c"},
	}
	for in, want := range ok {
		got, err := splitIdentifier(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("splitIdentifier(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{
		"", ".", "a.", ".a", "a..b", `"unterminated`, `"a"b`, `a"b`, `""`, `"".a`,
		"a\x00b", strings.Repeat("x", 64), "a.\xff", `"a"."b`,
	} {
		if got, err := splitIdentifier(in); err == nil {
			t.Errorf("splitIdentifier(%q) = %q, want an error", in, got)
		}
	}
}

// FuzzSplitIdentifier: the parser never panics, every name it returns is one
// PostgreSQL keeps as is, and quoting any valid name and parsing it back
// gives the same parts.
func FuzzSplitIdentifier(f *testing.F) {
	for _, s := range []string{"public.stock", `"a.b"."c""d"`, `x"; DROP TABLE t; --`, "e\u0301", "a..b", `"`, "\x00", strings.Repeat("€", 22)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		parts, err := splitIdentifier(s)
		if err == nil {
			if err := pgfence.CheckIdentifier(parts); len(parts) <= 3 && err != nil {
				t.Fatalf("splitIdentifier(%q) = %q, which CheckIdentifier refuses: %v", s, parts, err)
			}
			// Sanitize's output is our own quoting syntax: it must parse back.
			back, err := splitIdentifier(parts.Sanitize())
			if err != nil || !slices.Equal(back, parts) {
				t.Fatalf("round trip of %q via %s: %q, %v", parts, parts.Sanitize(), back, err)
			}
		}
		// Any single valid name, quoted, parses back to itself.
		if pgfence.CheckIdentifier(pgx.Identifier{s}) == nil {
			got, err := splitIdentifier(pgx.Identifier{s}.Sanitize())
			if err != nil || len(got) != 1 || got[0] != s {
				t.Fatalf("quoted %q parses as %q, %v", s, got, err)
			}
		} else if utf8.ValidString(s) && !strings.ContainsRune(s, 0) && len(s) > 0 && len(s) <= 63 {
			t.Fatalf("CheckIdentifier refuses %q", s)
		}
	})
}

// TestProtectHostileNames drives protect, unprotect and fences through the
// CLI with names that try to break out of their quoting.
func TestProtectHostileNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	const schema, table, column = `s.x"; DROP TABLE canary; --`, `t'; DROP TABLE canary; --`, "cöl\u0301 ;"
	for _, q := range []string{
		`CREATE TABLE canary (id int PRIMARY KEY)`,
		`INSERT INTO canary VALUES (1)`,
		`CREATE SCHEMA ` + pgx.Identifier{schema}.Sanitize(),
		`CREATE TABLE ` + pgx.Identifier{schema, table}.Sanitize() + ` (` + pgx.Identifier{column}.Sanitize() + ` text)`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	arg := pgx.Identifier{schema, table}.Sanitize() // "s.x""; …"."t'; …": the SQL spelling works on the command line
	code, out, errOut := cli(t, environ, "tables", "protect", arg, "--resource-column", column, "--prefix", `p'\`)
	if code != exitOK {
		t.Fatalf("protect %s: code %d\n%s%s", arg, code, out, errOut)
	}
	list, err := pgfence.Protected(ctx, db.Pool)
	if err != nil || len(list) != 1 || list[0].ResourceColumn != column || list[0].Prefix != `p'\` {
		t.Fatalf("Protected: %+v, %v", list, err)
	}
	if code, out, _ := cli(t, environ, "tables", "list"); code != exitOK || !strings.Contains(out, column) {
		t.Fatalf("tables list: code %d, want the column %q listed:\n%s", code, column, out)
	}
	for _, bad := range []string{
		strings.Repeat("t", 64),             // would be truncated
		"public." + strings.Repeat("€", 22), // 66 bytes
		"a.b.c",                             // not a table
		`canary"; DROP TABLE canary; --`,    // a stray quote
		"canary\x00x",                       // pgx would drop the NUL
		`"unterminated`,
	} {
		code, _, errOut := cli(t, environ, "tables", "protect", bad, "--resource-column", "id")
		if code != exitUsage || !strings.Contains(errOut, "TABLE") {
			t.Errorf("protect %q: code %d, want %d (usage) naming TABLE:\n%s", bad, code, exitUsage, errOut)
		}
		if code, _, _ := cli(t, environ, "tables", "unprotect", bad); code != exitUsage {
			t.Errorf("unprotect %q: code %d, want %d", bad, code, exitUsage)
		}
	}
	for _, bad := range [][]string{
		{"--resource-column", strings.Repeat("c", 64)},
		{"--resource-column", "c\x00d"},
		{"--resource-column", "id", "--prefix", strings.Repeat("p", 512)},
		{"--resource-column", "id", "--prefix", "p\xff"},
	} {
		args := append([]string{"tables", "protect", "canary"}, bad...)
		if code, _, errOut := cli(t, environ, args...); code != exitUsage || !strings.Contains(errOut, bad[len(bad)-2]) {
			t.Errorf("protect %q: code %d, want %d (usage) naming %s:\n%s", bad, code, exitUsage, bad[len(bad)-2], errOut)
		}
	}
	if code, _, errOut := cli(t, environ, "floor", "show", "--column", `canary.id"; DROP TABLE canary; --`); code != exitUsage {
		t.Errorf("floor show with a hostile --column: code %d:\n%s", code, errOut)
	}
	if code, out, errOut := cli(t, environ, "floor", "show", "--column", arg+`."`+strings.ReplaceAll(column, `"`, `""`)+`"`); code != exitOK {
		t.Errorf("floor show with a quoted --column: code %d:\n%s%s", code, out, errOut)
	}
	if code, out, errOut := cli(t, environ, "tables", "unprotect", arg); code != exitOK || !strings.Contains(out, "unprotected") {
		t.Fatalf("unprotect: code %d\n%s%s", code, out, errOut)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM canary`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("canary: %d rows, %v", n, err)
	}
	if list, err := pgfence.Protected(ctx, db.Pool); err != nil || len(list) != 0 {
		t.Fatalf("Protected after unprotect: %+v, %v", list, err)
	}
}
