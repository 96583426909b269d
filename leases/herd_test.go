package leases_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// attempts counts the grant attempts (pgfence.try_acquire) sent through a
// pool, started and finished, alone or in a batch (the client batches the
// grant with its trace id or takeover check when telemetry is on).
type attempts struct{ started, ended atomic.Int64 }

// attemptKey marks a traced query that is a grant attempt.
type attemptKey struct{}

func (a *attempts) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (a *attempts) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, "pgfence.try_acquire(") {
		a.started.Add(1)
		a.ended.Add(1)
	}
}

func (a *attempts) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (a *attempts) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pgfence.try_acquire(") {
		a.started.Add(1)
		return context.WithValue(ctx, attemptKey{}, true)
	}
	return ctx
}

func (a *attempts) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(attemptKey{}) != nil {
		a.ended.Add(1)
	}
}

func countingPool(t *testing.T, url string, maxConns int32) (*pgxpool.Pool, *attempts) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	a := &attempts{}
	cfg.ConnConfig.Tracer = a
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, a
}

// listeningClients returns n clients made by listeningClient.
func listeningClients(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int, cfg leases.Config) []*leases.Client {
	t.Helper()
	clients := make([]*leases.Client, n)
	for i := range clients {
		clients[i] = listeningClient(t, ctx, pool, cfg)
	}
	return clients
}

// listeningClient returns a client on pool whose LISTEN connection is up (a
// waiter without it would poll).
func listeningClient(t *testing.T, ctx context.Context, pool *pgxpool.Pool, cfg leases.Config) *leases.Client {
	t.Helper()
	up, onEvent := events(leases.LogListenerUp)
	c := newClient(t, pool, &cfg)
	leases.SetOnEvent(c, onEvent)
	l, err := c.Acquire(ctx, "warm-up", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, up, leases.LogListenerUp, 10*time.Second)
	return c
}

// startWaiter starts c.Acquire(key) (and its release) and returns once that
// call's first attempt has been turned away; the channel gets its outcome.
func startWaiter(t *testing.T, ctx context.Context, c *leases.Client, key string, count *attempts) <-chan error {
	t.Helper()
	before := count.ended.Load()
	got := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, key, time.Minute, nil)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	for count.ended.Load() == before {
		select {
		case err := <-got:
			t.Fatalf("Acquire returned before its first attempt was turned away: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return got
}

// awaitWaiter waits for a waiter started by startWaiter to get its lease;
// stuck says what it means if it does not within 20 s.
func awaitWaiter(t *testing.T, got <-chan error, stuck string) {
	t.Helper()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal(stuck)
	}
}

// takeTurns has every client acquire key in a loop until grants leases were
// granted in all, calling then with each; it returns how many were granted.
// The leases are not kept alive: a winner that never releases lets its lease
// expire, as a crashed holder would.
func takeTurns(t *testing.T, ctx context.Context, clients []*leases.Client, key string, ttl time.Duration, announce bool, grants int64, then func(*leases.Lease) error) int64 {
	t.Helper()
	var (
		granted atomic.Int64
		wg      sync.WaitGroup
		errs    = make(chan error, len(clients))
	)
	for _, c := range clients {
		wg.Go(func() {
			for granted.Load() < grants {
				l, err := c.Acquire(ctx, key, ttl, &leases.AcquireOptions{NoKeepAlive: true, Announce: announce})
				if err == nil {
					granted.Add(1)
					err = then(l)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return granted.Load()
}

// A release wakes every client waiting for the key, but they do not all try
// at once: a woken waiter holds back a moment in a window that adapts to how
// often it loses. Twelve clients taking turns on one key would, without that,
// send about eleven attempts per hand-off (every woken waiter tries, one
// wins). With AcquireOptions.Announce a waiter that hears another's grant
// announced also skips its attempt; by default nothing is announced.
func TestReleaseDoesNotStampede(t *testing.T) {
	checkLeaks(t)
	const (
		waiters = 12
		grants  = 150
	)
	for _, announce := range []bool{false, true} {
		t.Run(fmt.Sprintf("announce=%v", announce), func(t *testing.T) {
			db := pgfencetest.NewDatabase(t)
			pool, count := countingPool(t, db.URL, waiters+4)
			ctx := ctxTimeout(t, 2*time.Minute)

			p := telemetrytest.New(t)
			clients := listeningClients(t, ctx, pool, waiters, leases.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer})
			before := count.started.Load()

			n := takeTurns(t, ctx, clients, "hot", time.Minute, announce, grants, func(l *leases.Lease) error {
				time.Sleep(time.Millisecond) // the critical section
				return l.Release(ctx)
			})
			sent := count.started.Load() - before
			perGrant := float64(sent) / float64(n)
			skipped := ops(p.Metrics(t), "attempt", "skipped")
			t.Logf("%d waiting clients: %d grants, %d attempts, %.2f attempts per grant, %d skipped", waiters, n, sent, perGrant, skipped)
			if sent < n {
				t.Fatalf("%d attempts counted for %d grants: the counter misses attempts", sent, n)
			}
			// Every grant is one attempt; each waiter's first attempt finds
			// the key held. A stampede is about waiters-1 attempts per grant;
			// holding back makes it about 2 to 3 on an idle machine, and up
			// to about 6 on a loaded one (under -race, with other packages'
			// tests and browsers running, 6.2 was seen once). Three quarters
			// of the stampede still tells the two apart.
			if perGrant > 0.75*(waiters-1) {
				t.Fatalf("%.2f attempts per grant with %d waiting clients: woken waiters stampede", perGrant, waiters)
			}
			switch {
			case announce && skipped < n:
				// Most woken waiters hear the winner and skip theirs.
				t.Errorf("attempt{skipped} = %d over %d grants, want at least one per grant", skipped, n)
			case !announce && skipped != 0:
				t.Errorf("attempt{skipped} = %d without Announce: a grant was announced", skipped)
			}
		})
	}
}

// Lifting a kill switch wakes the waiters at once; they do not wait for their
// next poll.
func TestResumeWakesWaiters(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	pool, count := countingPool(t, db.URL, 4)
	ctx := ctxTimeout(t, time.Minute)
	c := listeningClient(t, ctx, pool, leases.Config{PollInterval: time.Hour})
	operator := newClient(t, db.Pool, &leases.Config{DisableWakeups: true})
	if _, err := operator.PauseGrants(ctx, "deploy/", "rollout"); err != nil {
		t.Fatal(err)
	}

	// Its first attempt is refused; from then on it sleeps until woken (a
	// notification that comes meanwhile is kept for it).
	got := startWaiter(t, ctx, c, "deploy/job", count)
	if _, err := operator.ResumeGrants(ctx, "deploy/", "rollout done"); err != nil {
		t.Fatal(err)
	}
	awaitWaiter(t, got, "waiter not woken by the resume (its poll interval is an hour)")
}

// A holder that crashes never releases: every waiting client's timer is set
// to its expiry, and they would all try at once. They hold back there too,
// and (with Announce) a waiter that hears the winner's grant announced
// skips its attempt and sets its timer to the new lease's expiry instead of
// sleeping until its next poll. Each winner here abandons its lease, as a
// crashed holder would.
func TestExpiryDoesNotStampede(t *testing.T) {
	checkLeaks(t)
	const (
		waiters = 12
		grants  = 30
		ttl     = 200 * time.Millisecond
	)
	db := pgfencetest.NewDatabase(t)
	pool, count := countingPool(t, db.URL, waiters+4)
	ctx := ctxTimeout(t, 2*time.Minute)

	p := telemetrytest.New(t)
	clients := listeningClients(t, ctx, pool, waiters, leases.Config{MeterProvider: p.Meter, PollInterval: 2 * time.Second})
	before := count.started.Load()
	start := time.Now()
	// Each winner never releases: its lease expires, as a crashed holder's.
	n := takeTurns(t, ctx, clients, "crashy", ttl, true, grants, func(*leases.Lease) error { return nil })
	sent := count.started.Load() - before
	if sent < n {
		t.Fatalf("%d attempts counted for %d grants: the counter misses attempts", sent, n)
	}
	perGrant := float64(sent) / float64(n)
	skipped := ops(p.Metrics(t), "attempt", "skipped")
	t.Logf("%d waiting clients, holders that never release: %d grants in %s, %d attempts (%.2f per grant), %d skipped",
		waiters, n, time.Since(start).Round(time.Millisecond), sent, perGrant, skipped)
	// Attempts per grant do not tell here: without the hold-back, waiters
	// turned away by the contention filter sleep until their next poll and
	// miss the following expiries instead of crowding them. What shows the
	// hold-back working at expiries is the attempts it skipped.
	if skipped == 0 {
		t.Error("no attempt was skipped at an expiry")
	}
}

// A waiter that lost to the contention filter (another transaction was
// granting the key at that moment) learns no expiry and would sleep until its
// next poll. When the grant is announced, it sets its timer to that lease's
// expiry instead: if the new holder never releases, the waiter takes over at
// once, not an hour later.
func TestAnnouncedGrantSetsWaitersTimer(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	pool, count := countingPool(t, db.URL, 4)
	ctx := ctxTimeout(t, time.Minute)
	c := listeningClient(t, ctx, pool, leases.Config{PollInterval: time.Hour})

	// Another transaction "is granting" the key: the waiter's first attempt
	// is turned away with no expiry to wait for.
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.release('k', holder, token) FROM pgfence.try_acquire('k', interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// What a grant holds before its commit: the lease row's lock, FOR
	// UPDATE.
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = 'k' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	got := startWaiter(t, ctx, c, "k", count)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// A waiter of another process wins the key, announces it, and never
	// releases (it crashed).
	if _, err := db.Pool.Exec(ctx, `SELECT * FROM pgfence.try_acquire('k', interval '300 milliseconds', p_announce => true)`); err != nil {
		t.Fatal(err)
	}
	awaitWaiter(t, got, "waiter did not take over at the announced lease's expiry (its poll interval is an hour)")
}
