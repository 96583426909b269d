package leases_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A panicking fn does not leave its lease kept alive: Do releases the lease
// (which ends its keep-alive) and lets the panic continue.
func TestDoReleasesWhenFnPanics(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, nil)
	ctx := ctxTimeout(t, 30*time.Second)

	var lease *leases.Lease
	recovered := func() (r any) {
		defer func() { r = recover() }()
		_ = c.Do(ctx, "p", 900*time.Millisecond, nil, func(_ context.Context, l *leases.Lease) error {
			lease = l
			panic("boom")
		})
		return nil
	}()
	if recovered != "boom" {
		t.Fatalf("recovered %v, want the fn's panic", recovered)
	}
	if !errors.Is(lease.Err(), leases.ErrReleased) {
		t.Fatalf("lease after the panic: %v", lease.Err())
	}
	if st, err := c.Get(ctx, "p"); err != nil || st.Live {
		t.Fatalf("lease still live after fn panicked: %+v %v", st, err)
	}
	l, err := c.TryAcquire(ctx, "p", time.Second, nil)
	if err != nil {
		t.Fatalf("key still held after fn panicked: %v", err)
	}
	_ = l.Release(ctx)
}
