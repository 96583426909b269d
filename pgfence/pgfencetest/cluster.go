package pgfencetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
)

// Cluster is a local PostgreSQL cluster owned by one test, for fault tests that
// stop, restart or kill the server without disturbing other tests.
type Cluster struct {
	c   *pgcluster.Cluster
	srv *server

	mu    sync.Mutex
	pools []*pgxpool.Pool // of the databases NewDatabase made
}

// ClusterOptions configures [NewCluster]. A nil *ClusterOptions uses defaults.
type ClusterOptions struct {
	// Settings are server settings (-c name=value), e.g. "synchronous_commit".
	Settings map[string]string
}

// NewCluster starts a dedicated local cluster, stopped and removed when t ends.
// It needs local PostgreSQL binaries (a DSN or a container cannot be
// restarted by the test): without them the test is skipped, or fails under CI=true.
func NewCluster(t testing.TB, opts *ClusterOptions) *Cluster {
	t.Helper()
	if opts == nil {
		opts = &ClusterOptions{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, &pgcluster.Config{Settings: opts.Settings})
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// A test that lost its server says why, in the server's words.
			t.Logf("pgfencetest: the cluster's server log, last lines:\n%s", c.LogTail(40))
		}
		_ = c.Close()
	})
	return &Cluster{c: c, srv: &server{adminURL: c.ConnString("postgres")}}
}

// NewDatabase creates a fresh migrated database on this cluster, dropped when t
// ends (if the server is running then).
func (c *Cluster) NewDatabase(t testing.TB) *Database {
	t.Helper()
	db := newDatabase(t, c.srv)
	c.mu.Lock()
	c.pools = append(c.pools, db.Pool)
	c.mu.Unlock()
	return db
}

// resetPools closes the connections of the pools of this cluster's databases:
// after a restart they lead to a server process that is gone, and the next
// query on one (a pool does not check a connection idle for less than a
// second) would fail with the shutdown's FATAL.
func (c *Cluster) resetPools() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.pools {
		p.Reset()
	}
}

// Addr is the server's host:port on 127.0.0.1, for a proxy to sit in front of.
func (c *Cluster) Addr() string { return c.c.Addr() }

// Stop shuts the server down as pg_ctl stop -m fast does (open transactions
// roll back, clients are disconnected, a checkpoint is written) and waits
// until it has exited. [Cluster.Kill] crashes it instead.
func (c *Cluster) Stop() error { return c.c.Stop(pgcluster.Fast) }

// Start starts a stopped server on the same port and waits until it is
// ready. The pools of the cluster's databases then open new connections.
func (c *Cluster) Start(ctx context.Context) error {
	defer c.resetPools()
	return c.c.Start(ctx)
}

// Restart stops the server as Stop does and starts it again on the same
// port, and resets the pools of the cluster's databases as Start does.
func (c *Cluster) Restart(ctx context.Context) error {
	defer c.resetPools()
	return c.c.Restart(ctx, pgcluster.Fast)
}

// Kill sends SIGKILL to the server's processes (a crash); Start runs crash
// recovery. A test that fails prints the end of the server's log.
func (c *Cluster) Kill() error { return c.c.Kill() }
