package tasks_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) {
	workerproc.Serve(map[string]workerproc.Handler{"consumer": serveConsumer})
	container.Main(m)
}

var (
	checkLeaks = leasetest.CheckLeaks
	newClient  = leasetest.NewClient
	ctxTimeout = leasetest.Context
)

// grantConsumer takes the consumer lease of key over SQL, for a minute, and
// returns its holder and token.
func grantConsumer(t testing.TB, ctx context.Context, pool *pgxpool.Pool, key string) (holder string, token int64) {
	t.Helper()
	if err := pool.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.try_acquire(pgfence.task_lease_key($1), interval '1 minute')`, key).
		Scan(&holder, &token); err != nil {
		t.Fatal(err)
	}
	return holder, token
}

// numbers returns the seq of every task of key by id (0: not numbered).
func numbers(t testing.TB, ctx context.Context, pool *pgxpool.Pool, key string) map[int64]int64 {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT id, coalesce(seq, 0) FROM pgfence.tasks WHERE key = $1`, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[int64]int64{}
	for rows.Next() {
		var id, seq int64
		if err := rows.Scan(&id, &seq); err != nil {
			t.Fatal(err)
		}
		m[id] = seq
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}
