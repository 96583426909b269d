// Package repocheck holds tests over the repository's source: every SQL
// statement pgfence's libraries and CLI send is immune to the caller's
// search_path, and imports run one way (libraries never depend on tooling;
// examples use the public API only).
package repocheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// dirs are the packages whose statements run in other people's sessions:
// the libraries (inside the application's pool and transactions) and the
// CLI (run by operators, often as a privileged role).
var dirs = []string{"leases", "pgfence", "idempotency", "migrations", "internal/driver", "cmd/pgfence"}

var (
	// statement: a string literal that starts with an SQL keyword (pgfence
	// writes them in upper case; prose and messages do not start so).
	statement = regexp.MustCompile(`^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|DROP|ALTER|SET|SHOW|LISTEN|UNLISTEN|NOTIFY|TRUNCATE|LOCK|VALUES|CALL)\b`)
	call      = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_$]*)\s*\(`)
	// sqlMarks tell a statement from a message that starts with the same
	// word: it names a schema or takes a parameter.
	sqlMarks = regexp.MustCompile(`pgfence\.|pg_catalog\.|\$[0-9]|\bFROM\b`)
	// quoted are string literals and comments, whose words are not calls.
	quoted = regexp.MustCompile(`'(?:[^']|'')*'|--[^\n]*`)
	// syntax is SQL's own syntax that looks like a call: keywords, and
	// constructs that are not looked up as functions by name.
	syntax = map[string]bool{}
	// declares: a name right after these is a table, alias or CTE being
	// named, with its column list.
	declares = regexp.MustCompile(`(?i)\b(AS|INTO|TABLE|RECURSIVE|REFERENCES|CONFLICT|INDEX|VIEW|USING|JOIN|FROM|UPDATE|ON)\s*$`)
)

func init() {
	for _, k := range strings.Fields(`SELECT INSERT UPDATE DELETE WITH IN EXISTS VALUES ANY ALL ARRAY COALESCE GREATEST LEAST
		NULLIF CAST EXTRACT ROW FILTER OVER LATERAL AS USING CONFLICT INTO ON FROM WHERE AND OR NOT CASE WHEN
		THEN ELSE END RETURNING SET TABLE KEY PRIMARY REFERENCES CHECK UNIQUE DEFAULT UNION EXCEPT INTERSECT
		LIMIT OFFSET BY HAVING JOIN DISTINCT IS NULL INTERVAL NOTHING PARTITION WINDOW ROWS RANGE BETWEEN LIKE
		ILIKE SIMILAR ESCAPE POSITION SUBSTRING OVERLAY TRIM COLLATE GROUPING OPERATOR TIMESTAMP VARCHAR CHAR
		NUMERIC DECIMAL`) {
		syntax[k] = true
	}
}

// TestStatementsQualifyFunctions: a function called by its bare name is
// looked up along the session's search_path, and a better-matching function
// of the same name that another role created in a schema on that path (the
// public schema before PostgreSQL 15) runs instead of pg_catalog's, with the
// caller's rights. Every function call in the SQL the libraries and the CLI
// send is schema-qualified (pg_catalog., pgfence.), or is SQL syntax.
func TestStatementsQualifyFunctions(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	var found int
	for _, dir := range dirs {
		err := filepath.Walk(filepath.Join(root, dir), func(path string, info os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			if info.IsDir() {
				if info.Name() == "testdata" || (info.Name() == "benchpeer" && path != filepath.Join(root, dir)) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			fs := token.NewFileSet()
			f, err := parser.ParseFile(fs, path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil || !statement.MatchString(s) || !sqlMarks.MatchString(s) {
					return true
				}
				found++
				for _, bare := range bareCalls(s) {
					t.Errorf("%s: %s( is not schema-qualified in %q", fs.Position(lit.Pos()), bare, oneLine(s))
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if found < 50 {
		t.Fatalf("found only %d statements: the scan no longer sees the SQL", found)
	}
}

// bareCalls returns the names called without a schema in statement s.
func bareCalls(s string) []string {
	s = quoted.ReplaceAllString(s, "''")
	var out []string
	for _, m := range call.FindAllStringSubmatchIndex(s, -1) {
		name := s[m[2]:m[3]]
		switch {
		case syntax[strings.ToUpper(name)]:
		case m[2] > 0 && (s[m[2]-1] == '.' || s[m[2]-1] == '%' || s[m[2]-1] == '"'):
			// qualified, a format verb (%s) or a quoted identifier
		case declares.MatchString(s[:m[2]]):
			// a table, alias or CTE with its column list
		default:
			out = append(out, name)
		}
	}
	return out
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return s
}

// The check itself must be able to fail.
func TestBareCallsFindsUnqualifiedCalls(t *testing.T) {
	for s, want := range map[string]string{
		`SELECT pg_terminate_backend(pid, 2000) FROM x`:                    "pg_terminate_backend",
		`SELECT format('%I.%I', n.nspname, c.relname)`:                     "format",
		`SELECT pgfence.fence($1, $2), pg_notify($3, $1)`:                  "pg_notify",
		`SELECT count(*) FROM pgfence.leases`:                              "count",
		`INSERT INTO pgfence.leases AS l (key) VALUES (clock_timestamp())`: "clock_timestamp",
	} {
		if got := bareCalls(s); len(got) != 1 || got[0] != want {
			t.Errorf("bareCalls(%q) = %v, want [%s]", s, got, want)
		}
	}
	for _, s := range []string{
		`SELECT pg_catalog.count(*) FROM pgfence.leases WHERE key IN ($1)`,
		`WITH RECURSIVE tree(relid) AS (SELECT 1) SELECT COALESCE(GREATEST(1, 2), 0) FROM tree`,
		`INSERT INTO pgfence.fences AS f (resource, token) VALUES ($1, $2) ON CONFLICT (resource) DO NOTHING`,
		`SELECT x OPERATOR(pg_catalog.=) $1 FROM pg_catalog.pg_class WHERE EXISTS (SELECT 1)`,
	} {
		if got := bareCalls(s); len(got) != 0 {
			t.Errorf("bareCalls(%q) = %v, want none", s, got)
		}
	}
}
