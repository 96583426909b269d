package migrations_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/pyclient"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// sqlBatch calls pgfence.lease_batch with one array per argument, as an SQL
// client would.
const sqlBatch = `SELECT ord, ok, holder::text, token, status, coalesce(sqlstate, ''), coalesce(message, '')
  FROM pgfence.lease_batch($1::text[], $2::text[], $3::interval[], $4::text[], $5::uuid[], $6::bigint[],
                           $7::boolean[], $8::text[], 'test', false, true)`

type batchRow struct {
	ord      int32
	ok       *bool
	holder   *string
	token    *int64
	status   *string
	sqlstate string
	message  string
}

// Each element of a lease batch is the function it names, with that
// function's checks, for the role that calls it: a service role's batch
// gets PF014 for a key outside its prefix, PF011 for a paused one, PF008
// for bad arguments, each on that element's row only; the other elements
// commit, and the failing ones write nothing. Releases and grants of one key
// run in the order given; each element's lease events carry its own trace id.
func TestLeaseBatchElementsFailAlone(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name, svc := loginRole(t, db, "pgfence_app")
	if _, err := pgfence.RevokePrefix(ctx, db.Pool, name, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.GrantPrefix(ctx, db.Pool, name, "svc/"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.pause_grants('svc/paused/', 'test')`); err != nil {
		t.Fatal(err)
	}
	var heldBy string
	var heldToken int64
	if err := svc.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.try_acquire('svc/held', interval '1 minute')`).Scan(&heldBy, &heldToken); err != nil {
		t.Fatal(err)
	}

	const (
		traceA = "0af7651916cd43dd8448eb211c80319c"
		traceC = "4bf92f3577b34da6a3ce929d0e0e4736"
	)
	run := func(ops, keys, ttls, holders []string, tokens []int64, traces []string) []batchRow {
		t.Helper()
		n := len(ops)
		infos, announce := make([]string, n), make([]bool, n)
		rows, err := svc.Query(ctx, sqlBatch, ops, keys, ttls, infos, holders, tokens, announce, traces)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []batchRow
		for rows.Next() {
			var r batchRow
			if err := rows.Scan(&r.ord, &r.ok, &r.holder, &r.token, &r.status, &r.sqlstate, &r.message); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(out) != n {
			t.Fatalf("%d rows for %d elements", len(out), n)
		}
		for i, r := range out {
			if int(r.ord) != i+1 {
				t.Fatalf("row %d has ord %d", i, r.ord)
			}
		}
		return out
	}
	uuid := func(i int) string { return "00000000-0000-4000-8000-00000000000" + string(rune('0'+i)) }

	out := run(
		[]string{"acquire", "acquire", "acquire", "acquire", "acquire", "acquire", "steal"},
		[]string{"svc/a", "svc/held", "other/x", "svc/paused/1", "svc/b", "svc/c", "svc/d"},
		[]string{"1 minute", "1 minute", "1 minute", "1 minute", "0 seconds", "1 minute", "1 minute"},
		[]string{uuid(1), uuid(2), uuid(3), uuid(4), uuid(5), uuid(6), uuid(7)},
		make([]int64, 7),
		[]string{traceA, "", "", "", "", traceC, ""},
	)
	want := []struct {
		ok       bool
		sqlstate string
	}{{true, ""}, {false, ""}, {false, pgerr.CodeNotGranted}, {false, pgerr.CodeGrantsPaused}, {false, pgerr.CodeInvalid}, {true, ""}, {false, pgerr.CodeInvalid}}
	for i, w := range want {
		r := out[i]
		if r.sqlstate != w.sqlstate || (r.ok != nil && *r.ok) != w.ok || (r.sqlstate != "") != (r.ok == nil) {
			t.Errorf("element %d: ok %v sqlstate %q (%s); want ok %v sqlstate %q", i+1, r.ok, r.sqlstate, r.message, w.ok, w.sqlstate)
		}
		if w.ok && (r.holder == nil || *r.holder != uuid(i+1) || r.token == nil) {
			t.Errorf("element %d granted: holder %v token %v, want holder %s and a token", i+1, r.holder, r.token, uuid(i+1))
		}
	}
	if !strings.Contains(out[6].message, "'acquire' or 'release'") {
		t.Errorf("unknown element kind: %q", out[6].message)
	}
	var stray int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE key IN ('other/x', 'svc/paused/1', 'svc/b', 'svc/d')`).Scan(&stray); err != nil || stray != 0 {
		t.Errorf("rows of the failed elements: %d, %v; want none", stray, err)
	}
	for key, trace := range map[string]string{"svc/a": traceA, "svc/c": traceC} {
		var got string
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce(trace_id, '') FROM pgfence.lease_events WHERE key = $1 AND event = 'acquired'`, key).Scan(&got); err != nil || got != trace {
			t.Errorf("trace id of the grant of %s: %q, %v; want %q", key, got, err, trace)
		}
	}

	// Release then grant the same key in one batch; a release with another
	// grant's token changes nothing.
	tokA := *out[0].token
	out = run(
		[]string{"release", "acquire", "release"},
		[]string{"svc/a", "svc/a", "svc/held"},
		[]string{"0 seconds", "1 minute", "0 seconds"},
		[]string{uuid(1), uuid(8), heldBy},
		[]int64{tokA, 0, heldToken + 1},
		[]string{"", "", ""},
	)
	if out[0].ok == nil || !*out[0].ok || out[0].status == nil || *out[0].status != "released" {
		t.Errorf("release of svc/a: %+v", out[0])
	}
	if out[1].ok == nil || !*out[1].ok || out[1].token == nil || *out[1].token <= tokA {
		t.Errorf("grant of svc/a after its release in the same batch: %+v (previous token %d)", out[1], tokA)
	}
	if out[2].ok == nil || *out[2].ok || out[2].status == nil || *out[2].status != "not_held" {
		t.Errorf("release of svc/held with a wrong token: %+v", out[2])
	}

	// A malformed batch is refused as a whole.
	for what, q := range map[string]string{
		"arrays of different lengths": `SELECT * FROM pgfence.lease_batch(ARRAY['acquire'], ARRAY['svc/e', 'svc/f'], ARRAY[interval '1 minute'], ARRAY[''], ARRAY[gen_random_uuid()], ARRAY[0::bigint], ARRAY[false], ARRAY[''], 'test', false, false)`,
		"more than 1000 elements": `SELECT * FROM pgfence.lease_batch(array_fill('acquire'::text, ARRAY[1001]), array_fill('svc/g'::text, ARRAY[1001]), array_fill(interval '1 minute', ARRAY[1001]),
			array_fill(''::text, ARRAY[1001]), array_fill(gen_random_uuid(), ARRAY[1001]), array_fill(0::bigint, ARRAY[1001]), array_fill(false, ARRAY[1001]), array_fill(''::text, ARRAY[1001]), 'test', false, false)`,
	} {
		_, err := svc.Exec(ctx, q)
		if pgerr.Code(err) != pgerr.CodeInvalid {
			t.Errorf("%s: %v, want PF008", what, err)
		}
	}
}

// A Python client (psycopg2, which runs every statement in a transaction it
// opened) takes and releases leases in batches and commits: the grants hold
// after its commit, and a refused element leaves the rest of its transaction
// usable.
func TestLeaseBatchFromPsycopg2(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	script := `
import sys, uuid, psycopg2
conn = psycopg2.connect(sys.argv[1])
cur = conn.cursor()
h1, h2 = str(uuid.uuid4()), str(uuid.uuid4())
cur.execute("""SELECT ord, ok, token, coalesce(sqlstate, '') FROM pgfence.lease_batch(
    %s, %s, %s::interval[], %s, %s::uuid[], %s::bigint[], %s, %s, 'py', false, false)""",
    (['acquire', 'acquire', 'acquire'], ['py/a', 'py/b', 'py/c'], ['1 minute', '-1 second', '1 minute'],
     ['', '', ''], [h1, str(uuid.uuid4()), h2], [0, 0, 0], [False, False, False], ['', '', '']))
rows = cur.fetchall()
for r in rows:
    print("grant", r[0], r[1], r[3])
cur.execute("SELECT 1")  # the transaction is still usable
conn.commit()
tok1 = [r for r in rows if r[0] == 1][0][2]
cur.execute("""SELECT ok, status FROM pgfence.lease_batch(
    %s, %s, %s::interval[], %s, %s::uuid[], %s::bigint[], %s, %s, 'py', false, false)""",
    (['release'], ['py/a'], ['0 seconds'], [''], [h1], [tok1], [False], ['']))
print("release", *cur.fetchone())
conn.commit()
`
	lines := pyclient.Run(t, db.URL, script)
	want := []string{"grant 1 True ", "grant 2 None PF008", "grant 3 True ", "release True released"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("psycopg2 printed\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	var live []string
	rows, err := db.Pool.Query(context.Background(), `SELECT key FROM pgfence.lease_status WHERE live AND key LIKE 'py/%' ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		_ = rows.Scan(&k)
		live = append(live, k)
	}
	if rows.Err() != nil || strings.Join(live, ",") != "py/c" {
		t.Errorf("live leases after the Python client's commits: %v, %v; want py/c", live, rows.Err())
	}
}
