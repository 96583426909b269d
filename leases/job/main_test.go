package job_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) {
	workerproc.Serve(map[string]workerproc.Handler{"jobber": serveJobber})
	container.Main(m)
}

// The helpers every leases test package shares.
var (
	checkLeaks = leasetest.CheckLeaks
	newClient  = leasetest.NewClient
	ctxTimeout = leasetest.Context
)

// backdate ends key's current grant now by the database clock and wakes its
// waiters.
func backdate(t testing.TB, pool *pgxpool.Pool, key string) {
	t.Helper()
	leasetest.BackdateAndWake(t, pool, key, 0)
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
