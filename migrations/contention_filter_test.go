package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// try_acquire turns a caller away at once while another transaction is
// granting the same key (the contention filter), but a role outside pgfence
// that holds the filter's advisory lock cannot make a free key look held:
// advisory locks need no privilege, the lease row's lock does.
func TestContentionFilter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	_, app := loginRole(t, db, "pgfence_app")
	_, outsider := loginRole(t, db, "")

	// "released" has a row whose grant ended; "fresh" was never granted.
	mustExecPool(t, app, `SELECT pgfence.release('released', holder, token) FROM pgfence.try_acquire('released', interval '1 minute')`)
	const lockKey = `hashtextextended('pgfence.lease:' || $1, 0)`
	conn, err := outsider.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, key := range []string{"released", "fresh"} {
		var locked bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+lockKey+`)`, key).Scan(&locked); err != nil || !locked {
			t.Fatalf("outsider: advisory lock of %q: %v, %v", key, locked, err)
		}
		var acquired bool
		if err := app.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire($1, interval '1 minute')`, key).Scan(&acquired); err != nil {
			t.Fatal(err)
		}
		if !acquired {
			t.Errorf("key %q is free, but an outsider holding its advisory lock made it look held", key)
		}
	}

	// What makes an advisory lock count is out of the outsider's reach.
	for _, q := range []string{
		`SELECT 1 FROM pgfence.leases WHERE key = 'released' FOR UPDATE`,
		`LOCK TABLE pgfence.leases IN ROW EXCLUSIVE MODE`,
	} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, q)
		_ = tx.Rollback(ctx)
		denied(t, "outsider: "+q, err)
	}

	// A grant in progress: the advisory lock and the row lock, as the
	// granting transaction holds them between its upsert and its commit.
	mustExecPool(t, app, `SELECT pgfence.release('busy', holder, token) FROM pgfence.try_acquire('busy', interval '1 minute')`)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+lockKey+`)`, "busy"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = 'busy' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// Without the filter the call would queue on the row lock until the
	// statement timeout.
	other, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if _, err := other.Exec(ctx, `SET LOCAL statement_timeout = '5s'`); err != nil {
		t.Fatal(err)
	}
	var acquired bool
	if err := other.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire('busy', interval '1 minute')`).Scan(&acquired); err != nil {
		t.Fatalf("try_acquire during another grant: %v, want an immediate 'not acquired'", err)
	}
	if acquired {
		t.Fatal("try_acquire granted a key whose grant another transaction holds locked")
	}
	// pgfence.acquire says so, rather than "held for another 00:00:00".
	_, err = app.Exec(ctx, `SELECT * FROM pgfence.acquire('busy', interval '1 minute')`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "PF003" || !strings.Contains(pe.Message, "is being granted to another holder right now") {
		t.Fatalf("acquire during another grant: %v, want PF003 saying the key is being granted", err)
	}
}
