package election_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestMain(m *testing.M) {
	workerproc.Serve(map[string]workerproc.Handler{"replica": serveReplica})
	pgfencetest.Main(m)
}

// checkLeaks registers a goroutine leak check that runs after every cleanup
// registered later (pools, clients, elections). Call it first in a test.
func checkLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, ignore,
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

// backdate moves the expiry of key's current grant to the database's now + d,
// as if time had passed, and wakes the key's watchers (expiry is not
// announced).
func backdate(t testing.TB, pool *pgxpool.Pool, key string, d time.Duration) {
	t.Helper()
	tag, err := pool.Exec(context.Background(),
		`UPDATE pgfence.leases SET expires_at = greatest(granted_at, clock_timestamp() + $2::bigint * interval '1 microsecond') WHERE key = $1`,
		key, d.Microseconds())
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("backdate %q: %v (%d rows)", key, err, tag.RowsAffected())
	}
	if _, err := pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, leases.NotifyChannel, key); err != nil {
		t.Fatal(err)
	}
}

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
