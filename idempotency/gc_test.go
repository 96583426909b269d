package idempotency_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestGCDeletesExpiredInBatchesOnly: expired completed keys go, in batches;
// live results, leased claims in progress (even with an expired lease), an
// uncommitted atomic claim and a row a concurrent transaction has locked stay.
func TestGCDeletesExpiredInBatchesOnly(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	store := newStore(t, nil)

	// 25 expired completed keys, atomic and leased.
	if _, err := pool.Exec(ctx, `INSERT INTO pgfence.idempotency_keys
       (scope, key, fingerprint, mode, status, result, retention, created_at, updated_at, completed_at, expires_at)
SELECT 'gc', 'expired-' || i, sha256(''), CASE WHEN i % 2 = 0 THEN 'atomic' ELSE 'leased' END, 'succeeded', '',
       interval '1 hour', clock_timestamp() - interval '2 hours', clock_timestamp() - interval '2 hours',
       clock_timestamp() - interval '2 hours', clock_timestamp() - interval '1 hour'
  FROM generate_series(1, 25) i`); err != nil {
		t.Fatal(err)
	}
	// A live result.
	noop := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("kept"), nil }
	if _, err := store.Do(ctx, pool, idempotency.Request{Scope: "gc", Key: "live"}, noop); err != nil {
		t.Fatal(err)
	}
	// A leased claim in progress whose owner is long gone: still in flight
	// (its recovery point matters to the next attempt).
	claimNew(t, store, pool, idempotency.Request{Scope: "gc", Key: "leased"})
	expireLease(t, pool, "leased")
	// An expired key locked by a concurrent transaction (a claim reusing it).
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(ctx) }()
	if _, err := locker.Exec(ctx, `SELECT 1 FROM pgfence.idempotency_keys WHERE key = 'expired-25' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// An uncommitted atomic claim.
	claimTx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = claimTx.Rollback(ctx) }()
	if _, err := claimTx.Exec(ctx, `SELECT pgfence.idempotency_claim_atomic('gc', 'uncommitted', sha256(''), '1s', '1h')`); err != nil {
		t.Fatal(err)
	}

	res, err := gcStore.GC(ctx, pool, &idempotency.GCOptions{BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 24 || res.Batches != 3 {
		t.Fatalf("GC = %+v, want 24 deleted in 3 batches (10, 10, 4)", res)
	}
	rows, err := pool.Query(ctx, `SELECT key FROM pgfence.idempotency_keys ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"expired-25", "leased", "live"}; !equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}

	// Once unlocked the last expired key goes; MaxBatches bounds a run.
	_ = locker.Rollback(ctx)
	res, err = gcStore.GC(ctx, pool, &idempotency.GCOptions{MaxBatches: 1})
	if err != nil || res.Deleted != 1 || res.Batches != 1 {
		t.Fatalf("second GC = %+v, %v", res, err)
	}
	if _, err := gcStore.GC(ctx, pool, &idempotency.GCOptions{BatchSize: -1}); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("negative batch: %v", err)
	}
	// The SQL function takes an integer: a larger batch is refused by name,
	// not sent (pgx would fail to encode it, reported as an unknown outcome).
	if over := int64(math.MaxInt32) + 1; int64(int(over)) == over { // 64-bit int
		if _, err := gcStore.GC(ctx, pool, &idempotency.GCOptions{BatchSize: int(over)}); !errors.Is(err, idempotency.ErrInvalid) ||
			!strings.Contains(err.Error(), "GCOptions.BatchSize must be 0 to 2147483647") {
			t.Fatalf("batch over int32: %v, want ErrInvalid naming GCOptions.BatchSize", err)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMigrationDownUp: the idempotency migration's Down removes everything
// its Up created, so Up applies again.
func TestMigrationDownUp(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	m, err := migrations.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.DownTo(ctx, 3); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname LIKE 'idempotency%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d idempotency functions left after Down, %v", n, err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := newStore(t, nil).Do(ctx, pool, idempotency.Request{Scope: "s", Key: "k"},
		func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
}

// TestSchemaRefusesNonsenseRows: writers that bypass the functions still
// cannot store a row that breaks the state machine.
func TestSchemaRefusesNonsenseRows(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	const cols = `(scope, key, fingerprint, mode, status, owner, lease_expires_at, result, failure_code, retention, completed_at, expires_at)`
	for name, values := range map[string]string{
		"empty key":                  `('s', '', sha256(''), 'atomic', 'succeeded', NULL, NULL, '', NULL, '1h', now(), now() + interval '1h')`,
		"short fingerprint":          `('s', 'k', 'x', 'atomic', 'succeeded', NULL, NULL, '', NULL, '1h', now(), now() + interval '1h')`,
		"unknown status":             `('s', 'k', sha256(''), 'atomic', 'done', NULL, NULL, '', NULL, '1h', now(), now() + interval '1h')`,
		"unknown mode":               `('s', 'k', sha256(''), 'magic', 'succeeded', NULL, NULL, '', NULL, '1h', now(), now() + interval '1h')`,
		"success without result":     `('s', 'k', sha256(''), 'atomic', 'succeeded', NULL, NULL, NULL, NULL, '1h', now(), now() + interval '1h')`,
		"failure without code":       `('s', 'k', sha256(''), 'atomic', 'failed', NULL, NULL, NULL, NULL, '1h', now(), now() + interval '1h')`,
		"completed without expiry":   `('s', 'k', sha256(''), 'atomic', 'succeeded', NULL, NULL, '', NULL, '1h', now(), NULL)`,
		"expires before completion":  `('s', 'k', sha256(''), 'atomic', 'succeeded', NULL, NULL, '', NULL, '1h', now(), now() - interval '1h')`,
		"in progress with result":    `('s', 'k', sha256(''), 'leased', 'in_progress', gen_random_uuid(), now(), 'x', NULL, '1h', NULL, NULL)`,
		"leased claim without lease": `('s', 'k', sha256(''), 'leased', 'in_progress', gen_random_uuid(), NULL, NULL, NULL, '1h', NULL, NULL)`,
		"atomic claim with owner":    `('s', 'k', sha256(''), 'atomic', 'in_progress', gen_random_uuid(), NULL, NULL, NULL, '1h', NULL, NULL)`,
		"completed with owner":       `('s', 'k', sha256(''), 'leased', 'succeeded', gen_random_uuid(), NULL, '', NULL, '1h', now(), now() + interval '1h')`,
	} {
		_, err := pool.Exec(ctx, `INSERT INTO pgfence.idempotency_keys `+cols+` VALUES `+values)
		if code := pgerr.Code(err); code != "23514" {
			t.Errorf("%s: %v, want a check violation", name, err)
		}
	}
	// A sane row is accepted.
	if _, err := pool.Exec(ctx, `INSERT INTO pgfence.idempotency_keys `+cols+
		` VALUES ('s', 'k', sha256(''), 'leased', 'in_progress', gen_random_uuid(), now() + interval '1m', NULL, NULL, '1h', NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
}

// gcStore runs GC with the defaults.
var gcStore = func() *idempotency.Store {
	s, err := idempotency.NewStore(nil)
	if err != nil {
		panic(err)
	}
	return s
}()
