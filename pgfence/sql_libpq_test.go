package pgfence_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// On lib/pq, ExecSQL runs BEGIN, the check, the statement and COMMIT, and
// WriteSQL the check and fn in its transaction. A resource name that a
// careless literal would break (quotes, backslashes, "$1", non-ASCII) is
// fenced as itself, also with standard_conforming_strings off; and a refused
// or failed write never leaves its connection inside a transaction: the
// single connection of the pool then commits a plain INSERT that another
// connection sees.
func TestLibPQWrites(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	mustExec(t, db.Pool, `CREATE TABLE notes (resource text, body text)`)
	sdb := openDB(t, "postgres", db.URL)
	sdb.SetMaxOpenConns(1)
	sdb.SetMaxIdleConns(1)
	committed := func(what string) {
		t.Helper()
		if _, err := sdb.ExecContext(ctx, `INSERT INTO notes VALUES ('probe', $1)`, what); err != nil {
			t.Fatalf("after %s: %v", what, err)
		}
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM notes WHERE resource = 'probe' AND body = $1`, what).Scan(&n); err != nil || n != 1 {
			t.Fatalf("after %s the connection's next INSERT is not visible to another connection (%d, %v): left inside a transaction", what, n, err)
		}
	}

	for _, resource := range []string{`it's`, `back\slash\'`, `$1 $2 $3`, `E'x'); DROP TABLE notes; --`, "grüße/東京"} {
		pgfencetest.IssueToken(t, db.Pool, resource, 7)
		for _, conforming := range []string{"on", "off"} {
			if _, err := sdb.ExecContext(ctx, `SET standard_conforming_strings = `+conforming); err != nil {
				t.Fatal(err)
			}
			if _, err := pgfence.ExecSQL(ctx, sdb, pgfence.LeaseOf(resource, "", 7), `INSERT INTO notes VALUES ($1, $2)`, resource, conforming); err != nil {
				t.Fatalf("fenced write of %q (standard_conforming_strings %s): %v", resource, conforming, err)
			}
			if _, err := pgfence.WriteSQL(ctx, sdb, pgfence.LeaseOf(resource, "", 7), func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO notes VALUES ($1, $2)`, resource, "Write, "+conforming)
				return err
			}); err != nil {
				t.Fatalf("fenced Write of %q (standard_conforming_strings %s): %v", resource, conforming, err)
			}
		}
		var token int64
		if err := db.Pool.QueryRow(ctx, `SELECT token FROM pgfence.fences WHERE resource = $1`, resource).Scan(&token); err != nil || token != 7 {
			t.Fatalf("fence row of %q: token %d, %v; want 7", resource, token, err)
		}
	}

	// A stale token: refused by the check, the write not made.
	if _, err := pgfence.ExecSQL(ctx, sdb, pgfence.LeaseOf(`it's`, "", 6), `INSERT INTO notes VALUES ('stale', '')`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("stale token: %v, want ErrStaleToken", err)
	}
	committed("a refused check")
	called := false
	if _, err := pgfence.WriteSQL(ctx, sdb, pgfence.LeaseOf(`it's`, "", 6), func(context.Context, *sql.Tx) error { called = true; return nil }); !errors.Is(err, pgfence.ErrStaleToken) || called {
		t.Fatalf("stale token through Write: %v (fn called: %v), want ErrStaleToken and fn not called", err, called)
	}
	committed("a check refused in Write")
	// The statement fails after the check passed: rolled back, fence included.
	if _, err := pgfence.ExecSQL(ctx, sdb, pgfence.LeaseOf(`it's`, "", 8), `INSERT INTO no_such_table VALUES (1)`); err == nil {
		t.Fatal("a write into a missing table succeeded")
	}
	committed("a failed statement")
	var token int64
	if err := db.Pool.QueryRow(ctx, `SELECT token FROM pgfence.fences WHERE resource = 'it''s'`).Scan(&token); err != nil || token != 7 {
		t.Fatalf("after the failed write the fence holds %d (%v), want 7: its token was rolled back with it", token, err)
	}
	// A lease that does not hold: the lease-checked ExecSQL's check refuses.
	if _, err := pgfence.ExecSQL(ctx, sdb, pgfence.Checked(pgfence.LeaseOf(`it's`, "3b241101-e2bb-4255-8caf-4136c566a962", 7)), `INSERT INTO notes VALUES ('leased', '')`); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("lease-checked write without the lease: %v, want ErrLeaseLost", err)
	}
	committed("a refused lease check")
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM notes WHERE resource IN ('stale', 'leased')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused writes left %d rows (%v)", n, err)
	}
}
