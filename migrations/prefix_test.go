package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Two services share a database, each a pgfence_app member with its own
// prefix. Neither can use the other's lease keys, fenced resources or
// idempotency scopes (PF014, ErrNotGranted), block them (hold the lease row
// with check_lease, park fair waiters for ages, squat keys), nor read their
// rows; each keeps working within its own prefix.
func TestPrefixGrantsIsolateServices(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	service := func(prefix string) (string, *pgxpool.Pool) {
		name, pool := loginRole(t, db, "pgfence_app")
		if _, err := db.Pool.Exec(ctx, `SELECT pgfence.revoke_prefix($1::regrole, $2)`, name, ""); err != nil {
			t.Fatal(err)
		}
		var added bool
		if err := db.Pool.QueryRow(ctx, `SELECT pgfence.grant_prefix($1::regrole, $2)`, name, prefix).Scan(&added); err != nil || !added {
			t.Fatalf("grant %q to %s: %v %v", prefix, name, added, err)
		}
		return name, pool
	}
	_, orders := service("orders/")
	_, billing := service("billing/")

	ordersLeases, err := leases.New(orders, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ordersLeases.Close()
	billingLeases, err := leases.New(billing, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer billingLeases.Close()

	// Each within its own prefix.
	l, err := ordersLeases.TryAcquire(ctx, "orders/42", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, orders, l, `SELECT 1`); err != nil {
		t.Fatalf("orders writes its own resource: %v", err)
	}

	// Outside it: refused, whatever the path.
	notGranted := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, pgfence.ErrNotGranted) && pgerr.Code(err) != pgerr.CodeNotGranted {
			t.Errorf("billing %s: %v, want PF014 / ErrNotGranted", what, err)
		}
	}
	_, err = billingLeases.TryAcquire(ctx, "orders/43", time.Minute, nil)
	notGranted("TryAcquire orders/43", err)
	if !errors.Is(err, pgfence.ErrNotGranted) {
		t.Errorf("TryAcquire outside the prefix: %v, want pgfence.ErrNotGranted", err)
	}
	_, err = pgfence.Exec(ctx, billing, pgfence.LeaseOf("orders/42", "", l.Token()), `SELECT 1`)
	notGranted("fence orders/42 with orders' own token", err)
	_, err = pgfence.Exec(ctx, billing, pgfence.Checked(l), `SELECT 1`)
	notGranted("check_lease of orders' lease (it would hold its row FOR SHARE)", err)
	for what, q := range map[string]string{
		"renew":                     `SELECT * FROM pgfence.renew('orders/42', $1, $2, interval '1 minute')`,
		"release":                   `SELECT * FROM pgfence.release('orders/42', $1, $2)`,
		"abandon_grant":             `SELECT pgfence.abandon_grant('orders/42', $1) WHERE $2::bigint > 0`,
		"record a forged rejection": `SELECT pgfence.record_fence_rejection('orders/42', $2::bigint, $2::bigint + 1, 'stale_token') WHERE $1::uuid IS NOT NULL`,
		"queue in orders' line":     `SELECT pgfence.lease_queue_turn('orders/42', $1, interval '1 hour') WHERE $2::bigint > 0`,
	} {
		_, err := billing.Exec(ctx, q, l.Holder(), l.Token())
		notGranted(what, err)
	}
	billingKeys, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = billingKeys.Claim(ctx, billing, idempotency.Request{Scope: "orders/api", Key: "k1", Payload: []byte("x")})
	notGranted("idempotency claim in orders' scope", err)
	if !errors.Is(err, idempotency.ErrNotGranted) {
		t.Errorf("Claim outside the prefix: %v, want idempotency.ErrNotGranted", err)
	}
	// The atomic claim travels with its BEGIN: the refusal aborts that
	// transaction, which is rolled back before the connection goes back to
	// the pool (a pool discards a connection left in a transaction).
	conns := billing.Stat().NewConnsCount()
	for range 3 {
		_, err = billingKeys.Do(ctx, billing, idempotency.Request{Scope: "orders/api", Key: "k2", Payload: []byte("x")},
			func(context.Context, pgx.Tx) ([]byte, error) { return nil, errors.New("ran outside its prefix") })
		notGranted("atomic idempotency claim in orders' scope", err)
		if !errors.Is(err, idempotency.ErrNotGranted) {
			t.Errorf("Do outside the prefix: %v, want idempotency.ErrNotGranted", err)
		}
	}
	if n := billing.Stat().NewConnsCount() - conns; n != 0 {
		t.Errorf("refused atomic claims cost %d new connections, want 0 (the aborted transaction is rolled back)", n)
	}

	// Rows: billing sees none of orders'.
	var n int
	for _, table := range []string{"pgfence.leases", "pgfence.lease_status", "pgfence.lease_events", "pgfence.fences"} {
		if err := billing.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 0 {
			t.Errorf("billing reads %d rows of %s (%v), want none of orders'", n, table, err)
		}
		if err := orders.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n == 0 {
			t.Errorf("orders reads %d rows of %s (%v), want its own", n, table, err)
		}
	}
	if _, err := billing.Exec(ctx, `SELECT * FROM pgfence.leases WHERE key = 'orders/42' FOR SHARE`); err == nil {
		t.Error("billing locked orders' lease row directly")
	}

	// The orders lease is untouched: orders renews and releases it.
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("orders renews after billing's attempts: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A revoked prefix: nothing more under it.
	var removed bool
	if err := db.Pool.QueryRow(ctx, `SELECT pgfence.revoke_prefix($1::regrole, 'orders/')`, mustRole(t, ctx, orders)).Scan(&removed); err != nil || !removed {
		t.Fatalf("revoke: %v %v", removed, err)
	}
	_, err = ordersLeases.TryAcquire(ctx, "orders/42", time.Minute, nil)
	if !errors.Is(err, pgfence.ErrNotGranted) {
		t.Errorf("TryAcquire after the revoke: %v, want ErrNotGranted", err)
	}
	var grants []string
	if err := db.Pool.QueryRow(ctx, `SELECT array_agg(prefix) FROM pgfence.prefix_grants`).Scan(&grants); err != nil || len(grants) != 1 || grants[0] != "billing/" {
		t.Errorf("prefix grants: %v %v, want billing's only", grants, err)
	}
}

func mustRole(t *testing.T, ctx context.Context, pool *pgxpool.Pool) string {
	t.Helper()
	var name string
	if err := pool.QueryRow(ctx, `SELECT session_user`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}
