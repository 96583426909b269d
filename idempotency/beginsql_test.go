package idempotency

import (
	"context"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The values of the claim sent with BEGIN are spelled in hex; each must come
// back exactly and with the default collation, or the claim's lookup could
// not use the key's index and would scan the whole table.
func TestBeginSQLValues(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	for _, s := range []string{"k", `it's`, `back\slash`, `$$`, "键🔑", "line\nbreak", strings.Repeat("z", MaxKeyBytes)} {
		var b strings.Builder
		b.WriteString("SELECT ")
		writeText(&b, s)
		b.WriteString(", pg_catalog.pg_collation_for(")
		writeText(&b, s)
		b.WriteString("), ")
		writeBytea(&b, []byte(s))
		var got, collation string
		var raw []byte
		if err := pool.QueryRow(context.Background(), b.String()).Scan(&got, &collation, &raw); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if got != s || string(raw) != s || collation != `"default"` {
			t.Fatalf("%q came back as %q (bytea %q), collation %s, want itself with \"default\"", s, got, raw, collation)
		}
	}
}
