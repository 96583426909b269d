package pgfence

import (
	"database/sql"
	"database/sql/driver"
	"math"
	"strings"
	"testing"
	"time"
)

type valuer string

func (v valuer) Value() (driver.Value, error) { return "v:" + string(v), nil }

type binaryValuer struct{}

func (binaryValuer) BinaryValue() ([]byte, error) { return []byte{1}, nil }

type status string

func TestInterpolate(t *testing.T) {
	s := "it's"
	var nilString *string
	for _, c := range []struct {
		query string
		args  []any
		want  string // "" when interpolate must decline
	}{
		{`UPDATE t SET a = $1 WHERE id = $2`, []any{"x", 7}, `UPDATE t SET a =  'x'  WHERE id =  '7' `},
		{`SELECT $2, $1`, []any{1, 2}, `SELECT  '2' ,  '1' `},
		{`INSERT INTO t VALUES ($1::int)`, []any{int64(-5)}, `INSERT INTO t VALUES ( '-5' ::int)`},
		{`SELECT $1`, []any{nil}, `SELECT  NULL `},
		{`SELECT $1`, []any{nilString}, `SELECT  NULL `},
		{`SELECT $1`, []any{&s}, `SELECT  'it''s' `},
		{`SELECT $1`, []any{true}, `SELECT  'true' `},
		{`SELECT $1`, []any{0.1}, `SELECT  '0.1' `},
		{`SELECT $1`, []any{float32(0.5)}, `SELECT  '0.5' `},
		{`SELECT $1`, []any{math.Inf(1)}, `SELECT  '+Inf' `},
		{`SELECT $1`, []any{math.NaN()}, `SELECT  'NaN' `},
		{`SELECT $1`, []any{uint32(7)}, `SELECT  '7' `},
		{`SELECT $1`, []any{status("ok")}, `SELECT  'ok' `},
		{`SELECT $1`, []any{valuer("a")}, `SELECT  'v:a' `},
		{`SELECT $1`, []any{"grüße $2 -- /*"}, `SELECT  'grüße $2 -- /*' `},
		// Placeholders inside constants, identifiers and comments are text.
		{`SELECT '$1', "$1", $1 -- $1` + "\n" + `/* $1 /* $1 */ $1 */`, []any{"x"},
			`SELECT '$1', "$1",  'x'  -- $1` + "\n" + `/* $1 /* $1 */ $1 */`},
		{`SELECT 'a''$1''b', $1`, []any{"x"}, `SELECT 'a''$1''b',  'x' `},
		{`UPDATE t SET a = $1;`, []any{"x"}, `UPDATE t SET a =  'x' ;`},
		{`UPDATE t SET a = $1; -- done`, []any{"x"}, `UPDATE t SET a =  'x' ; -- done`},
		{`SELECT 1`, nil, `SELECT 1`},

		{`SELECT $1`, []any{[]byte("x")}, ""},            // text or bytea: the server decides
		{`SELECT $1`, []any{`a\b`}, ""},                  // a bytea parameter would read it otherwise
		{`SELECT $1`, []any{"a\x00"}, ""},                // no text holds NUL
		{`SELECT $1`, []any{time.Unix(0, 0)}, ""},        // lib/pq's own format
		{`SELECT $1`, []any{[]string{"a"}}, ""},          // lib/pq makes an array
		{`SELECT $1`, []any{uint64(math.MaxUint64)}, ""}, // lib/pq makes a string
		{`SELECT $1`, []any{binaryValuer{}}, ""},
		{`SELECT $1`, []any{sql.Named("a", 1)}, ""},
		{`SELECT $1, $1`, []any{1}, ""}, // one parameter, one type
		{`SELECT $1`, []any{1, 2}, ""},  // an argument not used
		{`SELECT $2`, []any{1}, ""},     // a placeholder without argument
		{`SELECT $0`, []any{1}, ""},
		{`SELECT $01`, []any{1}, ""},
		{`SELECT $`, []any{1}, ""},
		{`SELECT $$x$$, $1`, []any{1}, ""}, // dollar quoting
		{`SELECT a$1`, []any{1}, ""},       // an identifier
		{`SELECT $1a`, []any{1}, ""},
		{`SELECT $1.f`, []any{1}, ""},
		{`SELECT $1[1]`, []any{"{a}"}, ""},
		{`SELECT 'a'$1`, []any{1}, ""},
		{`SELECT $1'a'`, []any{1}, ""},
		{`SELECT U&$1`, []any{"x"}, ""},
		{`SELECT E'\n', $1`, []any{1}, ""},
		{`SELECT 'open, $1`, []any{1}, ""},
		{`SELECT "open, $1`, []any{1}, ""},
		{`SELECT /* open, $1`, []any{1}, ""},
		{`SELECT /* /* */ $1`, []any{1}, ""}, // still inside the outer comment
		{`UPDATE t SET a = $1; DELETE FROM t`, []any{1}, ""},
		{`UPDATE t SET a = $1; 'x'`, []any{1}, ""},
		{`SELECT $1000000`, []any{1}, ""},
	} {
		got, ok := interpolate(c.query, c.args)
		if c.want == "" {
			if ok {
				t.Errorf("interpolate(%q, %v) = %q, want it declined", c.query, c.args, got)
			}
			continue
		}
		if !ok || got != c.want {
			t.Errorf("interpolate(%q, %v) = %q, %v; want %q", c.query, c.args, got, ok, c.want)
		}
	}
}

// FuzzInterpolate: whatever the statement, every byte outside the
// placeholders is kept, in order, and a constant is written only where the
// scan saw a placeholder.
func FuzzInterpolate(f *testing.F) {
	for _, q := range []string{`UPDATE t SET a = $1 WHERE b = '$1' -- $1`, `/* $1 */ $1`, `"a""$1" $1;`, `$1`} {
		f.Add(q, "x'y")
	}
	f.Fuzz(func(t *testing.T, query, arg string) {
		got, ok := interpolate(query, []any{arg})
		if !ok {
			return
		}
		constant := " '" + strings.ReplaceAll(arg, "'", "''") + "' "
		i := strings.Index(got, constant)
		if i < 0 {
			t.Fatalf("interpolate(%q, %q) = %q: the constant is missing", query, arg, got)
		}
		rest := got[i+len(constant):]
		j := strings.Index(query, "$1")
		for j >= 0 && query[:j] != got[:i] {
			k := strings.Index(query[j+1:], "$1")
			if k < 0 {
				j = -1
				break
			}
			j += k + 1
		}
		if j < 0 || query[j+2:] != rest {
			t.Fatalf("interpolate(%q, %q) = %q: text outside the placeholder changed", query, arg, got)
		}
	})
}
