package election_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) {
	workerproc.Serve(map[string]workerproc.Handler{"replica": serveReplica})
	container.Main(m)
}

// The helpers every leases test package shares; backdate also wakes the
// key's watchers (an expiry is not announced).
var (
	checkLeaks = leasetest.CheckLeaks
	newClient  = leasetest.NewClient
	ctxTimeout = leasetest.Context
	backdate   = leasetest.BackdateAndWake
)

// newProxy starts a fault proxy in front of the server at addr (host:port).
func newProxy(t testing.TB, addr string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// serverAddr is the host:port of the server behind url.
func serverAddr(t testing.TB, url string) string {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
}

// eventually polls cond every 5 ms until it holds, failing after d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
