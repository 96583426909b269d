package pgfence_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func grant(t testing.TB, db execerQuerier, key string) leaseRow {
	t.Helper()
	l := leaseRow{Key: key, Holder: newHolder()}
	if err := db.QueryRow(context.Background(), grantSQL, key, l.Holder, "30 seconds").Scan(&l.Token); err != nil {
		t.Fatalf("grant %s: %v", key, err)
	}
	return l
}

type execerQuerier interface {
	execer
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func TestLeaseChecked(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	update := `UPDATE kv SET v = $1 WHERE k = 'a'`
	reason := func(err error) string {
		var e *pgfence.LeaseLostError
		if !errors.As(err, &e) || !errors.Is(err, pgfence.ErrLeaseLost) {
			t.Fatalf("want *LeaseLostError, got %v", err)
		}
		return e.Reason
	}

	missing := leaseRow{Key: "job", Holder: newHolder(), Token: 1}
	if _, err := pgfence.Exec(ctx, pool, pgfence.Checked(missing.lease()), update, "x"); reason(err) != "missing" {
		t.Fatal(err)
	}
	l := grant(t, pool, "job")
	if n, err := pgfence.Exec(ctx, pool, pgfence.Checked(l.lease()), update, "held"); err != nil || n != 1 {
		t.Fatalf("held lease: %d rows, %v", n, err)
	}
	if _, err := pgfence.Write(ctx, pool, pgfence.Checked(l.lease()), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, update, "held tx")
		return err
	}); err != nil {
		t.Fatalf("held lease, lease-checked Write: %v", err)
	}
	wrongHolder := l
	wrongHolder.Holder = newHolder()
	if _, err := pgfence.Exec(ctx, pool, pgfence.Checked(wrongHolder.lease()), update, "x"); reason(err) != "taken_over" {
		t.Fatal(err)
	}
	wrongToken := l
	wrongToken.Token++
	if _, err := pgfence.Exec(ctx, pool, pgfence.Checked(wrongToken.lease()), update, "x"); reason(err) != "taken_over" {
		t.Fatal(err)
	}
	mustExec(t, pool, expireSQL, "job")
	if _, err := pgfence.Exec(ctx, pool, pgfence.Checked(l.lease()), update, "x"); reason(err) != "expired" {
		t.Fatal(err)
	}
	l2 := grant(t, pool, "job")
	_, err := pgfence.Exec(ctx, pool, pgfence.Checked(l.lease()), update, "x")
	var e *pgfence.LeaseLostError
	if reason(err) != "taken_over" || !errors.As(err, &e) || e.Current != l2.Token || e.Key != "job" {
		t.Fatalf("after takeover: %v", err)
	}
	mustExec(t, pool, `UPDATE pgfence.leases SET released_at = clock_timestamp() WHERE key = 'job'`)
	if _, err := pgfence.Write(ctx, pool, pgfence.Checked(l2.lease()), func(context.Context, pgx.Tx) error { return nil }); reason(err) != "released" {
		t.Fatal(err)
	}
	var v string
	if err := pool.QueryRow(ctx, `SELECT v FROM kv WHERE k = 'a'`).Scan(&v); err != nil || v != "held tx" {
		t.Fatalf("row %q %v", v, err)
	}
	if _, err := pgfence.Exec(ctx, pool, pgfence.Checked(leaseRow{Key: "job", Holder: l2.Holder}.lease()), update, "x"); !errors.Is(err, pgfence.ErrInvalid) {
		t.Fatalf("zero token: %v", err)
	}
	for _, h := range []string{"", "not-a-uuid", l2.Holder + "0"} {
		if _, err := pgfence.Exec(ctx, pool, pgfence.Checked(leaseRow{Key: "job", Holder: h, Token: l2.Token}.lease()), update, "x"); !errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("holder %q: want ErrInvalid, got %v", h, err)
		}
	}
	// The forms PostgreSQL accepts are accepted (and compared as UUIDs).
	l3 := grant(t, pool, "job3")
	upper := "{" + strings.ToUpper(strings.ReplaceAll(l3.Holder, "-", "")) + "}"
	if _, err := pgfence.Exec(ctx, pool, pgfence.Checked(leaseRow{Key: "job3", Holder: upper, Token: l3.Token}.lease()), update, "held tx"); err != nil {
		t.Fatalf("holder %s: %v", upper, err)
	}
}

// A lease-checked write holds FOR SHARE on the lease row: a takeover of the
// (meanwhile expired) lease waits until the write's transaction ends, so the
// write commits while the lease is still held and the takeover comes after.
func TestLeaseCheckedBlocksTakeover(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	l := grant(t, pool, "job")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := pgfence.Exec(ctx, tx, pgfence.Checked(l.lease()), `UPDATE kv SET v = 'old holder' WHERE k = 'a'`); err != nil {
		t.Fatal(err)
	}
	// A takeover attempt (here with a grant that would succeed on an expired
	// lease) waits for the share lock: with a short lock_timeout it fails.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	mustExec(t, conn, `SET lock_timeout = '200ms'`)
	_, err = conn.Exec(ctx, grantSQL, "job", newHolder(), "30 seconds")
	if !errors.Is(pgfence.MapError(err), pgfence.ErrLockTimeout) {
		t.Fatalf("takeover while a lease-checked write is open: want lock timeout, got %v", err)
	}
	mustExec(t, conn, `RESET lock_timeout`)
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, expireSQL, "job")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("lease row changed under a lease-checked write: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	l2 := grant(t, pool, "job")
	if l2.Token <= l.Token {
		t.Fatalf("takeover token %d not above %d", l2.Token, l.Token)
	}
}

// Expiry is judged by the database clock at the moment of the check
// (clock_timestamp()), not by the start of the writer's transaction (now()):
// a transaction opened while the lease was live cannot write after it
// expired. The lease row is moved in time, no sleep.
func TestLeaseCheckedUsesClockTimestamp(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	l := grant(t, pool, "clock/1")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var t0 time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&t0); err != nil {
		t.Fatal(err)
	}
	// Live at the transaction's start, expired a microsecond later.
	if _, err := pool.Exec(ctx, `UPDATE pgfence.leases SET granted_at = $2::timestamptz - interval '1 minute', expires_at = $2::timestamptz + interval '1 microsecond' WHERE key = $1`,
		l.Key, t0); err != nil {
		t.Fatal(err)
	}
	_, err = pgfence.Exec(ctx, tx, pgfence.Checked(l.lease()), `SELECT 1`)
	var lost *pgfence.LeaseLostError
	if !errors.As(err, &lost) || lost.Reason != "expired" {
		t.Fatalf("write in a transaction that began before the lease expired: %v, want *LeaseLostError with reason expired", err)
	}
}
