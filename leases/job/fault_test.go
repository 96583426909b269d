package job_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Four replicas run 30 slots of one job while the test kills replica
// processes at random moments (SIGKILL: mid-run, mid-commit, waiting) and
// starts new ones, and restarts PostgreSQL once. Every slot completes
// exactly once, and its business effect, written with the completion,
// exists exactly once, by the run that completed it.
func TestJobsUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and worker processes")
	}
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	ctx := ctxTimeout(t, 5*time.Minute)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE job_effects (id bigint GENERATED ALWAYS AS IDENTITY, slot text NOT NULL, token bigint NOT NULL, by text NOT NULL, resumed boolean NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const key = "jobs/daily"
	var slots []string
	for i := range 30 {
		slots = append(slots, fmt.Sprintf("2026-12-%02dT00:00:00Z", i+1))
	}
	next := 0
	start := func() *workerproc.Worker {
		next++
		w := workerproc.Start(t, "jobber", nil)
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		args := jobberArgs{URL: db.URL, Key: key, Name: fmt.Sprintf("replica-%d", next), TTL: time.Second, Slots: slots}
		if err := w.Call(ctx, "open", args, nil); err != nil {
			t.Fatalf("open: %v\n%s", err, w.Stderr())
		}
		return w
	}
	var live []*workerproc.Worker
	for range 4 {
		live = append(live, start())
	}
	status := func(w *workerproc.Worker) jobberStatus {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var s jobberStatus
		if err := w.Call(ctx, "status", nil, &s); err != nil {
			t.Fatalf("status: %v\n%s", err, w.Stderr())
		}
		return s
	}

	kills := 0
	restarted := false
	for round := 0; ; round++ {
		time.Sleep(time.Duration(30+rand.IntN(150)) * time.Millisecond)
		var done int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.job_slots WHERE key = $1 AND completed_at IS NOT NULL`, key).Scan(&done); err != nil {
			if restarted {
				continue // the pool reconnects
			}
			t.Fatal(err)
		}
		if done == len(slots) {
			break
		}
		if round > 400 {
			t.Fatalf("only %d of %d slots completed", done, len(slots))
		}
		switch {
		case done >= len(slots)/2 && !restarted:
			restarted = true
			if err := cluster.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("restarted PostgreSQL with %d slots completed", done)
		case kills < 12:
			i := rand.IntN(len(live))
			if err := live[i].Kill(); err != nil {
				t.Fatal(err)
			}
			kills++
			live[i] = start()
			// Without waiting for the dead runner's TTL, sometimes.
			if rand.IntN(2) == 0 {
				_, _ = db.Pool.Exec(ctx, `UPDATE pgfence.leases SET expires_at = greatest(granted_at, clock_timestamp()) WHERE key = $1`, key)
				_, _ = db.Pool.Exec(ctx, `SELECT pg_notify('pgfence_lease_released', $1)`, key)
			}
		}
	}
	t.Logf("%d kills", kills)
	// The replicas still running reach the end of the list.
	eventually(t, time.Minute, "the live replicas done", func() bool {
		for _, w := range live {
			if !status(w).Done {
				return false
			}
		}
		return true
	})

	rows, err := db.Pool.Query(ctx, `
SELECT s.slot, s.runs, s.token, count(e.id), count(e.id) FILTER (WHERE e.token = s.token), bool_or(e.resumed)
  FROM pgfence.job_slots s LEFT JOIN job_effects e USING (slot)
 WHERE s.key = $1 GROUP BY s.slot, s.runs, s.token ORDER BY s.slot`, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var n, takenOver, resumed int
	for rows.Next() {
		var (
			slot           string
			runs           int
			token          int64
			effects, byRun int
			wasResumed     *bool
		)
		if err := rows.Scan(&slot, &runs, &token, &effects, &byRun, &wasResumed); err != nil {
			t.Fatal(err)
		}
		n++
		if effects != 1 || byRun != 1 {
			t.Errorf("slot %s: %d effects, %d by the completing run (token %d); want exactly one, by it", slot, effects, byRun, token)
		}
		if runs > 1 {
			takenOver++
		}
		if wasResumed != nil && *wasResumed {
			resumed++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(slots) {
		t.Fatalf("%d slots recorded, want %d", n, len(slots))
	}
	t.Logf("%d slots, each completed once with its effect; %d taken over, %d completed by a resumed run", n, takenOver, resumed)
}
