package job_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestMain(m *testing.M) {
	workerproc.Serve(map[string]workerproc.Handler{"jobber": serveJobber})
	pgfencetest.Main(m)
}

// checkLeaks registers a goroutine leak check that runs after every cleanup
// registered later. Call it first in a test.
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

// backdate moves the expiry of key's current grant to the database's now,
// as if its TTL had passed, and wakes its waiters (an expiry is not
// announced).
func backdate(t testing.TB, pool *pgxpool.Pool, key string) {
	t.Helper()
	tag, err := pool.Exec(context.Background(),
		`UPDATE pgfence.leases SET expires_at = greatest(granted_at, clock_timestamp()) WHERE key = $1`, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("backdate %q: %v (%d rows)", key, err, tag.RowsAffected())
	}
	if _, err := pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, leases.NotifyChannel, key); err != nil {
		t.Fatal(err)
	}
}

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
