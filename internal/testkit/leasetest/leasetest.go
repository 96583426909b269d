// Package leasetest holds the helpers the tests of package leases and of the
// packages built on it (election, job) share: a goroutine leak check, a client
// closed with the test, a context bounded by the test, moving a grant's
// expiry by the database clock, and pools behind a fault proxy.
package leasetest

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
)

// CheckLeaks registers a goroutine leak check that runs after every cleanup
// registered later (pools, clients, elections). Call it first in a test, and
// never in a parallel one: the check sees every goroutine of the process, so
// the pools of tests running beside it would count as its leaks.
func CheckLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, ignore,
			// The shared test cluster's process reapers, started lazily by the
			// first test that needs a database, and worker processes.
			goleak.IgnoreAnyFunction("os/exec.(*Cmd).Start.func2"),
			goleak.IgnoreAnyFunction("os/exec.(*Cmd).Wait"),
			goleak.IgnoreAnyFunction("os.(*Process).Wait"),
		)
	})
}

// The channels and the LISTEN connection's application_name of package
// leases (unexported there: the SQL protocol's names, which tests of other
// clients rely on too).
const (
	// ReleaseChannel is notified by pgfence.release and
	// pgfence.force_release, with the key as payload.
	ReleaseChannel = "pgfence_lease_released"
	// GrantChannel is notified by an announced grant.
	GrantChannel = "pgfence_lease_granted"
	// ChangeChannel is notified by an announced renewal or a holder info
	// change.
	ChangeChannel = "pgfence_lease_changed"
	// ListenerApplicationName is the application_name of a client's LISTEN
	// connection.
	ListenerApplicationName = "pgfence-leases-listener"
)

// NewClient returns a leases client on pool, closed when t ends.
func NewClient(t testing.TB, pool *pgxpool.Pool, cfg *leases.Config) *leases.Client {
	t.Helper()
	c, err := leases.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Context returns a context that ends after d or when t ends.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Backdate moves the expiry of key's current grant to the database's now + d
// (d may be negative, never before the grant), as if time had passed.
func Backdate(t testing.TB, pool *pgxpool.Pool, key string, d time.Duration) {
	t.Helper()
	tag, err := pool.Exec(context.Background(),
		`UPDATE pgfence.leases SET expires_at = greatest(granted_at, clock_timestamp() + $2::bigint * interval '1 microsecond') WHERE key = $1`,
		key, d.Microseconds())
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("backdate %q: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

// BackdateAndWake is Backdate, then wakes the key's waiters and watchers as a
// release would (an expiry is not announced).
func BackdateAndWake(t testing.TB, pool *pgxpool.Pool, key string, d time.Duration) {
	t.Helper()
	Backdate(t, pool, key, d)
	if _, err := pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, ReleaseChannel, key); err != nil {
		t.Fatal(err)
	}
}

// NewProxy starts a fault proxy in front of the server behind dbURL, closed
// when t ends.
func NewProxy(t testing.TB, dbURL string) *faultproxy.Proxy {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// ProxiedPool returns a pool on dbURL whose connections go through p, closed
// when t ends; configure, if any, adjusts its configuration first.
func ProxiedPool(t testing.TB, dbURL string, p *faultproxy.Proxy, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	url, err := p.ConnString(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
