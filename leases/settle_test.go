package leases_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/pgbouncer"
	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A grant attempt that its client gave up (abandon_grant) is refused if it
// still arrives, from any client: a late request cannot contradict "nothing
// was granted". grant_probe reports the attempt's grant when it got there
// first.
func TestAbandonedGrantIsRefused(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	const late = "3b241101-e2bb-4255-8caf-4136c566a962"
	var abandoned, granted, live bool
	if err := db.Pool.QueryRow(ctx, `SELECT pgfence.abandon_grant('k', $1)`, late).Scan(&abandoned); err != nil || !abandoned {
		t.Fatalf("abandon_grant: %v %v", abandoned, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT granted FROM pgfence.grant_probe('k', $1)`, late).Scan(&granted); err != nil || granted {
		t.Fatalf("grant_probe of an attempt that never arrived: %v %v", granted, err)
	}
	_, err := db.Pool.Exec(ctx, `SELECT * FROM pgfence.try_acquire('k', interval '1 minute', '', $1)`, late)
	if pgerr.Code(err) != pgerr.CodeAbandoned {
		t.Fatalf("the abandoned attempt arriving late: %v, want PF013", err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) = 0 FROM pgfence.leases WHERE key = 'k'`).Scan(&live); err != nil || !live {
		t.Fatalf("the late attempt left a lease row: %v", err)
	}
	// An attempt that got there first is found by the probe.
	const first = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	if _, err := db.Pool.Exec(ctx, `SELECT * FROM pgfence.try_acquire('k', interval '1 minute', '', $1)`, first); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT pgfence.abandon_grant('k', $1)`, first).Scan(&abandoned); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT granted, live FROM pgfence.grant_probe('k', $1)`, first).Scan(&granted, &live); err != nil || !granted || !live {
		t.Fatalf("grant_probe of a committed grant: granted %v live %v, %v", granted, live, err)
	}
}

// Behind PgBouncer in transaction mode, a grant whose reply is lost is
// settled by its holder id: the lease is returned when the grant committed,
// and "nothing was granted" when the request never arrived. The old
// settlement terminated the backend by the connection's pid, which behind a
// pooler is PgBouncer's cancel key.
func TestLostGrantReplyBehindPgBouncer(t *testing.T) {
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	b, err := pgbouncer.Start(ctx, &pgbouncer.Config{Upstream: cluster.Addr(), Credential: pgcluster.At(cluster.Addr()).Credential(), PoolSize: 4})
	if err != nil {
		if errors.Is(err, pgbouncer.ErrNotFound) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	p := newProxy(t, b.ConnString(db.Name))
	// PgBouncer 1.18 in transaction mode: no named prepared statements.
	pool := proxiedPool(t, b.ConnString(db.Name), p, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	})
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	direct := leasesClient(t, db)

	trig := p.CutAfter(faultproxy.SQLContains("pgfence.try_acquire"))
	l, err := c.TryAcquire(ctx, "k", time.Minute, nil)
	<-trig.Done()
	if !trig.Fired() || !trig.Replied() {
		t.Fatalf("the proxy did not forward the grant and drop its answer (fired %v, replied %v)", trig.Fired(), trig.Replied())
	}
	if err != nil {
		t.Fatalf("a committed grant whose reply was lost, behind PgBouncer: %v, want the lease", err)
	}
	if st, err := direct.Get(ctx, "k"); err != nil || !st.Live || st.Holder != l.Holder() || st.Token != l.Token() {
		t.Fatalf("settled lease %s/%d, database %+v %v", l.Holder(), l.Token(), st, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	trig = p.CutBefore(faultproxy.SQLContains("pgfence.try_acquire"))
	if _, err := c.TryAcquire(ctx, "k", time.Minute, nil); !errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("a grant request that never arrived, behind PgBouncer: %v, want ErrUnavailable", err)
	}
	if !trig.Fired() {
		t.Fatal("the proxy did not cut the grant request")
	}
	if st, err := direct.Get(ctx, "k"); err != nil || st.Live {
		t.Fatalf("after a lost request: %+v %v", st, err)
	}
}

// A waiting Acquire whose attempt's reply is lost, and whose settlement
// cannot reach the database in time, goes on waiting; when the settlement
// later finds that the attempt did get the lease, it releases that grant and
// Acquire gets the key at once, instead of waiting a whole TTL behind its own
// grant.
func TestAcquireNotHeldBackByItsOwnLostGrant(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	p := newProxy(t, db.URL)
	pool := proxiedPool(t, db.URL, p)
	logs := &logBuffer{}
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, ResolveTimeout: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx := ctxTimeout(t, 2*time.Minute)
	// Warm the pool: the grant below goes over an open connection.
	if l, err := c.TryAcquire(ctx, "warm", time.Second, nil); err != nil {
		t.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	trig := p.CutAfter(faultproxy.SQLContains("pgfence.try_acquire"))
	p.SetRefuse(true) // the settlement and later attempts cannot connect
	type result struct {
		l   *leases.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := c.Acquire(ctx, "k", time.Minute, &leases.AcquireOptions{MaxWait: 30 * time.Second})
		done <- result{l, err}
	}()
	<-trig.Done()
	if !trig.Fired() || !trig.Replied() {
		t.Fatalf("the proxy did not forward the grant and drop its answer (fired %v, replied %v)", trig.Fired(), trig.Replied())
	}
	// Once the lost attempt's caller has stopped waiting for its settlement,
	// heal, and let the settlement find the grant in the background.
	for !strings.Contains(logs.String(), "a lost grant reply is settled in the background") {
		select {
		case r := <-done:
			t.Fatalf("Acquire returned before the database was reachable again: %v, %v", r.l, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	p.SetRefuse(false)
	r := <-done
	if r.err != nil {
		t.Fatalf("Acquire: %v, want the key once its lost grant was released", r.err)
	}
	defer r.l.Release(context.Background())
	var holder, events string
	if err := db.Pool.QueryRow(ctx, `SELECT holder::text, (SELECT string_agg(event, ' ' ORDER BY id) FROM pgfence.lease_events WHERE key = 'k')
  FROM pgfence.leases WHERE key = 'k'`).Scan(&holder, &events); err != nil {
		t.Fatal(err)
	}
	if holder != r.l.Holder() || events != "acquired released acquired" {
		t.Fatalf("Acquire returned holder %s; the database has %s after %q: want the lost grant released, then the waiter's", r.l.Holder(), holder, events)
	}
}

// An attempt whose context ends after it was sent has an unknown outcome:
// the caller hears ErrOutcomeUnknown at once, and the settlement in the
// background leaves the key free (the statement was canceled, or the grant
// it made is released) before Close returns, never held by a grant nobody
// received.
func TestCanceledAfterSentIsSettledBeforeClose(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	unblock := blockKey(t, ctx, pool, c, "blocked")
	actx, cancel := context.WithCancelCause(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(actx, "blocked", time.Minute, nil)
		got <- err
	}()
	waitLocked(t, pool)
	cancel(errors.New("gave up while the grant ran"))
	if err := <-got; !errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("canceled after it was sent: %v, want ErrOutcomeUnknown", err)
	}
	unblock()
	// Close waits for the settlement in the background.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var live bool
	if err := pool.QueryRow(ctx, `SELECT live FROM pgfence.lease_status WHERE key = 'blocked'`).Scan(&live); err != nil || live {
		t.Fatalf("after the settlement the key is live=%v (%v): a grant nobody received holds it", live, err)
	}
	other := newClient(t, pool, &leases.Config{DisableWakeups: true})
	if _, err := other.TryAcquire(ctx, "blocked", time.Minute, nil); err != nil {
		t.Fatalf("the key after the settlement: %v", err)
	}
}

// blockKey makes the next statement that writes key's lease row wait: it
// share-locks the row in a transaction of its own, as a lease-checked write
// does, and returns the function that ends that transaction. The key is granted and released first, so its row
// exists and a grant goes on to update it.
func blockKey(t *testing.T, ctx context.Context, pool *pgxpool.Pool, c *leases.Client, key string) (unblock func()) {
	t.Helper()
	l, err := c.TryAcquire(ctx, key, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A lease-checked write's share lock: a grant waits for it (one that
	// met another grant's lock would be turned away instead).
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = $1 FOR SHARE`, key); err != nil {
		t.Fatal(err)
	}
	done := false
	unblock = func() {
		if !done {
			done = true
			_ = tx.Rollback(ctx)
		}
	}
	t.Cleanup(unblock)
	return unblock
}

// Close ends a call that waits for the settlement of its lost grant reply at
// once (the error says the client closed and the outcome is unknown), and
// Close itself returns once the settlement gave up.
func TestCloseEndsAWaitForASettlement(t *testing.T) {
	checkLeaks(t)
	_, p, c := lostReplyRig(t, &leases.Config{DisableWakeups: true, ResolveTimeout: time.Minute})
	ctx := ctxTimeout(t, 2*time.Minute)
	trig := p.CutAfter(faultproxy.SQLContains("pgfence.try_acquire"))
	p.SetRefuse(true) // the settlement cannot connect
	done := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(ctx, "k", time.Minute, nil)
		done <- err
	}()
	<-trig.Done()
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	select {
	case err := <-done:
		if !errors.Is(err, leases.ErrClosed) || !errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Fatalf("TryAcquire ended by Close: %v, want ErrClosed and ErrOutcomeUnknown", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not end the wait for the settlement (ResolveTimeout is a minute)")
	}
	<-closed
	p.SetRefuse(false)
}

// lostReplyRig returns a database, a proxy in front of it and a client of
// cfg through the proxy whose pool holds an open connection, for tests
// that drop a grant's reply.
func lostReplyRig(t *testing.T, cfg *leases.Config) (*pgfencetest.Database, *faultproxy.Proxy, *leases.Client) {
	t.Helper()
	db := pgfencetest.NewDatabase(t)
	p := newProxy(t, db.URL)
	c := newClient(t, proxiedPool(t, db.URL, p), cfg)
	ctx := ctxTimeout(t, time.Minute)
	if l, err := c.TryAcquire(ctx, "warm", time.Second, nil); err != nil {
		t.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return db, p, c
}
