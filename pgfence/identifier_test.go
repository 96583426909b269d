package pgfence_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// hostileNames are valid PostgreSQL identifiers that break naive quoting.
// Each must name exactly its own object.
var hostileNames = []string{
	`it's`,
	`say "hi"`,
	`"`,
	`'`,
	`semi;colon`,
	`x"; DROP TABLE canary; --`,
	`x'); DROP TABLE canary; --`,
	`back\slash\`,
	`a.b`,
	`$1`,
	`%s %I %L`,
	`Mixed Case`,
	" lead\ttab\nnewline",
	"Ünïcödé",
	"e\u0301",                 // e + combining acute: not the same name as "é"
	"\u00e9",                  // é precomposed
	"\u202egnp.exe",           // right-to-left override
	"שלום",                    // right-to-left script
	"🐘",                       // 4-byte UTF-8
	strings.Repeat("x", 63),   // the longest name PostgreSQL keeps
	strings.Repeat("€", 63/3), // 63 bytes of 3-byte runes
	strings.Repeat("y", 63-1), // 62 bytes
}

// TestHostileIdentifiers runs every helper that builds SQL from names on
// tables, schemas and columns whose names try to escape their quoting, and
// checks each touches exactly its object while a canary table stays intact.
func TestHostileIdentifiers(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	mustExec(t, pool, `CREATE TABLE canary (id int PRIMARY KEY)`)
	mustExec(t, pool, `INSERT INTO canary VALUES (1), (2), (3)`)
	const schema = `sch"; DROP TABLE canary; --`
	mustExec(t, pool, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize())

	const fenceCol, valCol = `fen'ce"`, `v;al\`
	var token int64 = 100
	for i, name := range hostileNames {
		// Vary the schema, so both the search_path and a qualified name
		// are exercised.
		table := pgx.Identifier{name}
		if i%3 == 1 {
			table = pgx.Identifier{schema, name}
		}
		t.Run(strings.ToValidUTF8(name, "?"), func(t *testing.T) {
			if err := pgfence.CheckIdentifier(table); err != nil {
				t.Fatalf("CheckIdentifier(%q): %v", table, err)
			}
			// The resource column carries the table's own hostile name.
			mustExec(t, pool, `CREATE TABLE `+table.Sanitize()+` (`+pgx.Identifier{name}.Sanitize()+` text PRIMARY KEY, `+
				pgx.Identifier{fenceCol}.Sanitize()+` bigint, `+pgx.Identifier{valCol}.Sanitize()+` text)`)
			mustExec(t, pool, `INSERT INTO `+table.Sanitize()+` VALUES ('r1', NULL, 'v0')`)

			token++
			mustExec(t, pool, `UPDATE `+table.Sanitize()+` SET `+pgx.Identifier{fenceCol}.Sanitize()+` = $1`, token)
			maxToken, err := pgfence.MaxStoredToken(ctx, pool, pgfence.Column{Table: table, Name: fenceCol})
			if err != nil || maxToken < token {
				t.Fatalf("MaxStoredToken: %d, %v; want at least %d", maxToken, err, token)
			}

			prefix := name + `:'\000\`
			if err := pgfence.Protect(ctx, pool, table, name, prefix); err != nil {
				t.Fatalf("Protect: %v", err)
			}
			assertProtected(t, pool, table, name, prefix)
			if _, err := pool.Exec(ctx, `UPDATE `+table.Sanitize()+` SET `+pgx.Identifier{valCol}.Sanitize()+` = 'unfenced'`); !errors.Is(pgfence.MapError(err), pgfence.ErrUnfencedWrite) {
				t.Fatalf("unfenced write to the protected table: %v, want ErrUnfencedWrite", err)
			}
			// The guard reads the hostile column and prepends the hostile prefix.
			issue(t, pool, prefix+"r1")
			if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf(prefix+"r1", "", 1),
				`UPDATE `+table.Sanitize()+` SET `+pgx.Identifier{valCol}.Sanitize()+` = 'fenced'`); err != nil {
				t.Fatalf("fenced write to the protected table: %v", err)
			}
			had, err := pgfence.Unprotect(ctx, pool, table)
			if err != nil || !had {
				t.Fatalf("Unprotect: %v, %v", had, err)
			}
			if list, err := pgfence.Protected(ctx, pool); err != nil || len(list) != 0 {
				t.Fatalf("Protected after Unprotect: %+v, %v", list, err)
			}
		})
	}
	assertCanary(t, pool)
}

// TestRejectedIdentifiers checks that names PostgreSQL would change (truncate,
// or pgx would strip of NUL bytes) are refused before any SQL runs, and that
// the object they would have become is left alone.
func TestRejectedIdentifiers(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	mustExec(t, pool, `CREATE TABLE canary (id int PRIMARY KEY)`)
	mustExec(t, pool, `INSERT INTO canary VALUES (1), (2), (3)`)
	long := strings.Repeat("t", 63)
	// What the rejected names would turn into: a truncated and a NUL-stripped name.
	mustExec(t, pool, `CREATE TABLE `+pgx.Identifier{long}.Sanitize()+` (r text, f bigint)`)
	mustExec(t, pool, `CREATE TABLE ab (r text, f bigint)`)
	mustExec(t, pool, `INSERT INTO `+pgx.Identifier{long}.Sanitize()+` VALUES ('x', 1)`)

	bad := map[string]pgx.Identifier{
		"empty":              {""},
		"no parts":           {},
		"empty schema":       {"", "ab"},
		"NUL byte":           {"a\x00b"},
		"NUL in schema":      {"pub\x00lic", "ab"},
		"64 bytes":           {long + "t"},
		"64 bytes of runes":  {strings.Repeat("€", 21) + "t"},
		"long schema":        {strings.Repeat("s", 64), "ab"},
		"invalid UTF-8":      {"a\xffb"},
		"four parts":         {"a", "b", "c", "d"},
		"injection and long": {`"; DROP TABLE canary; --` + strings.Repeat("z", 60)},
	}
	for what, table := range bad {
		t.Run(what, func(t *testing.T) {
			invalid := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, pgfence.ErrInvalid) {
					t.Errorf("%s: %v, want ErrInvalid", op, err)
				}
			}
			invalid("CheckIdentifier", pgfence.CheckIdentifier(table))
			invalid("Protect", pgfence.Protect(ctx, pool, table, "r", ""))
			_, err := pgfence.Unprotect(ctx, pool, table)
			invalid("Unprotect", err)
			_, err = pgfence.MaxStoredToken(ctx, pool, pgfence.Column{Table: table, Name: "f"})
			invalid("MaxStoredToken", err)
			// The same bad names as columns of a good table.
			if len(table) == 1 {
				col := table[0]
				invalid("Protect column", pgfence.Protect(ctx, pool, pgx.Identifier{"ab"}, col, ""))
				_, err := pgfence.MaxStoredToken(ctx, pool, pgfence.Column{Table: pgx.Identifier{"ab"}, Name: col})
				invalid("MaxStoredToken column", err)
			}
		})
	}
	for _, prefix := range []string{"a\x00b", "\xff", strings.Repeat("p", pgfence.MaxResourceLen)} {
		if err := pgfence.Protect(ctx, pool, pgx.Identifier{"ab"}, "r", prefix); !errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("Protect with prefix %.10q (%d bytes): %v, want ErrInvalid", prefix, len(prefix), err)
		}
	}
	// Nothing was protected, the truncation target kept its row.
	if list, err := pgfence.Protected(ctx, pool); err != nil || len(list) != 0 {
		t.Fatalf("Protected: %+v, %v; want none", list, err)
	}
	var f int64
	if err := pool.QueryRow(ctx, `SELECT f FROM `+pgx.Identifier{long}.Sanitize()).Scan(&f); err != nil || f != 1 {
		t.Fatalf("the 63-byte table changed: f = %d, %v", f, err)
	}
	// Names that do not exist fail in the database, and do nothing else.
	for _, missing := range []pgx.Identifier{{"canary; DROP TABLE canary"}, {"public", "canary\"; DROP TABLE canary; --"}, {"nosuchschema", "canary"}} {
		if err := pgfence.Protect(ctx, pool, missing, "id", ""); err == nil || errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("Protect(%q): %v, want a database error", missing, err)
		}
		if _, err := pgfence.Unprotect(ctx, pool, missing); err == nil {
			t.Errorf("Unprotect(%q): no error", missing)
		}
	}
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"canary"}, "id; DROP TABLE canary", ""); !errors.Is(err, pgfence.ErrInvalid) {
		t.Errorf("Protect with a column that does not exist: %v, want ErrInvalid (PF008)", err)
	}
	assertCanary(t, pool)
}

// assertProtected checks that exactly table is protected, with exactly the
// given column and prefix, through the SQL function and the Go API.
func assertProtected(t *testing.T, pool *pgxpool.Pool, table pgx.Identifier, column, prefix string) {
	t.Helper()
	ctx := testContext(t)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.protected_tables()
		WHERE relation = $1::regclass AND resource_column = $2 AND prefix = $3`, table.Sanitize(), column, prefix).Scan(&n); err != nil || n != 1 {
		t.Fatalf("pgfence.protected_tables() has %d rows for %s (column %q, prefix %q), %v; want 1", n, table.Sanitize(), column, prefix, err)
	}
	list, err := pgfence.Protected(ctx, pool)
	if err != nil || len(list) != 1 || list[0].ResourceColumn != column || list[0].Prefix != prefix {
		t.Fatalf("Protected: %+v, %v; want one table with column %q and prefix %q", list, err, column, prefix)
	}
	var same bool
	if err := pool.QueryRow(ctx, `SELECT $1::regclass = $2::regclass`, list[0].Table, table.Sanitize()).Scan(&same); err != nil || !same {
		t.Fatalf("Protected lists %s, not %s: %v", list[0].Table, table.Sanitize(), err)
	}
}

// assertCanary checks that the canary table still has its three rows and no trigger.
func assertCanary(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := testContext(t)
	var rows, triggers int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM canary), (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'canary'::regclass)`).Scan(&rows, &triggers); err != nil || rows != 3 || triggers != 0 {
		t.Fatalf("canary: %d rows, %d triggers, %v; want 3 rows and no trigger", rows, triggers, err)
	}
}
