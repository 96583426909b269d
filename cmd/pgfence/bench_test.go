package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/bench"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func benchJSON(t *testing.T, out string) bench.CompareJSON {
	t.Helper()
	var res bench.CompareJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, out)
	}
	return res
}

// Every PostgreSQL case runs without errors and its statements are counted
// (a tracer that saw nothing would give 0); the figures themselves are not
// asserted (speed is measured, never tested).
func TestBench(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	code, out, errOut := cli(t, environ, "bench", "compare", "--duration", "100ms", "--warmup", "50ms", "--workers", "2", "--peers", "none", "--json")
	if code != exitOK {
		t.Fatalf("bench: code %d\n%s%s", code, out, errOut)
	}
	res := benchJSON(t, out)
	var want []string
	for _, c := range bench.Cases() {
		if !c.Peer() {
			want = append(want, c.Name)
		}
	}
	if len(res.Results) != len(want) {
		t.Fatalf("%d results, want one per PostgreSQL case (%d): %v", len(res.Results), len(want), want)
	}
	// Statements each operation sends, where the count is fixed.
	perOp := map[string]float64{
		"raw-lock-upsert":   2, // INSERT … ON CONFLICT, UPDATE
		"raw-update":        1,
		"fenced-update":     2, // pgfence.fence + the UPDATE, one batch
		"versioned-update":  1, // one UPDATE … WHERE fence <= token
		"leased-exec":       2, // pgfence.check_lease + the UPDATE, one batch
		"leased-write":      4, // BEGIN, check_lease, UPDATE, COMMIT
		"advisory-lock":     3, // BEGIN, SELECT pg_advisory_xact_lock, COMMIT
		"raw-insert-tx":     3,
		"raw-http-insert":   3, // the handler's BEGIN, INSERT, COMMIT
		"raw-idempotent-tx": 5, // BEGIN + the claim (one batch), INSERT, the completion + COMMIT (one batch)
		"idempotent-tx":     4, // BEGIN with the claim, INSERT, the answer + COMMIT (one batch)
		"idempotent-http":   4, // the same, behind the middleware
		"sql-raw-update":    1,
		"sql-fenced-update": 2, // the same pipeline, through sql.Conn.Raw
		"pq-raw-update":     1, // prepared and run: one Execute
		"pq-fenced-update":  4, // BEGIN, the fence, the UPDATE, COMMIT
	}
	for i, r := range res.Results {
		if r.Case != want[i] || r.Workers != 2 || r.Group == "" || r.What == "" {
			t.Errorf("result %d: %+v, want case %s with 2 workers", i, r, want[i])
		}
		if r.Ops == 0 || r.Errors != 0 || r.Skipped != "" {
			t.Errorf("case %s: %d ops, %d errors (%s), skipped %q", r.Case, r.Ops, r.Errors, r.FirstError, r.Skipped)
		}
		if r.Statements == 0 || r.StatementsPerOp <= 0 || r.StatementsPerS <= 0 {
			t.Errorf("case %s: no statements counted: %+v", r.Case, r)
		}
		// Operations cut off at the end send a few statements more than the
		// completed ones account for: round.
		if n, ok := perOp[r.Case]; ok && math.Round(r.StatementsPerOp) != n {
			t.Errorf("case %s: %.2f statements/op, want %v", r.Case, r.StatementsPerOp, n)
		}
	}
	if !strings.Contains(errOut, "[1/") || !strings.Contains(errOut, "raw-update, 2 workers") {
		t.Errorf("no progress on stderr:\n%s", errOut)
	}
	if res.WarmupMS != 50 {
		t.Errorf("warmup_ms = %v, want the 50ms of --warmup", res.WarmupMS)
	}
	if len(res.Comparisons) == 0 || !strings.Contains(res.Settings, "fsync=") {
		t.Errorf("comparisons %q, settings %q", res.Comparisons, res.Settings)
	}
	// leases-service made a login role of its own; roles outlive databases,
	// so the bench must have dropped it.
	var roles int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_roles WHERE rolname LIKE 'pgfence\_bench\_service\_%'`).Scan(&roles); err != nil || roles != 0 {
		t.Errorf("%d service roles left behind (%v)", roles, err)
	}

	code, out, errOut = cli(t, environ, "bench", "compare", "--duration", "100ms", "--warmup", "0s", "--workers", "1", "--cases", "raw-update,leases")
	if code != exitOK {
		t.Fatalf("bench text: code %d\n%s%s", code, out, errOut)
	}
	for _, s := range []string{"CASE", "OPS/S", "P50 MS", "P99 MS", "STMTS/OP", "raw-update", "leases", "leases.Client TryAcquire", "fsync="} {
		if !strings.Contains(out, s) {
			t.Errorf("text output lacks %q:\n%s", s, out)
		}
	}

	for _, args := range [][]string{
		{"bench", "compare", "--cases", "nope"},
		{"bench", "compare", "--peers", "etcd"},
		{"bench", "compare", "--workers", "0"},
		{"bench", "compare", "--rounds", "0"},
		{"bench", "compare", "--rounds", "21"},
		{"bench", "compare", "--warmup", "-1s"},
		{"bench", "compare", "--warmup", "11m"},
		{"bench", "compare", "--rtt", "-1ms", "--peers", "none"},
		{"bench", "compare", "--rtt", "101ms", "--peers", "none"},
		{"bench", "compare", "--rtt", "1ms"}, // the Redis peers would not be delayed
		{"bench", "curves", "--warmup", "-1s"},
		{"bench", "curves", "--curves", "nope"},
		{"bench", "curves", "--max-rows", "lots"},
		{"bench", "curves", "--max-rows", "999"},
		{"bench", "curves", "--max-keys", "0"},
		{"bench", "curves", "--max-resources", "0"},
		{"bench", "curves", "--cycles", "0"},
		{"bench", "curves", "--election-ttl", "500ms"},
		{"bench", "curves", "--failovers", "0"},
		{"bench", "curves", "--max-followers", "257"},
		{"bench", "curves", "--idle-window", "0s"},
		{"bench", "compare", "--database-url", "postgres://app@127.0.0.1:notaport/x"},
		{"bench", "compare", "--database-url", "postgres://app@127.0.0.1/x", "--connect-timeout", "0s"},
	} {
		if code, _, errOut := cli(t, environ, args...); code != exitUsage {
			t.Errorf("%q: code %d, want usage error\n%s", args, code, errOut)
		}
	}
	// An unreachable server is explained as by every command (and within
	// --connect-timeout, which bench used to ignore).
	for _, args := range [][]string{{"bench", "compare"}, {"bench", "curves"}} {
		args = append(args, "--database-url", "postgres://app@127.0.0.1:1/x", "--connect-timeout", "2s")
		if code, _, errOut := cli(t, nil, args...); code != exitUnavailable || !strings.Contains(errOut, "cannot reach the database at 127.0.0.1:1") {
			t.Errorf("%q: code %d, want unreachable\n%s", args, code, errOut)
		}
	}
}

// --rtt routes the cases through a proxy that delays every round trip by at
// least that much, and the report says what a round trip took.
func TestBenchRTT(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	code, out, errOut := cli(t, map[string]string{"DATABASE_URL": db.URL},
		"bench", "compare", "--duration", "300ms", "--warmup", "0s", "--workers", "1", "--cases", "raw-update,idempotent-tx", "--peers", "none", "--rtt", "20ms", "--json")
	if code != exitOK {
		t.Fatalf("bench: code %d\n%s%s", code, out, errOut)
	}
	res := benchJSON(t, out)
	if !strings.Contains(res.Settings, "--rtt 20ms: a round trip (SELECT 1, p50) took") {
		t.Errorf("settings %q do not say what a round trip took", res.Settings)
	}
	// raw-update is one round trip, idempotent-tx three (BEGIN with the
	// claim, the insert, the answer with COMMIT): a delay is a minimum.
	for i, trips := range []float64{1, 3} {
		r := res.Results[i]
		if r.Ops == 0 || r.Errors != 0 || float64(r.P50US) < trips*20_000 {
			t.Errorf("case %s: %d ops, %d errors, p50 %d µs; want at least %v round trips of 20ms", r.Case, r.Ops, r.Errors, r.P50US, trips)
		}
	}
}

// --rounds runs every case that many times, interleaved, and reports one
// result per case and concurrency: the median run. Within a round the cases
// run next to each other at one concurrency, in reverse order every other
// round.
func TestBenchRounds(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	code, out, errOut := cli(t, map[string]string{"DATABASE_URL": db.URL},
		"bench", "compare", "--duration", "100ms", "--warmup", "0s", "--workers", "1,2", "--cases", "raw-update,replay", "--rounds", "3", "--peers", "none", "--json")
	if code != exitOK {
		t.Fatalf("bench: code %d\n%s%s", code, out, errOut)
	}
	var res bench.CompareJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Rounds != 3 || len(res.Results) != 4 || res.Results[0].Case != "raw-update" || res.Results[2].Case != "replay" {
		t.Fatalf("rounds %d, results %+v; want 3 rounds and one result per case and concurrency", res.Rounds, res.Results)
	}
	var order []string
	label := regexp.MustCompile(`\[(\d+)/12\] (\S+), (\d+) workers, round (\d+)/3`)
	for _, m := range label.FindAllStringSubmatch(errOut, -1) {
		if step, _ := strconv.Atoi(m[1]); step == len(order)+1 {
			order = append(order, m[2]+"@"+m[3]+"#"+m[4])
		}
	}
	want := []string{
		"raw-update@1#1", "replay@1#1", "raw-update@2#1", "replay@2#1",
		"replay@1#2", "raw-update@1#2", "replay@2#2", "raw-update@2#2",
		"raw-update@1#3", "replay@1#3", "raw-update@2#3", "replay@2#3",
	}
	if !slices.Equal(order, want) {
		t.Errorf("runs in the order %v, want %v\n%s", order, want, errOut)
	}
}

// Without the peer program the Redis rows say "skipped" and why; nothing is
// measured in their place.
func TestBenchPeerMissing(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL, bench.PeerEnv: filepath.Join(t.TempDir(), "no-such-peer")}
	code, out, errOut := cli(t, environ, "bench", "compare", "--duration", "100ms", "--warmup", "0s", "--workers", "1", "--cases", "raw-update,redis-durable,redis-memory", "--json")
	if code != exitOK {
		t.Fatalf("bench: code %d\n%s%s", code, out, errOut)
	}
	res := benchJSON(t, out)
	if len(res.Results) != 3 || res.Results[0].Ops == 0 {
		t.Fatalf("%+v", res.Results)
	}
	for _, r := range res.Results[1:] {
		if !strings.Contains(r.Skipped, "no-such-peer") || r.Ops != 0 || r.OpsPerS != 0 || !strings.HasPrefix(r.Case, "redis-") {
			t.Errorf("peer row %+v, want skipped naming the missing binary", r)
		}
	}
	code, out, _ = cli(t, environ, "bench", "compare", "--duration", "100ms", "--warmup", "0s", "--workers", "1", "--cases", "redis-memory")
	if code != exitOK || !strings.Contains(out, "skipped") || !strings.Contains(out, "no-such-peer") {
		t.Fatalf("text: code %d\n%s", code, out)
	}
}

// The peer, built from cmd/pgfence/internal/benchpeer, measures Redis in the same run:
// two commands (SET NX PX, the compare-and-delete script) per operation.
func TestBenchRedisPeer(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if _, err := os.Stat("/usr/bin/redis-server"); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("redis-server not found; CI must install it")
			}
			t.Skip("redis-server not found")
		}
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the peer")
	}
	bin := filepath.Join(t.TempDir(), bench.PeerBinary)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, ".")
	build.Dir = filepath.Join("..", "..", bench.PeerDir)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build the peer: %v\n%s", err, out)
	}
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL, bench.PeerEnv: bin}
	code, out, errOut := cli(t, environ, "bench", "compare", "--duration", "100ms", "--warmup", "0s", "--workers", "2", "--cases", "redis-durable,redis-memory,leases", "--json")
	if code != exitOK {
		t.Fatalf("bench: code %d\n%s%s", code, out, errOut)
	}
	res := benchJSON(t, out)
	for _, r := range res.Results {
		if r.Skipped != "" || r.Ops == 0 || r.Errors != 0 || r.Workers != 2 {
			t.Errorf("%+v", r)
		}
		if strings.HasPrefix(r.Case, "redis-") && math.Round(r.StatementsPerOp) != 2 {
			t.Errorf("%s: %.2f commands/op, want 2", r.Case, r.StatementsPerOp)
		}
	}
	if !strings.Contains(strings.Join(res.Comparisons, "\n"), "durable Redis") {
		t.Errorf("no comparison with durable Redis: %q", res.Comparisons)
	}
}

// A tiny run of every curve but the election's: each point measured with
// statements counted, the churn read back from the statistics.
func TestBenchCurves(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	code, out, errOut := cli(t, environ, "bench", "curves", "--curves", "rows,keys,resources,waiters,churn", "--duration", "100ms", "--warmup", "0s", "--workers", "2",
		"--max-rows", "1e3", "--max-keys", "1e4", "--max-resources", "10", "--max-waiters", "2", "--cycles", "200", "--json")
	if code != exitOK {
		t.Fatalf("bench curves: code %d\n%s%s", code, out, errOut)
	}
	var res bench.CurvesJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench curves --json: %v\n%s", err, out)
	}
	var got []string
	for _, p := range res.Points {
		got = append(got, p.Curve+"="+strconv.FormatInt(p.X, 10))
		if p.Ops == 0 || p.Errors != 0 || p.StatementsPerOp <= 0 {
			t.Errorf("point %s=%d: %+v", p.Curve, p.X, p.ResultJSON)
		}
	}
	want := "floor-acquire-vs-lock-rows=1000 acquire-vs-lease-rows=1000 claim-vs-keys=10000 floor-write-vs-fence-rows=1 fenced-write-vs-resources=1 floor-write-vs-fence-rows=10 fenced-write-vs-resources=10 hot-key-waiters=1 hot-key-waiters=2"
	if strings.Join(got, " ") != want {
		t.Errorf("points %s\nwant   %s", strings.Join(got, " "), want)
	}
	if v := strings.Join(res.Comparisons, "\n"); !strings.Contains(v, "hand-off p50 by waiters") || !strings.Contains(v, "churn: pgfence.leases went from") {
		t.Errorf("comparisons:\n%s", v)
	}
	c := res.Churn
	if c == nil || c.Cycles != 200 || c.Keys != 1000 || c.After.Updates <= c.Before.Updates || c.After.TotalBytes == 0 || c.Before.LiveTuples < 1000 {
		t.Errorf("churn %+v", c)
	}
	// Off a terminal, the churn reports its progress in lines.
	if !strings.Contains(errOut, " of 200 cycles (") {
		t.Errorf("no churn progress on stderr:\n%s", errOut)
	}
	var left int
	if err := db.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM pgfence.leases WHERE key LIKE 'bench-curve/%') + (SELECT count(*) FROM pgfence.idempotency_keys WHERE scope = 'bench-curve')`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d curve rows left behind (%v)", left, err)
	}
}

// The election curves, small: two kills of the leader, each followed by a
// new leader within the TTL and a second or so (a generous bound: the
// machine may be busy), and the statements of 1 and 4 idle followers, the
// leader's counted apart.
func TestBenchElectionCurves(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	code, out, errOut := cli(t, environ, "bench", "curves", "--curves", "failover,followers", "--election-ttl", "1s", "--failovers", "2",
		"--max-followers", "4", "--idle-window", "1s", "--json")
	if code != exitOK {
		t.Fatalf("bench curves: code %d\n%s%s", code, out, errOut)
	}
	var res bench.CurvesJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench curves --json: %v\n%s", err, out)
	}
	var got []string
	for _, p := range res.Points {
		got = append(got, p.Curve+"="+strconv.FormatInt(p.X, 10))
		switch p.Curve {
		case "election-failover":
			if p.Ops != 2 || p.Errors != 0 || p.P99US > (1000+5000)*1000 || p.Statements == 0 {
				t.Errorf("failover point: %+v", p.ResultJSON)
			}
		case "idle-followers-leader":
			if p.Statements == 0 { // the leader renews every TTL/3
				t.Errorf("the leader sent no statement in a second: %+v", p.ResultJSON)
			}
		}
	}
	want := "election-failover=1000 idle-followers=1 idle-followers-leader=1 idle-followers=4 idle-followers-leader=4"
	if strings.Join(got, " ") != want {
		t.Errorf("points %s\nwant   %s", strings.Join(got, " "), want)
	}
	if v := strings.Join(res.Comparisons, "\n"); !strings.Contains(v, "leader failover after a kill, TTL 1s") || !strings.Contains(v, "idle followers, statements/s") {
		t.Errorf("comparisons:\n%s", v)
	}
	if !strings.Contains(errOut, "kill 2: bench-replica-") {
		t.Errorf("no failover progress on stderr:\n%s", errOut)
	}
	var left int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgfence.leases WHERE key LIKE 'bench-curve/%'`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d election rows left behind (%v)", left, err)
	}
}

// The retention curve on a throwaway cluster: one-off resources in ten
// cycles, each followed by the maintenance, leave no rows behind and the
// tables no larger; on a database of the caller's it refuses to run.
func TestBenchRetentionCurve(t *testing.T) {
	t.Parallel()
	code, out, errOut := cli(t, nil, "bench", "curves", "--curves", "retention", "--one-off", "2000", "--json")
	if code != exitOK {
		t.Fatalf("bench curves --curves retention: code %d\n%s%s", code, out, errOut)
	}
	var res bench.CurvesJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench curves --json: %v\n%s", err, out)
	}
	r := res.Retention
	if r == nil || r.Resources != 2000 || len(r.Cycles) != 10 {
		t.Fatalf("retention %+v, want 2000 resources in 10 cycles", r)
	}
	for i, c := range r.Cycles {
		// Each cycle's 200 keys: a lease row and a fence row each.
		if c.Resources != int64(200*(i+1)) || c.Rows != 400 || c.RowsAfter != 0 || c.BytesAfter == 0 {
			t.Errorf("cycle %d: %+v, want 400 rows before the maintenance and none after", i, c)
		}
	}
	if first, last := r.Cycles[0], r.Cycles[len(r.Cycles)-1]; last.BytesAfter > 2*first.BytesAfter {
		t.Errorf("tables grew from %d to %d bytes over the cycles", first.BytesAfter, last.BytesAfter)
	}
	if v := strings.Join(res.Comparisons, "\n"); !strings.Contains(v, "one-off resources: pgfence's tables") {
		t.Errorf("comparisons:\n%s", v)
	}

	db := pgfencetest.NewDatabase(t)
	code, _, errOut = cli(t, map[string]string{"DATABASE_URL": db.URL}, "bench", "curves", "--curves", "retention", "--one-off", "100")
	if code == exitOK || !strings.Contains(errOut, "runs on the throwaway cluster only") {
		t.Errorf("the retention curve on --database-url: code %d\n%s", code, errOut)
	}
}
