package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/demo"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The demo runs the critical experiment with a real OS process frozen by
// SIGSTOP; it must report every guarantee held and the reconciled final state.
func TestDemo(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	// Twice on the same database: accepted tokens, lease rows and
	// idempotency keys outlive a run, and the second run must not trip on
	// the first's.
	for run := 1; run <= 2; run++ {
		checkDemoRun(t, db, environ, run)
	}
	if code, _, errOut := cli(t, environ, "demo", "--ttl", "1ms"); code != exitUsage || !strings.Contains(errOut, "--ttl") {
		t.Fatalf("demo --ttl 1ms: code %d, %s", code, errOut)
	}
}

// checkDemoRun runs the demo on db and checks its report.
func checkDemoRun(t *testing.T, db *pgfencetest.Database, environ map[string]string, run int) {
	t.Helper()
	code, out, errOut := cli(t, environ, "demo", "--json", "--ttl", "300ms")
	if code != exitOK {
		t.Fatalf("demo run %d: code %d\n%s\n%s", run, code, out, errOut)
	}
	var rep demo.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("demo --json output: %v\n%s", err, out)
	}
	for _, ev := range rep.Timeline {
		t.Logf("%s %s %s %s", ev.At.Format("15:04:05.000"), ev.Actor, ev.Action, ev.Result)
	}
	if !rep.OK || len(rep.Checks) != 7 {
		t.Fatalf("demo report: ok=%v, %d checks: %+v", rep.OK, len(rep.Checks), rep.Checks)
	}
	for _, c := range rep.Checks {
		if !c.Held {
			t.Errorf("guarantee broken: %+v", c)
		}
	}
	if rep.Final.Quantity != demo.Initial-3 || rep.Final.Orders != 1 || !strings.HasPrefix(rep.Final.LastWriter, "B") {
		t.Fatalf("final state %+v", rep.Final)
	}
	var rejected int
	for _, ev := range rep.Timeline {
		if ev.Actor == "A" && ev.Result == "rejected" {
			rejected++
		}
	}
	if rejected != 2 {
		t.Fatalf("A's late writes rejected %d times, want 2 (fenced and plain SQL): %+v", rejected, rep.Timeline)
	}
	// The demo cleans up its schema on a user-supplied database unless --keep.
	var exists bool
	if err := db.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgfence_demo')`).Scan(&exists); err != nil || exists {
		t.Fatalf("pgfence_demo schema left behind (%v)", err)
	}
}

// The demo checks a user's database like every other command: within
// --connect-timeout, a server that accepts connections and never answers is
// reported as unreachable (it once waited without end), and a refused
// password as an authentication failure.
func TestDemoConnectionErrors(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var conns []net.Conn // held open, never answered
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	start := time.Now()
	code, _, errOut := cli(t, nil, "demo", "--connect-timeout", "1s", "--database-url", "postgres://app@"+ln.Addr().String()+"/orders")
	if code != exitUnavailable || !strings.Contains(errOut, "cannot reach the database") {
		t.Fatalf("demo against a silent server: code %d, %s", code, errOut)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("demo against a silent server took %s with --connect-timeout 1s", d)
	}
	code, _, errOut = cli(t, nil, "demo", "--database-url", strings.Replace(startPasswordCluster(t), "pwuser@", "pwuser:wrong@", 1))
	if code != exitFailure || !strings.Contains(errOut, "authentication failed") {
		t.Fatalf("demo with a refused password: code %d, %s", code, errOut)
	}
}
