package pgfence_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestLimitsMatchSQL checks the Go limits against the SQL functions other
// clients call: the limit is accepted, one more is refused with PF008.
func TestLimitsMatchSQL(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	probe := func(what string, limit int, sql string, arg func(n int) string) {
		t.Helper()
		for n, ok := range map[int]bool{limit: true, limit + 1: false} {
			// In a transaction rolled back afterwards: nothing stays.
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, sql, arg(n))
				if err == nil {
					return errRollback
				}
				return err
			})
			switch {
			case ok && !errors.Is(err, errRollback):
				t.Errorf("%s of %d (the Go limit): %v, want accepted by SQL", what, n, err)
			case !ok && sqlstate(err) != "PF008":
				t.Errorf("%s of %d: %v, want PF008", what, n, err)
			}
		}
	}
	bytesOf := func(n int) string { return strings.Repeat("é", n/2) + strings.Repeat("r", n%2) }
	chars := func(n int) string { return strings.Repeat("é", n) }
	issue(t, pool, bytesOf(pgfence.MaxResourceLen)) // the longest key's lease issued token 1
	probe("resource bytes", pgfence.MaxResourceLen, `SELECT pgfence.fence($1, 1)`, bytesOf)
	probe("floor reason characters", 1000, `SELECT pgfence.raise_token_floor(0, $1)`, chars)
	// The floor's limit: SQL accepts 2^62 and refuses one more (PF008), and
	// a grant still gets a token above it; RaiseTokenFloor's error is
	// ErrInvalid.
	for floor, ok := range map[int64]bool{1 << 62: true, 1<<62 + 1: false, math.MaxInt64: false} {
		var next int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := pgfence.RaiseTokenFloor(ctx, tx, floor, "limit probe"); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `SELECT pgfence.next_token(NULL)`).Scan(&next); err != nil {
				return err
			}
			return errRollback
		})
		switch {
		case ok && (!errors.Is(err, errRollback) || next != floor+1):
			t.Errorf("floor %d (the limit): %v, next token %d; want accepted, next token %d", floor, err, next, floor+1)
		case !ok && (sqlstate(err) != "PF008" || !errors.Is(err, pgfence.ErrInvalid)):
			t.Errorf("floor %d: %v, want PF008 as ErrInvalid", floor, err)
		}
	}
	// The Go side refuses the same, before any round trip.
	dead, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	for _, resource := range []string{bytesOf(pgfence.MaxResourceLen + 1), "", "a\x00b", "\xff"} {
		if _, err := pgfence.Exec(ctx, dead, pgfence.LeaseOf(resource, "", 1), `SELECT 1`); !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), "resource must be") {
			t.Errorf("Exec with resource %.10q (%d bytes): %v, want ErrInvalid naming resource", resource, len(resource), err)
		}
	}
	if err := pgfence.Protect(ctx, dead, pgx.Identifier{strings.Repeat("t", 64)}, "c", ""); !errors.Is(err, pgfence.ErrInvalid) {
		t.Errorf("Protect with a long name: %v, want ErrInvalid before any round trip", err)
	}
}

var errRollback = errors.New("roll back")
