// Package bench is the benchmark lab behind `pgfence bench`: it measures
// leases, fenced writes and idempotency keys side by side with what teams
// write by hand (raw SQL, advisory locks) and with Redis, in one run on one
// machine ([Lab.Compare]), and how their cost grows with the data
// ([Lab.Curves]).
//
// Every figure is measured by [benchrun], the same loop the Redis peer (the
// nested module cmd/pgfence/internal/benchpeer) runs, so that every row of a
// report is measured the same way. The raw-SQL cases keep their SQL on
// purpose: they are the floor pgfence is measured against. Each statement is
// schema-qualified, so a session's search_path cannot change what runs.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// MaxDuration is the longest run of one case or one curve point, and the
// longest warm-up.
const MaxDuration = 10 * time.Minute

// cleanupTimeout bounds what the lab undoes on its way out (also after
// Ctrl-C, or with the database gone): it must not hang the exit.
const cleanupTimeout = 30 * time.Second

// Timing is how long one case or curve point runs: Warmup, then Duration on
// the clock.
type Timing struct {
	Duration, Warmup time.Duration
}

func (t Timing) total() time.Duration { return t.Warmup + t.Duration }

// config is the benchrun configuration of n workers; started is called when
// the clock starts.
func (t Timing) config(n int, started func()) benchrun.Config {
	return benchrun.Config{Workers: n, Duration: t.Duration, Warmup: t.Warmup, Started: started}
}

// DatabaseError reports that the lab has no database: the one at the URL
// could not be reached, or no throwaway local server could be started.
type DatabaseError struct{ Err error }

func (e *DatabaseError) Error() string { return e.Err.Error() }
func (e *DatabaseError) Unwrap() error { return e.Err }

// Lab is the database a bench runs on, with a pool whose statements are
// counted.
type Lab struct {
	db       *pgfencetest.Database
	pool     *pgxpool.Pool // traced: the cases run here
	stmts    *statementCounter
	settings string // the durability settings, for the report
	progress io.Writer
}

// Open opens the database at url (or, when url is empty, a throwaway durable
// local cluster) and a traced pool sized for maxWorkers, and creates the
// bench tables. Progress messages go to progress.
func Open(ctx context.Context, url string, maxWorkers int, progress io.Writer) (*Lab, error) {
	d, err := pgfencetest.Start(ctx, &pgfencetest.StartOptions{URL: url, Progress: progress, MaxConns: 8, Settings: map[string]string{
		// hot-key: one LISTEN connection per waiter, besides the pool
		"max_connections": strconv.Itoa(2*maxWorkers + 100),
		"shared_buffers":  "128MB",
	}})
	if err != nil {
		return nil, &DatabaseError{Err: err}
	}
	lab := &Lab{db: d, stmts: &statementCounter{}, progress: progress}
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	cfg.MaxConns = int32(maxWorkers + 8)
	cfg.ConnConfig.Tracer = lab.stmts
	if lab.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		_ = d.Close()
		return nil, err
	}
	var fsync, syncCommit, autovacuum, version string
	if err := d.Pool.QueryRow(ctx, `SELECT pg_catalog.current_setting('fsync'), pg_catalog.current_setting('synchronous_commit'),
		pg_catalog.current_setting('autovacuum'), pg_catalog.current_setting('server_version')`).Scan(&fsync, &syncCommit, &autovacuum, &version); err != nil {
		lab.Close()
		return nil, err
	}
	lab.settings = fmt.Sprintf("PostgreSQL %s, fsync=%s synchronous_commit=%s autovacuum=%s", version, fsync, syncCommit, autovacuum)
	if d.Throwaway() {
		lab.settings += " (throwaway local cluster)"
	}
	if _, err := d.Pool.Exec(ctx, benchSchema); err != nil {
		lab.Close()
		return nil, fmt.Errorf("bench setup: %w", err)
	}
	return lab, nil
}

// Close drops the bench tables and closes the database (stopping a
// throwaway cluster).
func (lab *Lab) Close() {
	if lab.pool != nil {
		lab.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = lab.db.Pool.Exec(ctx, `DROP SCHEMA IF EXISTS pgfence_bench CASCADE`)
	_ = lab.db.Close()
}

// Settings describes the server's durability settings.
func (lab *Lab) Settings() string { return lab.settings }

func machine() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%s, %d CPUs, %s, host %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), host)
}

// measure runs one PostgreSQL case with n workers as t says and counts the
// statements the pool sent while the clock ran.
func (lab *Lab) measure(ctx context.Context, c *Case, n int, t Timing) (benchrun.Result, error) {
	op, cleanup, err := c.prepare(ctx, lab, n)
	if errors.Is(err, errSkip) {
		return benchrun.Result{Skipped: err.Error()}, nil
	}
	if err != nil {
		return benchrun.Result{}, err
	}
	defer cleanup()
	// Every case starts right after a checkpoint, so none pays for another's
	// checkpoint I/O, and then warms up: the first change of each page after
	// a checkpoint writes a full-page image to the WAL, a cost that a server
	// spreads over its checkpoint interval (5 min by default) but that would
	// dominate a few seconds measured right after one, charged to whichever
	// case writes more pages. Without the privilege (pg_checkpoint, on
	// --database-url) the cases run as the server's checkpoints fall.
	_, _ = lab.db.Pool.Exec(ctx, `CHECKPOINT`)
	var before int64
	r := benchrun.Run(ctx, op, t.config(n, func() { before = lab.stmts.Load() }))
	r.SetStatements(lab.stmts.Load() - before)
	return r, nil
}
