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
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
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
	url      string            // what the cases connect to: db.URL, or the delaying proxy's
	proxy    *faultproxy.Proxy // nil without a delay
	pool     *pgxpool.Pool     // traced: the cases run here
	stmts    *statementCounter
	settings string // the durability settings, for the report
	progress io.Writer
	pooled   bool // a transaction pooler answers at the URL: no LISTEN (SetPooled)
}

// SetPooled tells the lab that a transaction pooler (PgBouncer) answers at
// its URL. LISTEN does not work through one (the session that listens goes
// back to the pool and serves other clients), so the cases and the
// contention run then use leases clients with wake-ups off, as the leases
// package says to behind such a pooler, and skip the LISTEN floor.
func (lab *Lab) SetPooled(pooled bool) { lab.pooled = pooled }

// leasesConfig is cfg (nil: the defaults) with wake-ups off behind a
// transaction pooler.
func (lab *Lab) leasesConfig(cfg *leases.Config) *leases.Config {
	var c leases.Config
	if cfg != nil {
		c = *cfg
	}
	if lab.pooled {
		c.DisableWakeups = true
	}
	return &c
}

// Open opens the database at url (or, when url is empty, a throwaway durable
// local cluster) and a traced pool sized for maxWorkers, and creates the
// bench tables. Progress messages go to progress.
//
// A positive rtt puts a TCP proxy, in this process, between the cases and
// the server; it holds every byte for half of rtt in each direction, so that
// each round trip costs what it costs across a network. The bench's own
// setup and cleanup go around it.
func Open(ctx context.Context, url string, maxWorkers int, rtt time.Duration, progress io.Writer) (*Lab, error) {
	d, err := pgfencetest.Start(ctx, &pgfencetest.StartOptions{URL: url, Progress: progress, MaxConns: 8, Settings: map[string]string{
		// hot-key: one LISTEN connection per waiter, besides the pool
		"max_connections": strconv.Itoa(2*maxWorkers + 100),
		"shared_buffers":  "128MB",
	}})
	if err != nil {
		return nil, &DatabaseError{Err: err}
	}
	lab := &Lab{db: d, url: d.URL, stmts: &statementCounter{}, progress: progress}
	if rtt > 0 {
		if err := lab.delay(rtt); err != nil {
			_ = d.Close()
			return nil, err
		}
	}
	cfg, err := pgxpool.ParseConfig(lab.url)
	if err != nil {
		lab.closeProxy()
		_ = d.Close()
		return nil, err
	}
	cfg.MaxConns = int32(maxWorkers + 8)
	cfg.ConnConfig.Tracer = lab.stmts
	if lab.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		lab.closeProxy()
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
	if rtt > 0 {
		// Timers wake late (by up to a millisecond on an idle Linux
		// machine): say what a round trip took, not only what was asked.
		through, err := pingP50(ctx, lab.pool)
		if err != nil {
			lab.Close()
			return nil, err
		}
		direct, err := pingP50(ctx, d.Pool)
		if err != nil {
			lab.Close()
			return nil, err
		}
		lab.settings += fmt.Sprintf("; --rtt %s: a round trip (SELECT 1, p50) took %.2f ms through the delaying proxy, %.2f ms without", rtt, ms(through), ms(direct))
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
	lab.closeProxy()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = lab.db.Pool.Exec(ctx, `DROP SCHEMA IF EXISTS pgfence_bench CASCADE`)
	_ = lab.db.Close()
}

// delay routes the cases through a proxy that adds rtt to every round trip.
func (lab *Lab) delay(rtt time.Duration) error {
	cfg, err := pgx.ParseConfig(lab.db.URL)
	if err != nil {
		return err
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return fmt.Errorf("a delay needs the database at a TCP address, not the Unix socket in %s", cfg.Host)
	}
	p, err := faultproxy.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), nil)
	if err != nil {
		return err
	}
	url, err := p.ConnString(lab.db.URL)
	if err != nil {
		_ = p.Close()
		return fmt.Errorf("a delay needs a postgres:// URL: %w", err)
	}
	p.SetDelay(faultproxy.ClientToServer, rtt/2)
	p.SetDelay(faultproxy.ServerToClient, rtt-rtt/2)
	lab.proxy, lab.url = p, url
	return nil
}

// pingP50 is the median time of SELECT 1 on one of pool's connections.
func pingP50(ctx context.Context, pool *pgxpool.Pool) (time.Duration, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Release()
	times := make([]time.Duration, 21)
	for i := range times {
		start := time.Now()
		if _, err := c.Exec(ctx, `SELECT 1`); err != nil {
			return 0, err
		}
		times[i] = time.Since(start)
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

func (lab *Lab) closeProxy() {
	if lab.proxy != nil {
		_ = lab.proxy.Close()
		lab.proxy = nil
	}
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
