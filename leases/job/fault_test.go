package job_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/leases/job"
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

// Every period, at most once, while at least one replica runs: three
// replicas call RunPeriod with a period of 1 s. The run of one period hangs
// and the test SIGKILLs its replica; the two others, running throughout,
// wait out its lease (TTL 3 s, so at least the next period passes with no
// run begun). Every period from the job's first slot to its last is then
// accounted for: completed once, with its effect once, or listed by
// Unfinished (the killed run's period, and the periods missed meanwhile,
// which Run then runs late) — with CatchUp, RunPeriod runs them late itself.
func TestPeriodsUnderSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes and waits out a lease")
	}
	for _, catchUp := range []int{0, 10} {
		t.Run(fmt.Sprintf("CatchUp=%d", catchUp), func(t *testing.T) { periodsUnderSIGKILL(t, catchUp) })
	}
}

func periodsUnderSIGKILL(t *testing.T, catchUp int) {
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE job_effects (id bigint GENERATED ALWAYS AS IDENTITY, slot text NOT NULL, token bigint NOT NULL, by text NOT NULL, resumed boolean NOT NULL);
CREATE TABLE job_hang ();`); err != nil {
		t.Fatal(err)
	}
	const (
		key    = "jobs/every-second"
		period = time.Second
	)
	var replicas []*workerproc.Worker
	for i := range 3 {
		w := workerproc.Start(t, "jobber", nil)
		args := jobberArgs{URL: db.URL, Key: key, Name: fmt.Sprintf("replica-%d", i), TTL: 3 * time.Second, Period: period, CatchUp: catchUp}
		if err := w.Call(ctx, "open", args, nil); err != nil {
			t.Fatalf("open: %v\n%s", err, w.Stderr())
		}
		replicas = append(replicas, w)
	}
	status := func(w *workerproc.Worker) (s jobberStatus) {
		if err := w.Call(ctx, "status", nil, &s); err != nil {
			t.Fatalf("status: %v\n%s", err, w.Stderr())
		}
		return s
	}
	completedAfter := func(slot string) (n int) {
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.job_slots WHERE key = $1 AND slot > $2 AND completed_at IS NOT NULL`, key, slot).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventually(t, 30*time.Second, "two periods completed", func() bool { return completedAfter("") >= 2 })

	// The next run hangs; its replica is killed mid-run.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO job_hang DEFAULT VALUES`); err != nil {
		t.Fatal(err)
	}
	var hung string
	eventually(t, 30*time.Second, "a run hanging", func() bool {
		for i, w := range replicas {
			if hung = status(w).Hanging; hung != "" {
				if err := w.Kill(); err != nil {
					t.Fatal(err)
				}
				replicas = slices.Delete(replicas, i, i+1)
				return true
			}
		}
		return false
	})
	// The others take over after the dead runner's TTL and go on.
	eventually(t, 30*time.Second, "three periods completed after the killed run's", func() bool { return completedAfter(hung) >= 3 })
	for _, w := range replicas {
		if err := w.Call(ctx, "close", nil, nil); err != nil {
			t.Fatalf("close: %v\n%s", err, w.Stderr())
		}
	}

	// Every period from the first slot to the last has its row.
	var first, last time.Time
	var missed int
	if err := db.Pool.QueryRow(ctx, `SELECT min(slot)::timestamptz, max(slot)::timestamptz, count(*) FILTER (WHERE runs = 0) FROM pgfence.job_slots WHERE key = $1`, key).
		Scan(&first, &last, &missed); err != nil {
		t.Fatal(err)
	}
	var slots []string
	for p := first; !p.After(last); p = p.Add(period) {
		slots = append(slots, p.UTC().Format(time.RFC3339))
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.job_slots WHERE key = $1 AND slot = ANY($2)`, key, slots).Scan(&n); err != nil || n != len(slots) {
		t.Fatalf("%d of the %d periods from %s to %s have a slot (%v): a period was lost without a trace", n, len(slots), first, last, err)
	}
	client := newClient(t, db.Pool, nil)
	runner, err := job.New(client, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	unfinished, err := runner.Unfinished(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d periods from %s, run %s hung and was killed; %d recorded missed; unfinished: %v", len(slots), slots[0], hung, missed, unfinished)
	switch {
	case catchUp == 0 && (!slices.Contains(unfinished, hung) || missed == 0):
		t.Fatalf("unfinished %v, %d missed; want the killed run's period %s and the periods missed while its lease ran out", unfinished, missed, hung)
	case catchUp > 0 && len(unfinished) > 0:
		t.Fatalf("unfinished %v with CatchUp %d; want every period run", unfinished, catchUp)
	}
	// What was reported is run late, by name.
	for _, slot := range unfinished {
		if _, err := runner.Run(ctx, slot, func(ctx context.Context, s *job.Slot) error { return work(ctx, s, "late") }); err != nil {
			t.Fatal(err)
		}
	}
	var late int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.job_slots WHERE key = $1 AND completed_at >= slot::timestamptz + $2::interval`, key, period).Scan(&late); err != nil || late < 2 {
		t.Errorf("%d periods completed after they ended (%v); want at least the killed run's and the next", late, err)
	}
	// Each period ran once: completed, with one effect, by its completing run.
	rows, err := db.Pool.Query(ctx, `
SELECT s.slot, s.runs, s.completed_at IS NOT NULL, count(e.id), count(e.id) FILTER (WHERE e.token = s.token)
  FROM pgfence.job_slots s LEFT JOIN job_effects e USING (slot)
 WHERE s.key = $1 GROUP BY s.slot, s.runs, s.token, s.completed_at ORDER BY s.slot`, key)
	if err != nil {
		t.Fatal(err)
	}
	periods, err := pgx.CollectRows(rows, pgx.RowToStructByPos[periodRow])
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range periods {
		if !r.Completed || r.Effects != 1 || r.ByRun != 1 {
			t.Errorf("period %s (runs %d): completed %v, %d effects, %d by the completing run; want completed once with its effect", r.Slot, r.Runs, r.Completed, r.Effects, r.ByRun)
		}
		if r.Slot == hung && catchUp > 0 && r.Runs != 2 {
			t.Errorf("the killed run's period %s had %d runs, want 2 (taken over by the catch-up)", r.Slot, r.Runs)
		}
	}
}

type periodRow struct {
	Slot           string
	Runs           int
	Completed      bool
	Effects, ByRun int
}
