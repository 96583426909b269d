package leases_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envWorker); mode != "" {
		os.Exit(runWorker(mode))
	}
	pgfencetest.Main(m)
}

// checkLeaks registers a goroutine leak check that runs after every cleanup
// registered later (pools, clients). Call it first in a test.
func checkLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, ignore,
			// The shared test cluster's process reapers, started lazily by the
			// first test that needs a database.
			goleak.IgnoreAnyFunction("os/exec.(*Cmd).Start.func2"),
			goleak.IgnoreAnyFunction("os/exec.(*Cmd).Wait"),
			goleak.IgnoreAnyFunction("os.(*Process).Wait"),
		)
	})
}

func newClient(t testing.TB, pool *pgxpool.Pool, cfg *leases.Config) *leases.Client {
	t.Helper()
	c, err := leases.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// backdate moves the expiry of key's current grant to the database's now + d
// (d may be negative), as if time had passed.
func backdate(t testing.TB, pool *pgxpool.Pool, key string, d time.Duration) {
	t.Helper()
	tag, err := pool.Exec(context.Background(),
		`UPDATE pgfence.leases SET expires_at = greatest(granted_at, clock_timestamp() + $2::bigint * interval '1 microsecond') WHERE key = $1`,
		key, d.Microseconds())
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("backdate %q: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

// newProxy starts a fault proxy in front of the server behind dbURL.
func newProxy(t testing.TB, dbURL string) *faultproxy.Proxy {
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

// proxiedPool returns a pool on dbURL whose connections go through p;
// configure, if any, adjusts its configuration first.
func proxiedPool(t testing.TB, dbURL string, p *faultproxy.Proxy, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
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
