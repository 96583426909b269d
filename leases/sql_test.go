package leases_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// sqlConn is a plain SQL client on the simple protocol, as psql or a worker in
// another language (or PgBouncer in transaction mode) would talk.
func sqlConn(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// The SQL functions and the Go client are one protocol: a lease taken with SQL
// blocks Go and the other way round, each side can renew and release the
// other's grant with its holder and token, SQL releases wake Go waiters, and
// tokens increase across both.
func TestSQLAndGoAgree(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	conn := sqlConn(t, db.URL)
	ctx := ctxTimeout(t, 30*time.Second)
	// Listening, and waiters poll once a minute: only the SQL release's
	// notification can wake the Go waiter below within its deadline.
	c := listeningClient(t, ctx, db.Pool, leases.Config{PollInterval: time.Minute, BackoffMax: time.Minute})

	var (
		holder string
		token  int64
	)
	if err := conn.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.acquire('k', interval '30 seconds', 'python-worker')`).Scan(&holder, &token); err != nil {
		t.Fatal(err)
	}
	_, err := c.TryAcquire(ctx, "k", time.Second, nil)
	var held *leases.HeldError
	if !errors.As(err, &held) || held.Remaining < 29*time.Second {
		t.Fatalf("Go TryAcquire on a SQL-held key: %v", err)
	}
	if st, err := c.Get(ctx, "k"); err != nil || st.Holder != holder || st.Token != token || st.HolderInfo != "python-worker" {
		t.Fatalf("Get %+v %v", st, err)
	}
	if _, err := conn.Exec(ctx, `SELECT * FROM pgfence.acquire('k', interval '30 seconds')`); pgerr.Code(err) != pgerr.CodeLeaseHeld {
		t.Fatalf("SQL acquire of a held key: %v, want PF003", err)
	}
	var acquired bool
	if err := conn.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire('k', interval '30 seconds')`).Scan(&acquired); err != nil || acquired {
		t.Fatalf("SQL try_acquire of a held key: %v %v", acquired, err)
	}
	if _, err := conn.Exec(ctx, `SELECT * FROM pgfence.renew('k', $1::uuid, $2, interval '30 seconds')`, holder, token); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT * FROM pgfence.renew('k', $1::uuid, $2, interval '30 seconds')`, holder, token+1); pgerr.Code(err) != pgerr.CodeLeaseNotHeld {
		t.Fatalf("SQL renew with a wrong token: %v, want PF002", err)
	}

	// A Go waiter is woken by the SQL release's notification (the key would
	// otherwise stay held for half a minute, and the waiter not poll for one).
	got := make(chan *leases.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		// Renewed below by SQL and by hand, not in the background.
		l, err := c.Acquire(ctx, "k", 10*time.Second, &leases.AcquireOptions{MaxWait: 10 * time.Second, NoKeepAlive: true})
		errc <- err
		got <- l
	}()
	time.Sleep(200 * time.Millisecond)
	var released bool
	var status string
	if err := conn.QueryRow(ctx, `SELECT released, status FROM pgfence.release('k', $1::uuid, $2)`, holder, token).Scan(&released, &status); err != nil || !released || status != "released" {
		t.Fatalf("SQL release: %v %s %v", released, status, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l.Token() <= token {
		t.Fatalf("Go token %d after SQL token %d", l.Token(), token)
	}

	// SQL renews and releases the Go grant with its holder and token.
	if _, err := conn.Exec(ctx, `SELECT * FROM pgfence.renew('k', $1::uuid, $2, interval '10 seconds')`, l.Holder(), l.Token()); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT released, status FROM pgfence.release('k', $1::uuid, $2)`, l.Holder(), l.Token()).Scan(&released, &status); err != nil || status != "released" {
		t.Fatalf("SQL release of a Go grant: %s %v", status, err)
	}
	if err := l.Renew(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("Go renew after a SQL release: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Go release after a SQL release (already released): %v", err)
	}

	// lease_status, the SQL view behind Client.List, agrees with Get.
	var live bool
	if err := conn.QueryRow(ctx, `SELECT live FROM pgfence.lease_status WHERE key = 'k'`).Scan(&live); err != nil || live {
		t.Fatalf("lease_status live %v %v", live, err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_events WHERE key = 'k'`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("%d events, want 4 (2 grants, 2 releases): %v", n, err)
	}
}

// Grants and renewals commit with synchronous_commit at least on, whatever the
// session says; a non-durable release turns it off only in a transaction that
// has written nothing else.
func TestSynchronousCommit(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	conn := sqlConn(t, db.URL)
	ctx := ctxTimeout(t, 30*time.Second)
	setting := func(tx pgx.Tx) string {
		var s string
		if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if _, err := conn.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var holder string
	var token int64
	if err := tx.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.acquire('k', interval '10 seconds')`).Scan(&holder, &token); err != nil {
		t.Fatal(err)
	}
	if s := setting(tx); s != "on" {
		t.Fatalf("synchronous_commit in a grant's transaction: %s", s)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	tx, _ = conn.Begin(ctx)
	if _, err := tx.Exec(ctx, `SELECT * FROM pgfence.renew('k', $1::uuid, $2, interval '10 seconds')`, holder, token); err != nil {
		t.Fatal(err)
	}
	if s := setting(tx); s != "on" {
		t.Fatalf("synchronous_commit in a renewal's transaction: %s", s)
	}
	_ = tx.Rollback(ctx)

	if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	// A transaction that already wrote keeps its durability.
	tx, _ = conn.Begin(ctx)
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE w (x int)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT * FROM pgfence.release('k', $1::uuid, $2, false)`, holder, token); err != nil {
		t.Fatal(err)
	}
	if s := setting(tx); s != "on" {
		t.Fatalf("non-durable release weakened a transaction that had written: %s", s)
	}
	_ = tx.Rollback(ctx)
	// On its own, the release skips the flush.
	tx, _ = conn.Begin(ctx)
	if _, err := tx.Exec(ctx, `SELECT * FROM pgfence.release('k', $1::uuid, $2, false)`, holder, token); err != nil {
		t.Fatal(err)
	}
	if s := setting(tx); s != "off" {
		t.Fatalf("synchronous_commit in a non-durable release: %s", s)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
