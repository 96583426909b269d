package leases_test

import (
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestCount(t *testing.T) {
	checkLeaks(t)
	ctx := ctxTimeout(t, time.Minute)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})

	if n, err := c.Count(ctx); err != nil || n != (leases.Counts{}) {
		t.Fatalf("Count with no lease = %+v, %v", n, err)
	}
	for _, key := range []string{"live/1", "live/2", "expired", "released"} {
		l, err := c.TryAcquire(ctx, key, time.Minute, manual()) // "expired" is backdated
		if err != nil {
			t.Fatal(err)
		}
		if key == "released" {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	backdate(t, pool, "expired", -time.Second)
	n, err := c.Count(ctx)
	if want := (leases.Counts{Keys: 4, Live: 2, Expired: 1, Released: 1}); err != nil || n != want {
		t.Fatalf("Count = %+v, %v; want %+v", n, err, want)
	}
}
