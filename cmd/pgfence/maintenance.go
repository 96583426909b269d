package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// Maintenance inside the database: the pruning functions as pg_cron jobs,
// next to `pgfence keys gc` run from the outside.

// cronJob is one pg_cron job of pgfence's maintenance.
type cronJob struct {
	Name     string `json:"name"`
	Schedule string `json:"schedule"`
	Command  string `json:"command"`
	// JobID is pg_cron's id of the job (absent with --dry-run).
	JobID *int64 `json:"job_id,omitempty"`
}

// maintenanceJSON is what `maintenance schedule --json` prints.
type maintenanceJSON struct {
	// Database is where the jobs run.
	Database string    `json:"database"`
	DryRun   bool      `json:"dry_run"`
	Jobs     []cronJob `json:"jobs"`
}

// maintenanceBatchDefault is the most rows one run of a batched job deletes.
const maintenanceBatchDefault = 1000

// taskRetention is how long a finished ordered task (and its idempotency
// key) is kept: the pgfence_prune_tasks job's and the doctor's.
const taskRetention = "7 days"

// maintenanceJobs are pgfence's pruning functions as pg_cron jobs. Every
// call is bounded (a batch, a retention), so a run is short; a backlog is
// worked off over the next runs. schedule, when set, replaces every job's.
func maintenanceJobs(batch int, schedule string) []cronJob {
	jobs := []cronJob{
		// Beyond the newest 100 events per key (a grant also prunes its
		// key's every 32nd time).
		{Name: "pgfence_prune_lease_events", Schedule: "*/15 * * * *", Command: "SELECT pgfence.prune_lease_events(NULL, 100)"},
		// Older than 7 days, the oldest 1000 per call.
		{Name: "pgfence_prune_fence_rejections", Schedule: "*/5 * * * *", Command: "SELECT pgfence.prune_fence_rejections(interval '7 days')"},
		// The retention floor to the highest token granted, hourly: the
		// rows of leases ended and fence rows written an hour before it
		// may then go.
		{Name: "pgfence_advance_retention", Schedule: "0 * * * *", Command: "SELECT pgfence.advance_retention()"},
		// Rows that remember only retired tokens (at or below a floor).
		{Name: "pgfence_prune_retired", Schedule: "*/5 * * * *", Command: fmt.Sprintf("SELECT * FROM pgfence.prune_retired(%d)", batch)},
		// Completed idempotency keys past their retention.
		{Name: "pgfence_idempotency_gc", Schedule: "* * * * *", Command: fmt.Sprintf("SELECT pgfence.idempotency_gc(%d)", batch)},
		// Ordered tasks finished (done, failed, skipped) over
		// taskRetention ago, except a failed one that blocks its key; a
		// task's idempotency key goes with it.
		{Name: "pgfence_prune_tasks", Schedule: "*/5 * * * *", Command: fmt.Sprintf("SELECT pgfence.prune_tasks(interval '%s', %d)", taskRetention, batch)},
	}
	if schedule != "" {
		for i := range jobs {
			jobs[i].Schedule = schedule
		}
	}
	return jobs
}

// cronSQL returns the statement that schedules j: cron.schedule in the
// database pg_cron lives in, cron.schedule_in_database for another one.
// pg_cron updates a job of the same name and user, so it can run again.
func cronSQL(j cronJob, target string, here bool) string {
	if here {
		return fmt.Sprintf("SELECT cron.schedule(%s, %s, %s);", quoteLiteral(j.Name), quoteLiteral(j.Schedule), quoteLiteral(j.Command))
	}
	return fmt.Sprintf("SELECT cron.schedule_in_database(%s, %s, %s, %s);", quoteLiteral(j.Name), quoteLiteral(j.Schedule), quoteLiteral(j.Command), quoteLiteral(target))
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

const (
	// sqlCronHere: whether pg_cron is installed in this database, and the
	// database it runs jobs from (cron.database_name), NULL when this role
	// may not read it: pg_cron shows that setting to superusers and
	// pg_read_all_settings only, and current_setting raises 42501 for
	// anyone else (a pgfence_operator member), so it is read from
	// pg_settings, which leaves it out instead.
	sqlCronHere = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pg_cron'),
       (SELECT s.setting FROM pg_catalog.pg_settings s WHERE s.name OPERATOR(pg_catalog.=) 'cron.database_name'),
       pg_catalog.current_database()`
	sqlCronSchedule           = `SELECT cron.schedule($1, $2, $3)`
	sqlCronScheduleInDatabase = `SELECT cron.schedule_in_database($1, $2, $3, $4)`
)

func maintenanceSchedule(fs *flag.FlagSet) runFunc {
	dryRun := fs.Bool("dry-run", false, "print the SQL that schedules the jobs and change nothing (needs no database)")
	target := fs.String("target-database", "", "the database whose pgfence schema the jobs maintain (default: the one connected to)")
	schedule := fs.String("schedule", "", "a cron schedule for every job instead of each one's own (e.g. '* * * * *')")
	batch := fs.Int("batch-size", maintenanceBatchDefault, "most rows one run of prune_retired, idempotency_gc or prune_tasks deletes (1 to 100000)")
	return func(ctx context.Context, in *input) error {
		if *batch < 1 || *batch > 100000 {
			return usageError("--batch-size must be 1 to 100000, got %d", *batch)
		}
		if *schedule != "" && len(strings.Fields(*schedule)) != 5 {
			return usageError("--schedule %q is not a cron schedule of five fields (minute hour day month weekday)", *schedule)
		}
		jobs := maintenanceJobs(*batch, *schedule)
		if *dryRun {
			return printSchedule(in, maintenanceJSON{Database: *target, DryRun: true, Jobs: jobs}, *target == "")
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		var installed bool
		var cronDB *string
		var current string
		if err := pool.QueryRow(ctx, sqlCronHere).Scan(&installed, &cronDB, &current); err != nil {
			return dbError(err)
		}
		if !installed {
			where, there := "the database named by cron.database_name (which only a superuser may read)", "that database"
			if cronDB != nil {
				where, there = fmt.Sprintf("%q, cron.database_name", *cronDB), fmt.Sprintf("%q", *cronDB)
			}
			return &cliError{
				msg:  fmt.Sprintf("pg_cron is not installed in database %q (its jobs run from %s)", current, where),
				hint: fmt.Sprintf("connect to %s and pass --target-database %s; pg_cron needs shared_preload_libraries = 'pg_cron' and CREATE EXTENSION pg_cron there; or print the SQL with --dry-run", there, current),
				code: exitFailure,
			}
		}
		t := cmpOr(*target, current)
		for i, j := range jobs {
			var id int64
			if t == current {
				err = pool.QueryRow(ctx, sqlCronSchedule, j.Name, j.Schedule, j.Command).Scan(&id)
			} else {
				err = pool.QueryRow(ctx, sqlCronScheduleInDatabase, j.Name, j.Schedule, j.Command, t).Scan(&id)
			}
			if err != nil {
				if pgerr.Code(err) == "42501" || pgerr.Code(err) == "P0001" {
					return &cliError{msg: redact(err.Error()), hint: "a superuser lets a role schedule: GRANT USAGE ON SCHEMA cron TO role, and for another database GRANT EXECUTE ON FUNCTION cron.schedule_in_database(text, text, text, text, text, boolean) TO role (see RUNBOOK.md); or connect to the target database if pg_cron is installed there", code: exitFailure, err: err}
				}
				return dbError(err)
			}
			jobs[i].JobID = &id
		}
		return printSchedule(in, maintenanceJSON{Database: t, Jobs: jobs}, t == current)
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func printSchedule(in *input, out maintenanceJSON, here bool) error {
	return in.print(out, func(w io.Writer) {
		if out.DryRun {
			fmt.Fprintln(w, "-- pgfence maintenance as pg_cron jobs. Run in the database named by cron.database_name,")
			fmt.Fprintln(w, "-- as a member of pgfence_operator (the jobs run as the role that schedules them).")
			if here {
				fmt.Fprintln(w, "-- For a pgfence schema in another database: --target-database NAME (cron.schedule_in_database).")
			}
			for _, j := range out.Jobs {
				fmt.Fprintln(w, cronSQL(j, out.Database, here))
			}
			return
		}
		fmt.Fprintf(w, "scheduled %d pg_cron job(s) for database %s\n\n", len(out.Jobs), out.Database)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB ID\tNAME\tSCHEDULE\tCOMMAND")
		for _, j := range out.Jobs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", *j.JobID, j.Name, j.Schedule, j.Command)
		}
		tw.Flush()
	})
}

// The doctor's maintenance check: rows waiting to be pruned, and whether a
// pg_cron job prunes them.
const (
	// sqlBacklog counts, each bounded, the rows past their retention: fence
	// rejections older than 7 days (pruned oldest first, by id), expired
	// idempotency keys (indexed by expires_at), keys with more lease events
	// than a grant's own pruning leaves (100, plus 32 grants between two
	// prunings), released or expired lease rows whose token is retired, and
	// lease rows that ended over a day ago that no retention floor retired
	// yet (advance_retention has not run since), and ordered tasks finished
	// over taskRetention ago that no key is blocked by (row-level security
	// shows a pgfence_app member only its own).
	sqlBacklog = `SELECT
  (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM pgfence.fence_rejections r
     WHERE r.at OPERATOR(pg_catalog.<) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '7 days') LIMIT 10000) x),
  (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM pgfence.idempotency_keys k
     WHERE k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp() LIMIT 10000) x),
  (SELECT pg_catalog.count(*) FROM (SELECT e.key FROM pgfence.lease_events e GROUP BY e.key
     HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 132 LIMIT 10000) x),
  (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM pgfence.leases l, pgfence.token_floor f
     WHERE l.token OPERATOR(pg_catalog.<=) GREATEST(f.floor, f.retention)
       AND LEAST(l.released_at, l.expires_at) OPERATOR(pg_catalog.<=) (pg_catalog.clock_timestamp()
           OPERATOR(pg_catalog.-) CASE WHEN l.token OPERATOR(pg_catalog.<=) f.floor THEN interval '0' ELSE interval '1 hour' END)
     LIMIT 10000) x),
  (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM pgfence.leases l, pgfence.token_floor f
     WHERE l.token OPERATOR(pg_catalog.>) GREATEST(f.floor, f.retention)
       AND LEAST(l.released_at, l.expires_at) OPERATOR(pg_catalog.<=) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '1 day')
     LIMIT 10000) x),
  (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM pgfence.tasks t
     WHERE t.state OPERATOR(pg_catalog.=) ANY ('{done,failed,skipped}'::pg_catalog.text[])
       AND t.finished_at OPERATOR(pg_catalog.<) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '` + taskRetention + `')
       AND NOT EXISTS (SELECT 1 FROM pgfence.task_keys k WHERE k.blocked_by OPERATOR(pg_catalog.=) t.id)
     LIMIT 10000) x)`
	// sqlCronJobs lists the active pg_cron jobs this role can see (pg_cron
	// shows a role its own, a superuser every one) that run in this
	// database, when pg_cron is installed here: each with its role, whether
	// that role has pgfence_operator's privileges (or the schema owner's),
	// without which a pruning function is refused on every run, and the
	// status and message of its latest run.
	sqlCronJobs = `SELECT j.jobname, j.command, j.username::pg_catalog.text,
       EXISTS (SELECT 1 FROM pg_catalog.pg_roles r, pg_catalog.pg_namespace n
                WHERE r.rolname OPERATOR(pg_catalog.=) j.username AND n.nspname OPERATOR(pg_catalog.=) 'pgfence'
                  AND (pg_catalog.pg_has_role(r.oid, 'pgfence_operator'::pg_catalog.name, 'USAGE')
                       OR pg_catalog.pg_has_role(r.oid, n.nspowner, 'USAGE'))),
       coalesce(d.status, ''), coalesce(d.return_message, '')
  FROM cron.job j
  LEFT JOIN LATERAL (SELECT d.status, d.return_message FROM cron.job_run_details d
                      WHERE d.jobid OPERATOR(pg_catalog.=) j.jobid ORDER BY d.runid DESC LIMIT 1) d ON true
 WHERE j.active AND j.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
 ORDER BY j.jobid`
)

// backlogItem is one kind of row past its retention.
type backlogItem struct {
	what     string // "fence rejections older than 7 days"
	function string // the function that prunes it
	n        int64
}

// maintenanceCheck reports rows past their retention that no pg_cron job
// prunes. A job counts when it runs as a role with pgfence_operator's
// privileges: one of another role (an application's, named like pgfence's)
// is refused on every run, so it is named and not counted; a counted job
// whose latest run failed is named with its message.
func maintenanceCheck(ctx context.Context, pool *pgxpool.Pool) check {
	const name = "maintenance"
	var rejections, keys, eventKeys, retired, unretired, finishedTasks int64
	if err := pool.QueryRow(ctx, sqlBacklog).Scan(&rejections, &keys, &eventKeys, &retired, &unretired, &finishedTasks); err != nil {
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("cannot count the rows past their retention: %v", err)}
	}
	items := []backlogItem{
		{"fence rejection(s) older than 7 days", "prune_fence_rejections", rejections},
		{"expired idempotency key(s)", "idempotency_gc", keys},
		{"lease key(s) with more than 132 events", "prune_lease_events", eventKeys},
		{"released or expired lease row(s) whose token is retired", "prune_retired", retired},
		{"lease row(s) ended over a day ago above the retention floor", "advance_retention", unretired},
		{"ordered task(s) finished over " + taskRetention + " ago", "prune_tasks", finishedTasks},
	}
	var installed bool
	var cronDB *string
	var current string
	if err := pool.QueryRow(ctx, sqlCronHere).Scan(&installed, &cronDB, &current); err != nil {
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("cannot look for pg_cron: %v", err)}
	}
	scheduled := map[string]string{} // function -> job name
	var troubles []string            // jobs that do not prune: not pgfence's, or failing
	where := "pg_cron is not installed in this database"
	if installed {
		rows, err := pool.Query(ctx, sqlCronJobs)
		if err == nil {
			var job, command, role, status, message string
			var operator bool
			_, err = pgx.ForEachRow(rows, []any{&job, &command, &role, &operator, &status, &message}, func() error {
				for _, it := range items {
					if !strings.Contains(command, "pgfence."+it.function+"(") {
						continue
					}
					switch {
					case !operator:
						troubles = append(troubles, fmt.Sprintf("pg_cron job %s of role %s calls pgfence.%s, which that role may not run (it has not pgfence_operator's privileges): it fails on every run and is not counted", job, role, it.function))
					case status == "failed":
						scheduled[it.function] = job
						troubles = append(troubles, fmt.Sprintf("the latest run of pg_cron job %s (role %s) failed: %s", job, role, strings.TrimSpace(message)))
					default:
						scheduled[it.function] = job
					}
				}
				return nil
			})
		}
		if err == nil {
			where = fmt.Sprintf("%d of the %d pruning functions have a pg_cron job here", len(scheduled), len(items))
		} else {
			where = fmt.Sprintf("cannot read cron.job: %v", err)
		}
	} else if cronDB == nil {
		where += " (pg_cron jobs, if any, are in the database named by cron.database_name: check cron.job there)"
	} else if *cronDB != current {
		where += fmt.Sprintf(" (pg_cron jobs, if any, are in database %q: check cron.job there)", *cronDB)
	}
	var waiting []string
	for _, it := range items {
		if it.n == 0 {
			continue
		}
		count := fmt.Sprint(it.n)
		if it.n >= 10000 {
			count = "10000+"
		}
		s := fmt.Sprintf("%s %s (pgfence.%s", count, it.what, it.function)
		if job, ok := scheduled[it.function]; ok {
			s += fmt.Sprintf(", run by pg_cron job %s: see cron.job_run_details", job)
		} else {
			s += ": no pg_cron job here"
		}
		s += ")"
		waiting = append(waiting, s)
	}
	if len(troubles) > 0 {
		where += "; " + strings.Join(troubles, "; ") + ". Schedule the jobs as a member of pgfence_operator (`pgfence maintenance schedule`) and remove the others (cron.unschedule)"
	}
	if len(waiting) == 0 {
		status := statusOK
		if len(troubles) > 0 {
			status = statusWarn
		}
		return check{Name: name, Status: status, Detail: "no row waits past its retention; " + where}
	}
	return check{Name: name, Status: statusWarn, Detail: fmt.Sprintf(
		"rows wait past their retention: %s; %s. Schedule the pruning in the database (`pgfence maintenance schedule`, pg_cron) or run `pgfence keys gc` and the functions from a scheduler of yours",
		strings.Join(waiting, ", "), where)}
}
