package leases_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
)

// With a long BackoffMin (any up to MaxTTLLimit is accepted), doubling it
// must not overflow: the retry delay of a waiting Acquire stays capped at
// BackoffMax, and the LISTEN connection's reconnect delay at its own cap,
// instead of wrapping around to nothing (a burst of 1ms polls, or reconnects
// without any backoff while the database is down).
func TestBackoffDoesNotOverflow(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://unused@127.0.0.1:1/unused") // never connects
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, backoffMin := range []time.Duration{time.Minute, time.Hour, 24 * time.Hour} {
		c := newClient(t, pool, &leases.Config{DisableWakeups: true, BackoffMin: backoffMin, BackoffMax: 24 * time.Hour})
		for attempt := 0; attempt <= 40; attempt++ {
			// Full jitter: every one of 20 samples falls below a 1000th of
			// the cap with probability 1e-60.
			var longest time.Duration
			for range 20 {
				d, _ := leases.Delay(c, attempt, 0)
				longest = max(longest, d)
			}
			if longest < backoffMin/1000 {
				t.Errorf("BackoffMin %s, attempt %d: retry delays at most %s", backoffMin, attempt, longest)
			}
			longest = 0
			for range 20 {
				longest = max(longest, leases.ListenerDelay(c, attempt))
			}
			if longest < time.Second/1000 || longest > 5*time.Second {
				t.Errorf("BackoffMin %s, attempt %d: listener reconnect delays at most %s, want up to 5s", backoffMin, attempt, longest)
			}
		}
	}
}
