package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// pgCronInstalled reports whether pg_cron's library is next to the server.
func pgCronInstalled(t *testing.T) bool {
	t.Helper()
	bin, err := pgcluster.FindBinaries()
	if err != nil {
		return false
	}
	if real, err := filepath.EvalSymlinks(filepath.Join(bin, "postgres")); err == nil {
		bin = filepath.Dir(real)
	}
	_, err = os.Stat(filepath.Join(filepath.Dir(bin), "lib", "pg_cron.so"))
	return err == nil
}

// pgCronCluster starts a cluster with pg_cron loaded, scheduling in database
// postgres; without pg_cron the test is skipped (failed under CI=true).
func pgCronCluster(t *testing.T) *pgfencetest.Cluster {
	t.Helper()
	if !pgCronInstalled(t) {
		if os.Getenv("CI") == "true" {
			t.Fatal("pg_cron is not installed (Debian/Ubuntu: apt-get install postgresql-15-cron)")
		}
		t.Skip("pg_cron is not installed (Debian/Ubuntu: apt-get install postgresql-15-cron)")
	}
	return pgfencetest.NewCluster(t, &pgfencetest.ClusterOptions{Settings: map[string]string{
		"shared_preload_libraries": "pg_cron",
		"cron.database_name":       "postgres",
		// Jobs run in background workers: no connection, no password.
		"cron.use_background_workers": "on",
		"max_worker_processes":        "16",
		"fsync":                       "off",
	}})
}

// The pruning functions scheduled with pg_cron prune inside the database:
// the doctor warns about rows past their retention that nothing prunes,
// `maintenance schedule` schedules the jobs (from the database pg_cron
// runs in, for another one), pg_cron runs them, the rows are gone and the
// doctor is content.
func TestMaintenanceWithPgCron(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cluster := pgCronCluster(t)
	db := cluster.NewDatabase(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	// Rows past their retention, of each kind.
	exec(`SELECT pgfence.record_fence_rejection('stock/apple', 7, 9, 'stale_token', NULL, 'exec', NULL, NULL) FROM generate_series(1, 3)`)
	exec(`UPDATE pgfence.fence_rejections SET at = at - interval '8 days'`)
	store, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"k1", "k2"} {
		if _, err := store.Do(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: key}, func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE pgfence.idempotency_keys SET created_at = created_at - interval '1 hour', updated_at = updated_at - interval '1 hour',
		completed_at = completed_at - interval '1 hour', expires_at = clock_timestamp() - interval '1 second'`)
	pgfencetest.IssueToken(t, db.Pool, "jobs/old", 5) // released, token 5
	// A live key with a long history: the retention keeps its rows, and
	// prune_lease_events its newest 100 events.
	exec(`SELECT pgfence.try_acquire('jobs/chatty', interval '1 hour')`)
	exec(`INSERT INTO pgfence.lease_events (key, event, holder, token)
		SELECT 'jobs/chatty', 'acquired', gen_random_uuid(), g FROM generate_series(1, 200) g`)
	exec(`SELECT pgfence.raise_token_floor(10, 'retire token 5')`)
	// A one-off key whose lease ended two days ago, above every floor: only
	// advance_retention retires it.
	exec(`SELECT pgfence.release('jobs/once', a.holder, a.token) FROM pgfence.try_acquire('jobs/once', interval '1 minute') a`)
	exec(`UPDATE pgfence.leases SET granted_at = granted_at - interval '2 days', expires_at = expires_at - interval '2 days',
		released_at = released_at - interval '2 days' WHERE key = 'jobs/once'`)
	// Ordered tasks finished 8 days ago: one done, which goes, and one
	// failed that blocks its key, which stays until an operator acts.
	setupTasks(t, ctx, db)
	exec(`UPDATE pgfence.tasks SET finished_at = finished_at - interval '8 days' WHERE finished_at IS NOT NULL`)

	environ := map[string]string{"DATABASE_URL": db.URL}
	c := doctorCheck(t, environ, "maintenance")
	for _, want := range []string{"3 fence rejection(s) older than 7 days", "2 expired idempotency key(s)",
		"1 lease key(s) with more than 132 events", "1 released or expired lease row(s) whose token is retired",
		"1 lease row(s) ended over a day ago above the retention floor", "1 ordered task(s) finished over 7 days ago (pgfence.prune_tasks: no pg_cron job here)"} {
		if c.Status != statusWarn || !strings.Contains(c.Detail, want) {
			t.Errorf("maintenance check before any job = %+v, want a warning naming %q", c, want)
		}
	}

	// pg_cron lives in the postgres database; the jobs run in db's.
	cronURL := pgcluster.At(cluster.Addr()).ConnString("postgres")
	admin, err := pgx.Connect(ctx, cronURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_cron`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, map[string]string{"DATABASE_URL": db.URL}, "maintenance", "schedule")
	if code != exitFailure || !strings.Contains(errOut, `pg_cron is not installed in database "`+db.Name+`"`) || !strings.Contains(errOut, "--target-database "+db.Name) {
		t.Fatalf("maintenance schedule on a database without pg_cron: code %d, want %d naming where pg_cron runs\n%s%s", code, exitFailure, out, errOut)
	}
	code, out, errOut = cli(t, map[string]string{"DATABASE_URL": cronURL}, "maintenance", "schedule", "--target-database", db.Name, "--schedule", "* * * * *")
	if code != exitOK || !strings.Contains(out, "scheduled 6 pg_cron job(s) for database "+db.Name) {
		t.Fatalf("maintenance schedule: code %d\n%s%s", code, out, errOut)
	}

	// pg_cron starts jobs on the minute: wait for a run of each (bounded).
	const sqlRuns = `SELECT count(DISTINCT j.jobname) FROM cron.job j JOIN cron.job_run_details d USING (jobid)
		WHERE j.database = $1 AND d.status = 'succeeded'`
	// The one-off lease row goes once prune_retired ran after
	// advance_retention: in the same minute or the next.
	deadline := time.Now().Add(200 * time.Second)
	for {
		var ran, once, finished int
		if err := admin.QueryRow(ctx, sqlRuns, db.Name).Scan(&ran); err != nil {
			t.Fatal(err)
		}
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE key = 'jobs/once'`).Scan(&once); err != nil {
			t.Fatal(err)
		}
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.tasks WHERE state = 'done'`).Scan(&finished); err != nil {
			t.Fatal(err)
		}
		if ran == 6 && once == 0 && finished == 0 {
			break
		}
		if time.Now().After(deadline) {
			var details string
			_ = admin.QueryRow(ctx, `SELECT coalesce(string_agg(j.jobname || ': ' || d.status || ' ' || coalesce(d.return_message, ''), '; '), 'none')
				FROM cron.job j LEFT JOIN cron.job_run_details d USING (jobid)`).Scan(&details)
			t.Fatalf("pg_cron ran %d of the 6 jobs successfully within 200 s (%d one-off lease row, %d finished task left); runs: %s", ran, once, finished, details)
		}
		time.Sleep(time.Second)
	}
	c = doctorCheck(t, environ, "maintenance")
	if c.Status != statusOK || !strings.Contains(c.Detail, "no row waits past its retention") {
		t.Fatalf("maintenance check after pg_cron's runs = %+v, want ok", c)
	}
	var failed int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.tasks WHERE state = 'failed'`).Scan(&failed); err != nil || failed != 1 {
		t.Fatalf("failed tasks after pruning: %d (%v), want the one that blocks its key", failed, err)
	}
	var events int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_events WHERE key = 'jobs/chatty'`).Scan(&events); err != nil || events != 100 {
		t.Fatalf("lease events of jobs/chatty after pruning: %d (%v), want the newest 100", events, err)
	}
}

// The runbook's way: a pgfence_operator member (not a superuser) schedules
// the maintenance and runs the doctor. pg_cron shows cron.database_name to
// superusers only (current_setting raises 42501 for anyone else), so
// neither reads it that way. And a job of an application role named and
// written like pgfence's, which fails on every run (the role may not run
// the pruning functions), is not counted as pgfence's: the doctor names it.
func TestMaintenanceAsOperator(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cluster := pgCronCluster(t)
	// pgfence and pg_cron in one database, so the doctor sees the jobs.
	addr := pgcluster.At(cluster.Addr())
	pool, err := pgxpool.New(ctx, addr.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(addr.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	as := func(role string) map[string]string {
		return map[string]string{"DATABASE_URL": fmt.Sprintf("host=%s port=%d dbname=postgres user=%s password=not-a-secret", cfg.Host, cfg.Port, role)}
	}
	for _, sql := range []string{
		`CREATE EXTENSION pg_cron`,
		`CREATE ROLE maint_operator LOGIN PASSWORD 'not-a-secret' IN ROLE pgfence_operator`,
		`CREATE ROLE orders_app LOGIN PASSWORD 'not-a-secret' IN ROLE pgfence_app`,
		// What the runbook has a superuser grant, and nothing more.
		`GRANT USAGE ON SCHEMA cron TO maint_operator, orders_app`,
		// A retired lease row: something for prune_retired to do.
		`SELECT pgfence.release('jobs/old', a.holder, a.token) FROM pgfence.try_acquire('jobs/old', interval '1 minute') a`,
		`SELECT pgfence.raise_token_floor(pgfence.max_stored_token() + 1, 'retire jobs/old')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// The application's look-alike job: its role may not run prune_retired.
	app, err := pgx.Connect(ctx, as("orders_app")["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(context.Background())
	if _, err := app.Exec(ctx, `SELECT cron.schedule('pgfence_prune_retired', '* * * * *', 'SELECT * FROM pgfence.prune_retired(1000)')`); err != nil {
		t.Fatal(err)
	}

	c := doctorCheck(t, as("maint_operator"), "maintenance")
	if c.Status != statusWarn || !strings.Contains(c.Detail, "released or expired lease row(s) whose token is retired (pgfence.prune_retired: no pg_cron job here)") {
		t.Fatalf("maintenance check as an operator before scheduling = %+v, want a warning that no job prunes the retired row", c)
	}
	code, out, errOut := cli(t, as("maint_operator"), "maintenance", "schedule", "--schedule", "* * * * *")
	if code != exitOK || !strings.Contains(out, "scheduled 6 pg_cron job(s) for database postgres") {
		t.Fatalf("maintenance schedule as an operator: code %d\n%s%s", code, out, errOut)
	}

	// pg_cron starts jobs on the minute: wait for a run of each (bounded).
	deadline := time.Now().Add(150 * time.Second)
	for {
		var operatorRuns, appFailures, retired int
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT j.jobname) FILTER (WHERE j.username = 'maint_operator' AND d.status = 'succeeded'),
			count(*) FILTER (WHERE j.username = 'orders_app' AND d.status = 'failed')
			FROM cron.job j JOIN cron.job_run_details d USING (jobid)`).Scan(&operatorRuns, &appFailures); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE key = 'jobs/old'`).Scan(&retired); err != nil {
			t.Fatal(err)
		}
		if operatorRuns == 6 && appFailures > 0 && retired == 0 {
			break
		}
		if time.Now().After(deadline) {
			var details string
			_ = pool.QueryRow(ctx, `SELECT coalesce(string_agg(j.username || ' ' || j.jobname || ': ' || d.status || ' ' || coalesce(d.return_message, ''), '; '), 'none')
				FROM cron.job j LEFT JOIN cron.job_run_details d USING (jobid)`).Scan(&details)
			t.Fatalf("within 150 s pg_cron ran %d of the operator's 6 jobs successfully, the application's job failed %d time(s), %d retired row left; runs: %s",
				operatorRuns, appFailures, retired, details)
		}
		time.Sleep(time.Second)
	}

	// The operator sees its own jobs, all of them pgfence's.
	c = doctorCheck(t, as("maint_operator"), "maintenance")
	if c.Status != statusOK || !strings.Contains(c.Detail, "6 of the 6 pruning functions have a pg_cron job here") {
		t.Fatalf("maintenance check as the operator after the runs = %+v, want ok with 5 jobs", c)
	}
	// A superuser sees the application's job too: named, not counted.
	c = doctorCheck(t, map[string]string{"DATABASE_URL": addr.ConnString("postgres")}, "maintenance")
	if c.Status != statusWarn || !strings.Contains(c.Detail, "pg_cron job pgfence_prune_retired of role orders_app calls pgfence.prune_retired, which that role may not run") ||
		!strings.Contains(c.Detail, "6 of the 6 pruning functions have a pg_cron job here") {
		t.Fatalf("maintenance check as a superuser = %+v, want a warning naming orders_app's job", c)
	}
	// Without the operator's jobs, the application's counts for nothing.
	if _, err := pool.Exec(ctx, `DELETE FROM cron.job WHERE username = 'maint_operator'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pgfence.release('jobs/old2', a.holder, a.token) FROM pgfence.try_acquire('jobs/old2', interval '1 minute') a`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pgfence.raise_token_floor(pgfence.max_stored_token() + 1, 'retire jobs/old2')`); err != nil {
		t.Fatal(err)
	}
	c = doctorCheck(t, map[string]string{"DATABASE_URL": addr.ConnString("postgres")}, "maintenance")
	if c.Status != statusWarn || !strings.Contains(c.Detail, "(pgfence.prune_retired: no pg_cron job here)") {
		t.Fatalf("maintenance check with only the application's job = %+v, want prune_retired unscheduled", c)
	}
}
