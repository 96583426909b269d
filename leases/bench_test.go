package leases_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// benchPool returns a pool on a fresh database, counting the statements sent
// through it (and through the LISTEN connections copied from its config).
func benchPool(b *testing.B, maxConns int32) (*pgxpool.Pool, *atomic.Int64) {
	b.Helper()
	db := pgfencetest.NewDatabase(b)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	cfg.ConnConfig.Tracer = counter{&n}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool, &n
}

type counter struct{ n *atomic.Int64 }

func (c counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Uncontended acquire + release of random keys: the client against the same
// SQL functions called raw, and against the inline statements a hand-written
// client would send (the hand-written floor). Each op is two commits.
func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	key := func() string { return "k" + strconv.Itoa(rand.IntN(100000)) }
	run := func(b *testing.B, op func() error) {
		b.ResetTimer()
		for b.Loop() {
			if err := op(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("client", func(b *testing.B) {
		pool, _ := benchPool(b, 4)
		c := newClient(b, pool, nil)
		run(b, func() error {
			l, err := c.TryAcquire(ctx, key(), 30*time.Second, nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		})
	})
	b.Run("client-durable-release", func(b *testing.B) {
		pool, _ := benchPool(b, 4)
		c := newClient(b, pool, &leases.Config{DurableRelease: true})
		run(b, func() error {
			l, err := c.TryAcquire(ctx, key(), 30*time.Second, nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		})
	})
	b.Run("raw-functions", func(b *testing.B) {
		pool, _ := benchPool(b, 4)
		run(b, func() error {
			k := key()
			var ok bool
			var holder string
			var token int64
			if err := pool.QueryRow(ctx, `SELECT acquired, holder::text, token FROM pgfence.try_acquire($1, interval '30 seconds', '')`, k).Scan(&ok, &holder, &token); err != nil || !ok {
				return fmt.Errorf("acquire %v %v", ok, err)
			}
			_, err := pool.Exec(ctx, `SELECT * FROM pgfence.release($1, $2::uuid, $3, false)`, k, holder, token)
			return err
		})
	})
	b.Run("raw-upsert", func(b *testing.B) {
		pool, _ := benchPool(b, 4)
		run(b, func() error {
			k := key()
			var holder string
			var token int64
			err := pool.QueryRow(ctx, `INSERT INTO pgfence.leases AS l (key, holder, token, granted_at, expires_at)
VALUES ($1, gen_random_uuid(), pgfence.next_token(NULL), clock_timestamp(), clock_timestamp() + interval '30 seconds')
ON CONFLICT (key) DO UPDATE SET holder = EXCLUDED.holder, token = pgfence.next_token(l.token), granted_at = clock_timestamp(),
  renewed_at = NULL, expires_at = clock_timestamp() + interval '30 seconds', released_at = NULL
WHERE l.released_at IS NOT NULL OR l.expires_at <= clock_timestamp()
RETURNING holder::text, token`, k).Scan(&holder, &token)
			if err != nil {
				return err
			}
			_, err = pool.Exec(ctx, `UPDATE pgfence.leases SET released_at = clock_timestamp() WHERE key = $1 AND holder = $2::uuid AND token = $3 AND released_at IS NULL`, k, holder, token)
			return err
		})
	})
}

// Hot-key hand-off: waiters goroutines, spread over up to 8 clients (each with
// its own LISTEN connection, like 8 processes), take one key in turn and
// release it at once. The latency is from the start of a release to the next
// holder's Acquire returning.
func BenchmarkHandOff(b *testing.B) {
	for _, waiters := range []int{1, 8, 64} {
		for _, wakeups := range []bool{true, false} {
			name := fmt.Sprintf("waiters=%d/wakeups=%v", waiters, wakeups)
			b.Run(name, func(b *testing.B) { benchHandOff(b, waiters, wakeups) })
		}
	}
}

func benchHandOff(b *testing.B, waiters int, wakeups bool) {
	pool, _ := benchPool(b, 16)
	var clients []*leases.Client
	for range min(waiters+1, 8) {
		clients = append(clients, newClient(b, pool, &leases.Config{DisableWakeups: !wakeups}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu          sync.Mutex
		latencies   []time.Duration
		acquired    = make(chan struct{}) // closed by the next acquisition
		releasedAt  atomic.Int64          // unix nanos of the last release's start
		wg          sync.WaitGroup
		total       = b.N
		done        = make(chan struct{})
		closeDone   sync.Once
		failures    atomic.Int64
		lastFailure atomic.Value
	)
	b.ResetTimer()
	for i := range waiters + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[i%len(clients)]
			for ctx.Err() == nil {
				l, err := c.Acquire(ctx, "hot", 10*time.Second, nil)
				if err != nil {
					if ctx.Err() == nil {
						failures.Add(1)
						lastFailure.Store(err)
					}
					return
				}
				mu.Lock()
				if at := releasedAt.Load(); at != 0 {
					latencies = append(latencies, time.Since(time.Unix(0, at)))
				}
				if len(latencies) >= total {
					closeDone.Do(func() { close(done) })
				}
				close(acquired)
				acquired = make(chan struct{})
				next := acquired
				mu.Unlock()
				releasedAt.Store(time.Now().UnixNano())
				if err := l.Release(context.Background()); err != nil {
					failures.Add(1)
					lastFailure.Store(err)
				}
				// Compete again only after someone else took it: measure
				// hand-offs to waiters, not re-grants to the releaser.
				select {
				case <-next:
				case <-ctx.Done():
				}
			}
		}()
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
	}
	b.StopTimer()
	cancel()
	wg.Wait()
	if failures.Load() > 0 {
		b.Fatalf("%d failures, last: %v", failures.Load(), lastFailure.Load())
	}
	slices.Sort(latencies)
	if len(latencies) == 0 {
		b.Fatal("no hand-offs")
	}
	pct := func(p float64) float64 {
		return float64(latencies[min(len(latencies)-1, int(p*float64(len(latencies))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// Statements per second caused by 64 waiters on a key that stays held (for
// an hour), for each iteration's one second. Within a client only the
// head waiter polls; with wake-ups it polls every PollInterval.
func BenchmarkIdleWaiters(b *testing.B) {
	for _, clients := range []int{1, 8} {
		for _, wakeups := range []bool{true, false} {
			b.Run(fmt.Sprintf("clients=%d/wakeups=%v", clients, wakeups), func(b *testing.B) {
				benchIdleWaiters(b, 64, clients, wakeups)
			})
		}
	}
}

func benchIdleWaiters(b *testing.B, waiters, nclients int, wakeups bool) {
	pool, stmts := benchPool(b, 8)
	holder := newClient(b, pool, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := holder.TryAcquire(ctx, "held", time.Hour, manual()) // only the waiters' statements count
	if err != nil {
		b.Fatal(err)
	}
	var clients []*leases.Client
	for range nclients {
		clients = append(clients, newClient(b, pool, &leases.Config{DisableWakeups: !wakeups}))
	}
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = clients[i%nclients].Acquire(ctx, "held", time.Second, nil)
		}()
	}
	time.Sleep(2 * time.Second) // past the first attempts and the listener start
	b.ResetTimer()
	start, before := time.Now(), stmts.Load()
	for b.Loop() {
		time.Sleep(time.Second)
	}
	n := stmts.Load() - before
	b.StopTimer()
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "stmts/s")
	cancel()
	wg.Wait()
	_ = l.Release(context.Background())
}
