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

// A client remembers the highest timeline it saw in a token and refuses a
// grant from an older one: that comes from a demoted primary.
func TestOlderTimelineRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgfencetest.NewPool(t)
	c, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "epoch/a", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := leases.SeenEpoch(c), l.Token()>>40; got != want {
		t.Fatalf("seen epoch %d after a grant with token %d, want %d", got, l.Token(), want)
	}
	// As if a promoted standby (timeline +1) had granted to this client before.
	leases.SetSeenEpoch(c, l.Token()>>40+1)
	if _, err := c.TryAcquire(ctx, "epoch/b", time.Minute, nil); !errors.Is(err, pgfence.ErrNotPrimary) {
		t.Fatalf("grant from an older timeline: %v, want ErrNotPrimary", err)
	}
	// A higher timeline is accepted and remembered.
	leases.SetSeenEpoch(c, 0)
	if _, err := pool.Exec(ctx, `SELECT pgfence.raise_token_floor((pgfence.token_epoch() + 1) << 40, 'simulate a promotion')`); err != nil {
		t.Fatal(err)
	}
	l2, err := c.TryAcquire(ctx, "epoch/c", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if leases.SeenEpoch(c) != l2.Token()>>40 || l2.Token()>>40 != l.Token()>>40+1 {
		t.Fatalf("token %d: seen epoch %d, want %d", l2.Token(), leases.SeenEpoch(c), l.Token()>>40+1)
	}
	_ = l.Release(ctx)
	_ = l2.Release(ctx)
}
