package migrations_test

import (
	"context"
	"testing"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestMain(m *testing.M) { pgfencetest.Main(m) }

func TestSmoke(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pgfence.leases`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var tok int64
	if err := pool.QueryRow(context.Background(), `SELECT pgfence.next_token(NULL)`).Scan(&tok); err != nil {
		t.Fatal(err)
	}
	t.Logf("token %d (%x)", tok, tok)
	_ = migrations.Latest()
}
