package leases_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A KeepAlive started late in the trust window renews at once: its first
// renewal is due one interval after the grant, not one interval after the
// call. Started at 1.2 s of a 2 s lease (trust window 1.8 s, interval 667 ms),
// it once renewed at 1.87 s, after the window had run out and the lease was
// lost.
func TestKeepAliveStartedLate(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	renewed := make(chan struct{}, 1)
	c := newClient(t, db.Pool, &leases.Config{DisableWakeups: true, OnEvent: func(e leases.Event) {
		if e.Kind == leases.EventRenewed {
			select {
			case renewed <- struct{}{}:
			default:
			}
		}
	}})
	ctx := ctxTimeout(t, 30*time.Second)
	l, err := c.TryAcquire(ctx, "late", 2*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond) // the caller is slow to start KeepAlive
	kctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.KeepAlive(kctx, nil) }()
	select {
	case <-renewed:
	case <-l.Context().Done():
		t.Fatalf("the lease ended before KeepAlive's first renewal: %v", l.Err())
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("KeepAlive: %v", err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease after a late KeepAlive: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
