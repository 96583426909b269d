package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestInspectKeys(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	store := newStore(t, nil)
	before := time.Now().Add(-time.Minute)
	for _, key := range []string{"o-1", "o-2"} {
		if _, err := store.Do(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: key},
			func(context.Context, pgx.Tx) ([]byte, error) { return []byte("secret-result"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	o, err := store.Claim(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: "o-3"})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Attempt.Advance(ctx, "charged", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Do(ctx, db.Pool, idempotency.Request{Scope: "other", Key: "x"},
		func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	pool := trappedPool(t, db)

	keys, err := idempotency.Keys(ctx, pool, "orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, k := range keys {
		names = append(names, k.Key)
	}
	if strings.Join(names, " ") != "o-3 o-2 o-1" {
		t.Fatalf("Keys(orders) = %v, want the scope's keys, newest first", names)
	}
	leased, done := keys[0], keys[2]
	if leased.Mode != "leased" || leased.Status != "in_progress" || leased.Epoch != 1 || leased.RecoveryPoint != "charged" ||
		leased.LeaseExpiresAt.IsZero() || !leased.CompletedAt.IsZero() || !leased.ExpiresAt.IsZero() {
		t.Errorf("leased key in progress: %+v", leased)
	}
	if done.Mode != "atomic" || done.Status != "succeeded" || done.CreatedAt.Before(before) || done.CompletedAt.IsZero() ||
		done.ExpiresAt.Before(done.CompletedAt) || !done.LeaseExpiresAt.IsZero() || done.FailureCode != "" {
		t.Errorf("completed atomic key: %+v", done)
	}
	if newest, err := idempotency.Keys(ctx, pool, "orders", 1); err != nil || len(newest) != 1 || newest[0].Key != "o-3" {
		t.Errorf("Keys(orders, 1) = %+v, %v; want o-3 only", newest, err)
	}

	k, ok, err := idempotency.LookupKey(ctx, pool, "orders", "o-1")
	if err != nil || !ok || k != done {
		t.Errorf("LookupKey(orders, o-1) = %+v, %v, %v; want %+v", k, ok, err, done)
	}
	if _, ok, err := idempotency.LookupKey(ctx, pool, "orders", "x"); ok || err != nil {
		t.Errorf("LookupKey of a key of another scope: %v, %v; want not found", ok, err)
	}
	for _, err := range []error{
		func() error { _, err := idempotency.Keys(ctx, pool, "", 0); return err }(),
		func() error { _, err := idempotency.Keys(ctx, pool, "orders", -1); return err }(),
		func() error { _, err := idempotency.Keys(ctx, pool, "orders", idempotency.MaxKeysLimit+1); return err }(),
		func() error { _, _, err := idempotency.LookupKey(ctx, pool, "orders", "a\x00"); return err }(),
		func() error {
			_, _, err := idempotency.LookupKey(ctx, pool, strings.Repeat("s", idempotency.MaxScopeBytes+1), "k")
			return err
		}(),
	} {
		if !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("want ErrInvalid, got %v", err)
		}
	}
}

// trappedPool returns a pool on db whose sessions find, on their
// search_path before pg_catalog, functions and operators that raise when
// called: a statement that works there is immune to search_path.
func trappedPool(t *testing.T, db *pgfencetest.Database) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		CREATE SCHEMA trap;
		CREATE FUNCTION trap.sprung() RETURNS boolean LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'search_path trap sprung'; END$$;
		CREATE FUNCTION trap.text_eq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT trap.sprung()';
		CREATE OPERATOR trap.= (LEFTARG = text, RIGHTARG = text, FUNCTION = trap.text_eq)`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "trap, pg_catalog, public"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `SELECT 'a'::pg_catalog.text = 'a'`); err == nil || !strings.Contains(err.Error(), "trap sprung") {
		t.Fatalf("an unqualified = with the trap on the search_path: %v; want the trap", err)
	}
	return pool
}
