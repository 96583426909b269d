package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/sqlfence"
)

// On lib/pq, Exec and ExecLeased send the check with the statement as one
// simple query (or BEGIN with the check, when the statement's arguments
// cannot be constants), the check's arguments written as literals, and Write
// sends the check (with the trace's statement) as one inside its transaction. A resource name that a
// careless literal would break (quotes, backslashes, "$1", non-ASCII) is
// fenced as itself, also with standard_conforming_strings off; and a refused
// or failed write never leaves its connection inside a transaction: the
// single connection of the pool then commits a plain INSERT that another
// connection sees.
func TestLibPQSimpleHead(t *testing.T) {
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
			if _, err := sqlfence.ExecToken(ctx, sdb, resource, 7, `INSERT INTO notes VALUES ($1, $2)`, resource, conforming); err != nil {
				t.Fatalf("fenced write of %q (standard_conforming_strings %s): %v", resource, conforming, err)
			}
			if _, err := sqlfence.WriteToken(ctx, sdb, resource, 7, func(ctx context.Context, tx *sql.Tx) error {
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
	if _, err := sqlfence.ExecToken(ctx, sdb, `it's`, 6, `INSERT INTO notes VALUES ('stale', '')`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("stale token: %v, want ErrStaleToken", err)
	}
	committed("a refused check")
	called := false
	if _, err := sqlfence.WriteToken(ctx, sdb, `it's`, 6, func(context.Context, *sql.Tx) error { called = true; return nil }); !errors.Is(err, pgfence.ErrStaleToken) || called {
		t.Fatalf("stale token through Write: %v (fn called: %v), want ErrStaleToken and fn not called", err, called)
	}
	committed("a check refused in Write")
	// The statement fails after the check passed: rolled back, fence included.
	if _, err := sqlfence.ExecToken(ctx, sdb, `it's`, 8, `INSERT INTO no_such_table VALUES (1)`); err == nil {
		t.Fatal("a write into a missing table succeeded")
	}
	committed("a failed statement")
	var token int64
	if err := db.Pool.QueryRow(ctx, `SELECT token FROM pgfence.fences WHERE resource = 'it''s'`).Scan(&token); err != nil || token != 7 {
		t.Fatalf("after the failed write the fence holds %d (%v), want 7: its token was rolled back with it", token, err)
	}
	// A lease that does not hold: ExecLeased's check refuses.
	if _, err := sqlfence.ExecLeased(ctx, sdb, pgfence.LeaseOf(`it's`, "3b241101-e2bb-4255-8caf-4136c566a962", 7), `INSERT INTO notes VALUES ('leased', '')`); !errors.Is(err, pgfence.ErrLeaseNotHeld) {
		t.Fatalf("lease-checked write without the lease: %v, want ErrLeaseNotHeld", err)
	}
	committed("a refused lease check")
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM notes WHERE resource IN ('stale', 'leased')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused writes left %d rows (%v)", n, err)
	}
}

// On lib/pq, Exec writes the statement's arguments as constants and sends it
// with the check as one simple query — one round trip, one implicit
// transaction — when the constants are certain to mean what lib/pq's
// parameters mean. Every value below is written once through lib/pq's
// parameters and once through ExecToken into columns of many types: the rows
// are equal, and a value a column refuses is refused with the same SQLSTATE.
// A proxy counts what reaches the server: one simple query and nothing else,
// and the usual statements for arguments that cannot be constants.
func TestLibPQConstants(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	mustExec(t, db.Pool, `CREATE TABLE vals (id int, i4 int4, i8 int8, num numeric, f8 float8, f4 float4, t text,
		vc varchar(8), b bool, j jsonb, u uuid, ba bytea, arr text[], iv interval, d date)`)
	url, proxy := proxiedURL(t, db)
	sdb := openDB(t, "postgres", url)
	sdb.SetMaxOpenConns(1)
	pgfencetest.IssueToken(t, db.Pool, "vals", 3)

	const insert = `INSERT INTO vals VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`
	var noText *string
	three := int16(3)
	rows := [][]any{
		{int64(-2147483648), int64(math.MaxInt64), "123.4500", 0.1, float32(0.1), "it's $1 -- /* grüße", "short", true,
			`{"a": [1, "$2"]}`, "3b241101-e2bb-4255-8caf-4136c566a962", "plain bytes", "{a,\"b c\",NULL}", "1 day 02:03:04", "2026-12-03"},
		{three, uint32(7), math.Pi, math.Inf(1), math.NaN(), "", "", false, `[]`, nil, "", "{}", "-1 year", "infinity"},
		{nil, nil, nil, math.Inf(-1), float32(math.Inf(1)), noText, nil, "yes", nil, nil, nil, nil, nil, nil},
		{"42", "-0", "1e400", "1e-5", "-0", "''", "x'y", "0", `"s"`, "3B241101E2BB42558CAF4136C566A962", "E'\x01'", "{{1,2},{3,4}}", "P1Y2M", "epoch"},
	}
	for i, r := range rows {
		args := append([]any{2 * i}, r...)
		if _, err := sdb.ExecContext(ctx, insert, args...); err != nil {
			t.Fatalf("row %d through lib/pq's parameters: %v", i, err)
		}
		sent := countRequests(proxy)
		args[0] = 2*i + 1
		if _, err := sqlfence.ExecToken(ctx, sdb, "vals", 3, insert, args...); err != nil {
			t.Fatalf("row %d through ExecToken: %v", i, err)
		}
		if s, q := sent(); s != 0 || q != 1 {
			t.Errorf("row %d: ExecToken sent %d Syncs and %d simple queries, want one simple query", i, s, q)
		}
		var same bool
		if err := db.Pool.QueryRow(ctx, `SELECT (a.i4, a.i8, a.num, a.f8, a.f4, a.t, a.vc, a.b, a.j, a.u, a.ba, a.arr, a.iv, a.d)
			IS NOT DISTINCT FROM (b.i4, b.i8, b.num, b.f8, b.f4, b.t, b.vc, b.b, b.j, b.u, b.ba, b.arr, b.iv, b.d)
			FROM vals a, vals b WHERE a.id = $1 AND b.id = $1 + 1`, 2*i).Scan(&same); err != nil || !same {
			t.Errorf("row %d: the row written by ExecToken differs from lib/pq's (%v)", i, err)
		}
	}

	// The result is the statement's, not the check's (whose SELECT returns
	// one row): an UPDATE of every row, and of none.
	for _, c := range []struct {
		where string
		want  int64
	}{{"id >= $1", int64(2 * len(rows))}, {"id < $1", 0}} {
		r, err := sqlfence.ExecToken(ctx, sdb, "vals", 3, `UPDATE vals SET t = t WHERE `+c.where, 0)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := r.RowsAffected(); err != nil || n != c.want {
			t.Errorf("UPDATE … WHERE %s: %d rows affected (%v), want %d", c.where, n, err, c.want)
		}
	}

	// Refused values: the same SQLSTATE either way, and nothing written.
	for _, c := range []struct {
		query string
		arg   any
	}{
		{`INSERT INTO vals (id, i4) VALUES (-1, $1)`, "abc"},
		{`INSERT INTO vals (id, i4) VALUES (-1, $1)`, int64(math.MaxInt64)},
		{`INSERT INTO vals (id, vc) VALUES (-1, $1)`, "longer than eight"},
		{`INSERT INTO vals (id, u) VALUES (-1, $1)`, "not-a-uuid"},
		{`INSERT INTO vals (id, i4) VALUES (-1, $1::int + 'x')`, 1},
	} {
		_, plain := sdb.ExecContext(ctx, c.query, c.arg)
		_, fenced := sqlfence.ExecToken(ctx, sdb, "vals", 3, c.query, c.arg)
		if plain == nil || fenced == nil || pgerr.Code(plain) != pgerr.Code(fenced) {
			t.Errorf("%s with %v: lib/pq says %v, ExecToken %v", c.query, c.arg, plain, fenced)
		}
	}

	// Arguments that cannot be constants take the statements with arguments;
	// the write is the same.
	sent := countRequests(proxy)
	if _, err := sqlfence.ExecToken(ctx, sdb, "vals", 3, `INSERT INTO vals (id, ba, d) VALUES (-2, $1, $2)`, []byte{0, 1}, time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	if s, q := sent(); s+q < 2 {
		t.Errorf("bytes and a time went in %d requests; the count cannot tell one path from the other", s+q)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM vals WHERE id = -2 AND ba = '\x0001' AND d = '2026-12-03'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the write with bytes and a time: %d rows (%v)", n, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM vals WHERE id = -1`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused writes left %d rows (%v)", n, err)
	}
}

// countRequests starts counting the requests that reach the server through
// p: simple queries and Syncs (each closing extended-protocol messages). The
// function it returns stops and gives both counts.
func countRequests(p *faultproxy.Proxy) func() (syncs, queries int) {
	var s, q atomic.Int64
	trigger := p.CutBefore(func(m faultproxy.Message) bool {
		switch m.Type {
		case 'S':
			s.Add(1)
		case 'Q':
			q.Add(1)
		}
		return false
	})
	return func() (int, int) {
		trigger.Cancel()
		return int(s.Load()), int(q.Load())
	}
}
