package leases_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A function run by Do may release the lease itself once its critical part
// is done, to free the key early. The lease then ended by a confirmed
// release, not lost: Do returns nil, and the key is free.
func TestDoFnReleasesLease(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)

	err := c.Do(ctx, "k", 10*time.Second, nil, func(ctx context.Context, l *leases.Lease) error {
		return l.Release(ctx)
	})
	if err != nil {
		t.Fatalf("Do whose function released the lease: %v, want nil", err)
	}
	if st, err := c.Get(ctx, "k"); err != nil || st.Live {
		t.Fatalf("row after Do: %+v %v", st, err)
	}

	// A lease lost while fn runs is still reported.
	err = c.Do(ctx, "k", 10*time.Second, nil, func(ctx context.Context, l *leases.Lease) error {
		if _, err := c.ForceRelease(ctx, "k", "op"); err != nil {
			return err
		}
		_ = l.Release(context.Background())
		return nil
	})
	if !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("Do whose lease was force-released: %v, want ErrLeaseLost", err)
	}
}
