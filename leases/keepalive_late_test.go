package leases_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A keep-alive that starts late in the trust window renews at once: its
// first renewal is due one interval after the grant was sent, not one
// interval after the keep-alive started. Here the grant's reply is held in
// the network until 1.2 s of a 2 s lease (trust window 1.8 s, interval
// 667 ms); a keep-alive counting from its own start once renewed at 1.87 s,
// after the window had run out and the lease was lost.
func TestKeepAliveStartedLate(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	p := newProxy(t, db.URL)
	// One connection, its statements prepared by the warm-up below: a
	// statement prepared while the replies are held would never be sent.
	pool := proxiedPool(t, db.URL, p, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	renewed := make(chan struct{}, 1)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	leases.SetOnEvent(c, func(e leases.LogEvent) {
		if e.Kind == leases.LogRenewed {
			select {
			case renewed <- struct{}{}:
			default:
			}
		}
	})
	ctx := ctxTimeout(t, 30*time.Second)
	if l, err := c.TryAcquire(ctx, "warm", 2*time.Second, manual()); err != nil {
		t.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	p.SetHold(faultproxy.ServerToClient, true)
	sent := time.Now()
	type result struct {
		l   *leases.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := c.TryAcquire(ctx, "late", 2*time.Second, nil)
		got <- result{l, err}
	}()
	// The grant commits; its reply waits in the proxy.
	for {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE key = 'late' AND released_at IS NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(time.Until(sent.Add(1200 * time.Millisecond)))
	p.SetHold(faultproxy.ServerToClient, false)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	l := r.l
	t.Logf("granted %s after the grant was sent", time.Since(sent))
	select {
	case <-renewed:
	case <-l.Context().Done():
		t.Fatalf("the lease ended before the keep-alive's first renewal: %v", l.Err())
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease after a late keep-alive: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
