package leases_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// grantSent signals each grant attempt sent through a pool.
type grantSent chan struct{}

func (g grantSent) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pgfence.try_acquire(") {
		select {
		case g <- struct{}{}:
		default:
		}
	}
	return ctx
}

func (g grantSent) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Close may be called while grant attempts are in flight, and it waits for
// the read-backs of lost grant replies. A read-back started by an attempt on
// another goroutine, before Close (the first attempt here) or after it (the
// second), must not race with Close's wait: an Add from zero to a
// sync.WaitGroup that is not ordered before its Wait is a misuse (the race
// detector reports it; done concurrently, it can panic). Run with -race.
func TestCloseWhileGrantRepliesAreLost(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	proxy := newProxy(t, db.URL)
	sent := make(grantSent, 1)
	pool := proxiedPool(t, db.URL, proxy, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = sent
		cfg.MaxConns = 2
	})
	c, err := leases.New(pool, &leases.Config{DisableWakeups: true, ResolveTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, time.Minute)

	// Two idle connections: the attempts below need no new one.
	conns := make([]*pgxpool.Conn, 2)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, conn := range conns {
		conn.Release()
	}

	// A second grant attempt will wait at the server for the row lock of
	// its key, which the test holds FOR SHARE, as a lease-checked write
	// does (a grant in progress would turn it away instead).
	direct := leasesClient(t, db)
	l, err := direct.TryAcquire(ctx, "b", 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = 'b' FOR SHARE`); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		l, err := c.TryAcquire(ctx, "b", 10*time.Second, nil)
		if err == nil {
			_ = l.Release(ctx)
		}
		second <- err
	}()
	<-sent
	for {
		var waiting bool
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
  WHERE wait_event_type = 'Lock' AND query LIKE '%pgfence.try_acquire(%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}

	// A first grant's reply is lost; its read-back cannot connect (the
	// proxy refuses) and goes on until ResolveTimeout.
	trig := proxy.CutAfter(faultproxy.SQLContains("pgfence.try_acquire"))
	proxy.SetRefuse(true)
	first := make(chan error, 1)
	go func() {
		l, err := c.TryAcquire(ctx, "a", 10*time.Second, nil)
		if err == nil {
			_ = l.Release(ctx)
		}
		first <- err
	}()
	<-sent
	<-trig.Done()
	time.Sleep(100 * time.Millisecond) // the read-back has started

	if err := c.Close(); err != nil { // waits for the first read-back
		t.Errorf("Close: %v", err)
	}
	// The second reply is lost now: its read-back starts after Close.
	proxy.CutAll()
	proxy.Heal()
	_ = tx.Rollback(ctx)
	// The first attempt could not be settled in its ResolveTimeout (the proxy
	// refused the read-back): its outcome is unknown. The second found its
	// grant, or reports what stopped it, as documented.
	if e1 := <-first; !errors.Is(e1, pgfence.ErrOutcomeUnknown) {
		t.Errorf("first attempt: %v, want ErrOutcomeUnknown", e1)
	}
	if e2 := <-second; e2 != nil && !errors.Is(e2, pgfence.ErrOutcomeUnknown) && !errors.Is(e2, pgfence.ErrUnavailable) && !errors.Is(e2, leases.ErrClosed) {
		t.Errorf("second attempt: %v, want a lease, ErrOutcomeUnknown, ErrUnavailable or ErrClosed", e2)
	}
}
