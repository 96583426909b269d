package pgfence_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)

// TestKeyExperiment is the key experiment of fencing, with OS processes:
// worker A takes token N and is frozen (SIGSTOP) past its lease; worker B takes
// N+1 and writes; A resumes (SIGCONT) and writes with N: the database rejects
// it and the row stays B's. Then A tries every door around the helpers on the
// protected table -- a plain UPDATE, look-alike session settings, psql -- and
// every one is rejected.
func TestKeyExperiment(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	pool := db.Pool
	const res = "doc:1"
	mustExec(t, pool, `CREATE TABLE doc (resource text PRIMARY KEY, body text NOT NULL, token bigint NOT NULL)`)
	// Made-up token 1 for the setup's write and for the spoofing worker's
	// fence of an unrelated resource; the workers' grants come after it.
	issue(t, pool, res, "unrelated")
	if _, err := pgfence.Write(ctx, pool, pgfence.LeaseOf(res, "", 1), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO doc VALUES ($1, 'init', 1)`, res)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"doc"}, "resource", ""); err != nil {
		t.Fatal(err)
	}

	a := startWorker(t, "A", db.URL)
	var n int64
	if _, err := fmt.Sscanf(a.do("grant "+res), "token %d", &n); err != nil {
		t.Fatalf("A grant: %v", err)
	}
	if err := a.cmd.Process.Signal(sigStop); err != nil {
		t.Fatal(err)
	}
	waitState(t, a.cmd.Process.Pid, "T")
	// A's lease runs out while it is frozen: by the database clock.
	mustExec(t, pool, expireSQL, res)

	b := startWorker(t, "B", db.URL)
	var n1 int64
	if _, err := fmt.Sscanf(b.do("grant "+res), "token %d", &n1); err != nil {
		t.Fatalf("B grant: %v", err)
	}
	if n1 != n+1 {
		t.Fatalf("B's token %d, want %d", n1, n+1)
	}
	if got := b.do(fmt.Sprintf("write %s %d B", res, n1)); got != "ok" {
		t.Fatalf("B write: %s", got)
	}

	// A wakes up and writes as if nothing happened.
	a.send(fmt.Sprintf("write %s %d A", res, n))
	if err := a.cmd.Process.Signal(sigCont); err != nil {
		t.Fatal(err)
	}
	if got, want := a.recv(), fmt.Sprintf("stale %d %d", n, n1); got != want {
		t.Fatalf("A's late fenced write: %q, want %q", got, want)
	}
	if got := a.do("lwrite A"); got != "lease taken_over" {
		t.Fatalf("A's late lease-checked write: %q", got)
	}
	// The doors around the helpers.
	if got := a.do("raw " + res + " A-raw"); got != "unfenced" {
		t.Fatalf("A's plain UPDATE: %q", got)
	}
	if got := a.do(fmt.Sprintf("spoof %s %d A-spoof", res, n)); got != "unfenced" {
		t.Fatalf("A's spoofed settings: %q", got)
	}
	if got := a.do(fmt.Sprintf("spoof %s %d A-spoof", res, n1)); got != "unfenced" {
		t.Fatalf("A's spoofed settings with the current token: %q", got)
	}
	psql, err := exec.LookPath("psql")
	if err != nil && os.Getenv("CI") == "true" {
		t.Fatal("psql not on PATH: under CI=true the psql doors must be tested")
	}
	if err == nil {
		for _, script := range []string{
			fmt.Sprintf(`UPDATE doc SET body = 'psql' WHERE resource = '%s'`, res),
			fmt.Sprintf(`BEGIN; SELECT pgfence.fence('%s', %d); UPDATE doc SET body = 'psql' WHERE resource = '%s'; COMMIT;`, res, n, res),
			`DELETE FROM doc`,
			`TRUNCATE doc`,
			`INSERT INTO doc VALUES ('doc:2', 'psql', 1)`,
		} {
			out, err := exec.CommandContext(ctx, psql, "-X", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", "-d", db.URL, "-c", `\set VERBOSITY verbose`, "-c", script).CombinedOutput()
			if err == nil || !(strings.Contains(string(out), "PF006") || strings.Contains(string(out), "PF001")) {
				t.Errorf("psql %q: want PF006/PF001, got %v: %s", script, err, out)
			}
		}
	}
	a.send("exit")
	b.send("exit")

	var body string
	var token int64
	if err := pool.QueryRow(ctx, `SELECT body, token FROM doc WHERE resource = $1`, res).Scan(&body, &token); err != nil {
		t.Fatal(err)
	}
	if body != "B" || token != n1 {
		t.Fatalf("final row %q token %d, want B's write with %d", body, token, n1)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM doc`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("doc has %d rows (%v), want 1", rows, err)
	}
}

func waitState(t *testing.T, pid int, state string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for processState(pid) != state {
		if time.Now().After(deadline) {
			t.Fatalf("process %d not in state %s", pid, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
