package leases_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envWorker); mode != "" {
		os.Exit(runWorker(mode))
	}
	pgfencetest.Main(m)
}

// The helpers every leases test package shares.
var (
	checkLeaks = leasetest.CheckLeaks
	newClient  = leasetest.NewClient
	ctxTimeout = leasetest.Context
	backdate   = leasetest.Backdate
)

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
