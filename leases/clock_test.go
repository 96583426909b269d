package leases_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// leaseLive reports whether the database still considers l's grant held and
// unexpired, by its own clock.
func leaseLive(t *testing.T, pool *pgxpool.Pool, l *leases.Lease) bool {
	t.Helper()
	var live bool
	err := pool.QueryRow(context.Background(), `SELECT holder = $2::uuid AND token = $3 AND released_at IS NULL AND clock_timestamp() < expires_at
FROM pgfence.leases WHERE key = $1`, l.Key(), l.Holder(), l.Token()).Scan(&live)
	if err != nil {
		t.Fatal(err)
	}
	return live
}

// Guarantee 1, client side: the trust window is counted on the client's
// monotonic clock from the send time of the last confirmed grant or renewal,
// so a client whose wall clock is a minute off the database's still ends the
// lease's context at that send time + TTL − margin: never before, and always
// before the database considers the lease expired. A window computed from the
// database's expires_at against the client's wall clock would end a minute
// early (clock ahead) or a minute after the database expired the lease
// (clock behind).
func TestTrustWindowIgnoresClientWallClock(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	const (
		ttl    = 1500 * time.Millisecond
		margin = 500 * time.Millisecond
		window = ttl - margin
	)
	for _, offset := range []time.Duration{time.Minute, -time.Minute} {
		t.Run(offset.String(), func(t *testing.T) {
			c, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true, SafetyMargin: margin})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			leases.SetClockOffset(c, offset)
			ctx := ctxTimeout(t, 30*time.Second)
			key := "clock" + offset.String()

			t0 := time.Now()
			// Renewed once by hand, then left to run out.
			l, err := c.TryAcquire(ctx, key, ttl, manual())
			if err != nil {
				t.Fatal(err)
			}
			// Renew well into the grant's window, so that a window kept from
			// the grant would end visibly before the renewal's.
			time.Sleep(300 * time.Millisecond)
			if err := l.Err(); err != nil && time.Since(t0) < window {
				t.Fatalf("the grant's trust window ended %s after the grant was sent, before TTL − margin (%s): %v", time.Since(t0), window, err)
			}
			r0 := time.Now()
			if err := l.Renew(ctx); err != nil {
				t.Fatal(err)
			}

			// Wait for the context to end, asking the database meanwhile
			// whether it still holds the lease.
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for ended := false; !ended; {
				select {
				case <-l.Context().Done():
					ended = true
				case <-tick.C:
					if !leaseLive(t, db.Pool, l) {
						t.Fatalf("the database expired the lease %s after the renewal was sent, and the lease's context is still open (or ended only now): %v",
							time.Since(r0), l.Err())
					}
				}
			}
			if early := time.Since(r0); early < window {
				t.Fatalf("the lease's context ended %s after the renewal was sent, before TTL − margin (%s): %v", early, window, l.Err())
			}
			if !leaseLive(t, db.Pool, l) {
				t.Fatalf("the lease's context ended only after the database expired the lease: %v", l.Err())
			}
		})
	}
}
