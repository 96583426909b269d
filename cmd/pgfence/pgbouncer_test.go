package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgbouncer"
	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// startPgBouncer starts a PgBouncer in front of cluster, stopped when t
// ends. Without the binary the test is skipped, except under CI=true.
func startPgBouncer(t *testing.T, cluster *pgfencetest.Cluster, cfg pgbouncer.Config) *pgbouncer.PgBouncer {
	t.Helper()
	cfg.Upstream = cluster.Addr()
	cfg.Credential = pgcluster.At(cluster.Addr()).Credential()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := pgbouncer.Start(ctx, &cfg)
	if err != nil {
		if errors.Is(err, pgbouncer.ErrNotFound) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// Every command works through PgBouncer in transaction mode with the URL
// as it is: nothing added for the pooler. This PgBouncer reuses server
// connections round robin and holds three, so consecutive transactions of
// one client reach different backends, as they do on a busy pooler: a
// prepared statement or any other session state the CLI relied on would be
// missing on the next one.
func TestEveryCommandThroughPgBouncer(t *testing.T) {
	t.Parallel()
	cluster := pgfencetest.NewCluster(t, &pgfencetest.ClusterOptions{Settings: map[string]string{"fsync": "off"}})
	b := startPgBouncer(t, cluster, pgbouncer.Config{RoundRobin: true, PoolSize: 3})
	for _, c := range goldenCases() {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			db := cluster.NewDatabase(t)
			if c.setup != nil {
				c.setup(t, ctx, db)
			}
			pids, err := b.Warm(ctx, db.Name, 3)
			if err != nil {
				t.Fatal(err)
			}
			if distinct := slices.Compact(slices.Sorted(slices.Values(pids))); len(distinct) != 3 {
				t.Fatalf("PgBouncer warmed %d backends, want 3", len(pids))
			}
			environ := map[string]string{"DATABASE_URL": b.ConnString(db.Name)}
			code, out, errOut := cli(t, environ, append(slices.Clone(c.args), "--json")...)
			if c.name == "bench_contention_tasks" {
				// Its producers hear that their task was applied by LISTEN,
				// which a transaction pooler does not carry: the run
				// refuses the pooler, saying so, before it writes anything.
				if code != exitFailure || !strings.Contains(errOut, "a transaction pooler answers at the URL") {
					t.Fatalf("%q through PgBouncer: code %d, want %d and the pooler named\n%s%s", c.args, code, exitFailure, out, errOut)
				}
				return
			}
			if code != c.code {
				t.Fatalf("%q --json through PgBouncer: code %d, want %d\n%s%s\nPgBouncer's log:\n%s",
					c.args, code, c.code, out, errOut, b.LogTail(20))
			}
			if c.name == "bench_contention" && !strings.Contains(errOut, "wake-ups off") {
				// LISTEN does not work through a transaction pooler: the
				// contention run's clients must poll.
				t.Errorf("bench contention through PgBouncer did not turn wake-ups off:\n%s", errOut)
			}
			docs := []string{out}
			if c.lines { // one JSON object per line
				docs = strings.Split(strings.TrimSpace(out), "\n")
			}
			for _, doc := range docs {
				var v map[string]any
				if err := json.Unmarshal([]byte(doc), &v); err != nil {
					t.Fatalf("%q --json through PgBouncer: %v\n%s", c.args, err, out)
				}
			}
		})
	}
}

// The doctor tells a transaction-mode pooler from a direct connection and
// from a session-mode pooler, whether the pooler is idle or busy: five runs
// out of five each time.
func TestDoctorDetectsPooler(t *testing.T) {
	t.Parallel()
	cluster := pgfencetest.NewCluster(t, &pgfencetest.ClusterOptions{Settings: map[string]string{"fsync": "off"}})
	lifo := startPgBouncer(t, cluster, pgbouncer.Config{PoolSize: 3})
	roundRobin := startPgBouncer(t, cluster, pgbouncer.Config{PoolSize: 3, RoundRobin: true})
	session := startPgBouncer(t, cluster, pgbouncer.Config{PoolMode: "session", PoolSize: 10})

	// Each run gets a database of its own, as a fresh doctor would meet.
	const runs = 5
	doctorPooler := func(t *testing.T, url func(db *pgfencetest.Database) string, want string, status string) {
		t.Helper()
		for run := range runs {
			db := cluster.NewDatabase(t)
			c := doctorCheck(t, map[string]string{"DATABASE_URL": url(db)}, "pooler")
			if c.Status != status || !strings.HasPrefix(c.Detail, want) {
				t.Fatalf("run %d of %d: pooler check = %+v, want %s %q…", run+1, runs, c, status, want)
			}
		}
	}
	direct := func(db *pgfencetest.Database) string { return db.URL }
	through := func(b *pgbouncer.PgBouncer) func(db *pgfencetest.Database) string {
		return func(db *pgfencetest.Database) string { return b.ConnString(db.Name) }
	}
	t.Run("direct", func(t *testing.T) {
		doctorPooler(t, direct, "direct connection", statusOK)
	})
	t.Run("session", func(t *testing.T) {
		doctorPooler(t, through(session), "session-mode pooler", statusOK)
	})
	t.Run("transaction idle", func(t *testing.T) {
		doctorPooler(t, through(lifo), "transaction-mode pooler", statusWarn)
	})
	t.Run("transaction idle round robin", func(t *testing.T) {
		doctorPooler(t, through(roundRobin), "transaction-mode pooler", statusWarn)
	})
	t.Run("transaction busy", func(t *testing.T) {
		// Four clients keep the pool's three server connections busy, so
		// the doctor's statements queue for whichever frees first.
		busy := cluster.NewDatabase(t)
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer func() { stop(); wg.Wait() }()
		for range 4 {
			cfg, err := pgx.ParseConfig(lifo.ConnString(busy.Name))
			if err != nil {
				t.Fatal(err)
			}
			cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close(context.Background())
				for ctx.Err() == nil {
					_, _ = conn.Exec(ctx, `SELECT pg_catalog.pg_sleep(0.002)`)
				}
			}()
		}
		doctorPooler(t, through(lifo), "transaction-mode pooler", statusWarn)
	})
}

// The CLI adds pgx's exec mode to a connection string only where the
// string does not name one.
func TestExecMode(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u@h:6432/db", "postgres://u@h:6432/db?default_query_exec_mode=exec"},
		{"postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write", "postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write&default_query_exec_mode=exec"},
		{"postgresql://u@h/db?default_query_exec_mode=simple_protocol", "postgresql://u@h/db?default_query_exec_mode=simple_protocol"},
		{"host=h port=6432 dbname=db", "host=h port=6432 dbname=db default_query_exec_mode=exec"},
		{"host=h default_query_exec_mode = cache_statement", "host=h default_query_exec_mode = cache_statement"},
		{"host=h application_name=not_default_query_exec_mode", "host=h application_name=not_default_query_exec_mode default_query_exec_mode=exec"},
	} {
		if got := withExecMode(tc.in); got != tc.want {
			t.Errorf("withExecMode(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if _, err := pgx.ParseConfig(withExecMode(tc.in)); err != nil {
			t.Errorf("withExecMode(%q) does not parse: %v", tc.in, err)
		}
	}
}

// After its login to the server failed (the server was down: a restart, a
// failover), PgBouncer refuses every new client for server_login_retry,
// even once the server is back. The CLI names the pooler and the setting
// (exit 3); the libraries call it ErrUnavailable for a read, and an unknown
// outcome for a statement that could have committed.
func TestPgBouncerServerLoginRetry(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster := pgfencetest.NewCluster(t, &pgfencetest.ClusterOptions{Settings: map[string]string{"fsync": "off"}})
	db := cluster.NewDatabase(t)
	// A window far longer than the restart, so the refusal is certain.
	b := startPgBouncer(t, cluster, pgbouncer.Config{ServerLoginRetry: 10 * time.Minute})
	environ := map[string]string{"DATABASE_URL": b.ConnString(db.Name)}
	if code, out, errOut := cli(t, environ, "leases", "list"); code != exitOK {
		t.Fatalf("leases list through PgBouncer: code %d\n%s%s", code, out, errOut)
	}
	if err := cluster.Stop(); err != nil {
		t.Fatal(err)
	}
	// PgBouncer accepts the client (it knows the server's parameters) and
	// fails to log in to the server for its first statement.
	start := time.Now()
	if code, _, errOut := cli(t, environ, "leases", "list", "--connect-timeout", "1s"); code != exitUnavailable {
		t.Fatalf("leases list with the server down: code %d, want %d\n%s", code, exitUnavailable, errOut)
	}
	// Bounded by the flag, not by the test's minute (a generous bound for a
	// loaded machine: the login attempt, the CLI's start, -race).
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("with the server down, leases list --connect-timeout 1s returned after %s", took.Round(time.Millisecond))
	}
	if err := cluster.Start(ctx); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := cli(t, environ, "leases", "list")
	if code != exitUnavailable || !strings.Contains(errOut, "the pooler at "+b.Addr()+" refused the connection: server login has been failing") ||
		!strings.Contains(errOut, "server_login_retry") {
		t.Fatalf("leases list once the server is back, within server_login_retry: code %d, want %d naming the pooler and server_login_retry\n%s", code, exitUnavailable, errOut)
	}
	pool, err := pgxpool.New(ctx, withExecMode(b.ConnString(db.Name)))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	client, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.List(ctx); !errors.Is(err, pgfence.ErrUnavailable) {
		t.Fatalf("List within server_login_retry: %v, want ErrUnavailable", err)
	}
	// A grant is one statement that commits on its own: PgBouncer answers
	// 08P01 whether or not it forwarded it (its "server conn crashed?" after
	// a lost reply too), so the client cannot call it "not sent".
	if _, err := client.TryAcquire(ctx, "jobs/a", time.Minute, nil); !errors.Is(err, pgfence.ErrOutcomeUnknown) || errors.Is(err, pgfence.ErrUnavailable) {
		t.Fatalf("TryAcquire within server_login_retry: %v, want ErrOutcomeUnknown", err)
	}
}
