package idempotency_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// BenchmarkAtomicOverhead compares one business INSERT in a bare transaction
// (BEGIN, INSERT, COMMIT) with the same INSERT through Store.Do (BEGIN,
// claim, INSERT, result + COMMIT in one pipeline), each with a fresh key. The two are interleaved in one loop so that
// fsync jitter hits both alike; the ratio is reported.
//
//	go test -run '^$' -bench AtomicOverhead -benchtime 2000x ./idempotency
func BenchmarkAtomicOverhead(b *testing.B) {
	pool := pgfencetest.NewPool(b)
	createCharges(b, pool)
	store := newStore(b, nil)
	ctx := context.Background()
	var bare, atomic time.Duration
	bareOps, atomicOps := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		order := "order-" + strconv.Itoa(i)
		start := time.Now()
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := charge(order, 1)(ctx, tx); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		bare += time.Since(start)
		bareOps = append(bareOps, time.Since(start))

		start = time.Now()
		if _, err := store.Do(ctx, pool, idempotency.Request{Scope: "bench", Key: order + ":charge", Payload: []byte(order)}, charge(order, 1)); err != nil {
			b.Fatal(err)
		}
		atomic += time.Since(start)
		atomicOps = append(atomicOps, time.Since(start))
	}
	b.ReportMetric(float64(bare.Microseconds())/float64(b.N), "bare-µs/op")
	b.ReportMetric(float64(atomic.Microseconds())/float64(b.N), "atomic-µs/op")
	b.ReportMetric(float64(atomic)/float64(bare), "ratio")
	b.ReportMetric(float64(p50(bareOps).Microseconds()), "bare-p50-µs")
	b.ReportMetric(float64(p50(atomicOps).Microseconds()), "atomic-p50-µs")
	b.ReportMetric(float64(p50(atomicOps))/float64(p50(bareOps)), "p50-ratio")
}

// BenchmarkReplay measures a duplicate of a completed key through Store.Do
// (BEGIN, the claim, ROLLBACK) and Store.Claim (one statement) next to a
// bare "SELECT 1" round trip.
//
//	go test -run '^$' -bench Replay -benchtime 5000x ./idempotency
func BenchmarkReplay(b *testing.B) {
	pool := pgfencetest.NewPool(b)
	store := newStore(b, nil)
	ctx := context.Background()
	req := idempotency.Request{Scope: "bench", Key: "replayed", Payload: []byte("x")}
	fn := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("stored result"), nil }
	if _, err := store.Do(ctx, pool, req, fn); err != nil {
		b.Fatal(err)
	}
	b.Run("select1", func(b *testing.B) {
		for range b.N {
			var one int
			if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		for range b.N {
			out, err := store.Do(ctx, pool, req, fn)
			if err != nil || !out.Replayed {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("leased-replay", func(b *testing.B) {
		for range b.N {
			out, err := store.Claim(ctx, pool, req)
			if err != nil || !out.Replayed {
				b.Fatal(out, err)
			}
		}
	})
}

// BenchmarkClaimByTableSize measures a new atomic key (claim + store result +
// commit, no business write) and a new leased claim + completion with 10^4 to
// 10^6 completed keys already stored (bulk-loaded with generate_series).
//
//	go test -run '^$' -bench ClaimByTableSize -benchtime 2000x ./idempotency
func BenchmarkClaimByTableSize(b *testing.B) {
	pool := pgfencetest.NewPool(b)
	store := newStore(b, nil)
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil }
	loaded := 0
	for _, size := range []int{10_000, 100_000, 1_000_000} {
		fill(b, pool, loaded, size)
		loaded = size
		run := 0
		b.Run(fmt.Sprintf("keys=%d/atomic", size), func(b *testing.B) {
			run++
			ops := make([]time.Duration, 0, b.N)
			for i := range b.N {
				req := idempotency.Request{Scope: "bench", Key: fmt.Sprintf("new-%d-%d-%d", size, run, i)}
				start := time.Now()
				if out, err := store.Do(ctx, pool, req, noop); err != nil || out.Replayed {
					b.Fatal(out, err)
				}
				ops = append(ops, time.Since(start))
			}
			b.ReportMetric(float64(p50(ops).Microseconds()), "p50-µs")
		})
		b.Run(fmt.Sprintf("keys=%d/leased", size), func(b *testing.B) {
			run++
			ops := make([]time.Duration, 0, b.N)
			for i := range b.N {
				req := idempotency.Request{Scope: "bench", Key: fmt.Sprintf("leased-%d-%d-%d", size, run, i)}
				start := time.Now()
				out, err := store.Claim(ctx, pool, req)
				if err != nil || out.Replayed {
					b.Fatal(out, err)
				}
				if _, err := out.Attempt.Complete(ctx, []byte("ok")); err != nil {
					b.Fatal(err)
				}
				ops = append(ops, time.Since(start))
			}
			b.ReportMetric(float64(p50(ops).Microseconds()), "p50-µs")
		})
	}
}

func p50(ops []time.Duration) time.Duration {
	if len(ops) == 0 {
		return 0
	}
	s := slices.Clone(ops)
	slices.Sort(s)
	return s[len(s)/2]
}

// fill stores completed keys from..to-1 (random-looking keys, so inserts
// spread over the whole index like real ones).
func fill(b *testing.B, pool *pgxpool.Pool, from, to int) {
	b.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO pgfence.idempotency_keys
       (scope, key, fingerprint, mode, status, result, retention, completed_at, expires_at)
SELECT 'bench', md5(i::text), sha256(i::text::bytea), 'atomic', 'succeeded', '\x6f6b', interval '1 day',
       clock_timestamp(), clock_timestamp() + interval '1 day'
  FROM generate_series($1::int, $2::int - 1) i`, from, to); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE pgfence.idempotency_keys`); err != nil {
		b.Fatal(err)
	}
}
