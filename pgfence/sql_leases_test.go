package pgfence_test

import (
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The bridge the package documents for a service whose handle is a *sql.DB
// (lib/pq): a pgx pool opened from the same DSN, in either of lib/pq's forms,
// runs the leases client; its *leases.Lease fences the service's own
// *sql.Tx; after a takeover the old holder is refused.
func TestLeasesFromTheSameDSN(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	newKV(t, db.Pool)
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	keyValue := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, cfg.User, cfg.Database)
	for name, dsn := range map[string]string{"url": db.URL, "keyword-value": keyValue} {
		t.Run(name, func(t *testing.T) {
			sdb := openDB(t, "postgres", dsn)
			pool, err := pgxpool.New(ctx, dsn)
			if err != nil {
				t.Fatalf("pgxpool on lib/pq's DSN %q: %v", dsn, err)
			}
			defer pool.Close()
			client, err := leases.New(pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()

			key := "kv:a"
			// Not kept alive: the old holder pauses past its lease.
			old, err := client.TryAcquire(ctx, key, 200*time.Millisecond, &leases.AcquireOptions{NoKeepAlive: true})
			if err != nil {
				t.Fatal(err)
			}
			write := func(l pgfence.Lease, v string) error {
				tx, err := sdb.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				if _, err := pgfence.WriteSQL(ctx, tx, l, sqlFn(set(v, l.Token()))); err != nil {
					return err
				}
				return tx.Commit()
			}
			if err := write(old, "old"); err != nil {
				t.Fatalf("write under the lease: %v", err)
			}
			// Another client waits until the old holder's lease has expired
			// (the database clock decides) and takes over.
			waiter, err := leases.New(pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer waiter.Close()
			current, err := waiter.Acquire(ctx, key, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := write(current, "current"); err != nil {
				t.Fatalf("the new holder's write: %v", err)
			}
			if err := write(old, "late"); !errors.Is(err, pgfence.ErrStaleToken) {
				t.Fatalf("the old holder's late write: %v, want ErrStaleToken", err)
			}
			if _, err := pgfence.WriteSQL(ctx, sdb, pgfence.Checked(old), sqlFn(set("late leased", old.Token()))); !errors.Is(err, pgfence.ErrLeaseLost) {
				t.Fatalf("the old holder's lease-checked write: %v, want ErrLeaseLost", err)
			}
			if err := current.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if v, _ := kvRow(t, db.Pool); v != "current" {
				t.Fatalf("row %q", v)
			}
		})
	}
}

// With pgx's driver one pool serves both: the *sql.DB is opened from the pgx
// pool that runs the leases client.
func TestLeasesOnePoolWithPgxDriver(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	newKV(t, db.Pool)
	sdb := stdlib.OpenDBFromPool(db.Pool)
	defer sdb.Close()
	client, err := leases.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	l, err := client.Acquire(ctx, "kv:a", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if _, err := pgfence.WriteSQL(ctx, sdb, pgfence.Checked(l), sqlFn(set("one pool", l.Token()))); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.ExecSQL(ctx, sdb, l, `UPDATE kv SET token = $1 WHERE k = 'a'`, l.Token()); err != nil {
		t.Fatal(err)
	}
	if v, token := kvRow(t, db.Pool); v != "one pool" || token != l.Token() {
		t.Fatalf("row %q token %d", v, token)
	}
}

// Without the leases package a service grants, renews and releases through
// SQL in autocommit on its *sql.DB (lib/pq here) and wraps the grant with
// pgfence.LeaseOf: the fenced and lease-checked writes hold as with a
// *leases.Lease.
func TestLeasesThroughSQL(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	newKV(t, db.Pool)
	sdb := openDB(t, "postgres", db.URL)
	tryAcquire := func() pgfence.Lease {
		t.Helper()
		var ok bool
		var holder sql.NullString
		var token sql.NullInt64
		if err := sdb.QueryRowContext(ctx, `SELECT acquired, holder::text, token FROM pgfence.try_acquire('kv:a', interval '1 minute')`).Scan(&ok, &holder, &token); err != nil || !ok {
			t.Fatalf("try_acquire: %v %v", ok, err)
		}
		return pgfence.LeaseOf("kv:a", holder.String, token.Int64)
	}
	l := tryAcquire()
	if _, err := sdb.ExecContext(ctx, `SELECT * FROM pgfence.renew('kv:a', $1, $2, interval '1 minute')`, l.Holder(), l.Token()); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if _, err := pgfence.WriteSQL(ctx, sdb, pgfence.Checked(l), sqlFn(set("leased", l.Token()))); err != nil {
		t.Fatalf("lease-checked write: %v", err)
	}
	if _, err := sdb.ExecContext(ctx, `SELECT pgfence.release('kv:a', $1, $2)`, l.Holder(), l.Token()); err != nil {
		t.Fatalf("release: %v", err)
	}
	var lost *pgfence.LeaseLostError
	if _, err := pgfence.WriteSQL(ctx, sdb, pgfence.Checked(l), sqlFn(set("released", l.Token()))); !errors.As(err, &lost) || lost.Reason != "released" {
		t.Fatalf("write after release: %v, want a *LeaseLostError (released)", err)
	}
	next := tryAcquire()
	if _, err := pgfence.WriteSQL(ctx, sdb, next, sqlFn(set("next", next.Token()))); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.WriteSQL(ctx, sdb, l, sqlFn(set("old", l.Token()))); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("the released holder's fenced write: %v, want ErrStaleToken", err)
	}
	if v, _ := kvRow(t, db.Pool); v != "next" {
		t.Fatalf("row %q", v)
	}
}
