package leases_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
)

// Guarantee 9: a waiting Acquire that hears no release notifications retries
// with capped exponential backoff and full jitter: the delay after the n-th
// failed attempt is random in [0, min(BackoffMax, BackoffMin·2ⁿ)] (at least
// 1ms), for every n, and it ends at the holder's expiry when that comes first.
func TestRetryDelayCappedWithJitter(t *testing.T) {
	const (
		backoffMin = 10 * time.Millisecond
		backoffMax = time.Second
		samples    = 200
	)
	pool, err := pgxpool.New(context.Background(), "postgres://unused@127.0.0.1:1/unused") // never connects
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, BackoffMin: backoffMin, BackoffMax: backoffMax})

	bound := backoffMin
	for attempt := 0; attempt <= 40; attempt++ {
		var lo, hi time.Duration
		distinct := map[time.Duration]bool{}
		for i := range samples {
			d, atExpiry := leases.Delay(c, attempt, 0)
			if atExpiry {
				t.Fatalf("attempt %d: the delay ends at an expiry nobody knows", attempt)
			}
			if d < time.Millisecond || d > bound {
				t.Fatalf("attempt %d: delay %s outside [1ms, %s]", attempt, d, bound)
			}
			if i == 0 || d < lo {
				lo = d
			}
			hi = max(hi, d)
			distinct[d] = true
		}
		// Uniform in [0, bound]: each of these fails with probability
		// below 0.75^200 (1e-25).
		if len(distinct) < samples/2 {
			t.Errorf("attempt %d: %d distinct delays in %d: no jitter", attempt, len(distinct), samples)
		}
		if hi < bound*3/4 {
			t.Errorf("attempt %d: longest delay %s, want up to %s", attempt, hi, bound)
		}
		if lo > max(time.Millisecond, bound/4) {
			t.Errorf("attempt %d: shortest delay %s: the jitter does not reach down to 0", attempt, lo)
		}
		bound = min(2*bound, backoffMax)
	}

	// The holder's expiry, when known, ends the sleep if it comes first:
	// remaining + up to BackoffMin, so that waiters do not all try at once.
	for _, attempt := range []int{0, 40} {
		const remaining = 5 * time.Millisecond
		atExpiry := 0
		for range samples {
			d, at := leases.Delay(c, attempt, remaining)
			if d > remaining+backoffMin {
				t.Fatalf("attempt %d, holder's expiry in %s: delay %s, want at most %s", attempt, remaining, d, remaining+backoffMin)
			}
			if at {
				atExpiry++
				if d < remaining {
					t.Fatalf("attempt %d: delay %s ends before the holder's expiry in %s", attempt, d, remaining)
				}
			}
		}
		if attempt == 40 && atExpiry < samples/2 {
			t.Errorf("attempt %d: %d of %d delays end at the holder's expiry in %s, want most (the backoff is up to %s)", attempt, atExpiry, samples, remaining, backoffMax)
		}
	}
	for range samples {
		if d, at := leases.Delay(c, 40, time.Hour); at || d > backoffMax {
			t.Fatalf("holder's expiry in 1h: delay %s (at expiry: %v), want at most BackoffMax %s", d, at, backoffMax)
		}
	}
}
