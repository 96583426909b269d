package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/devdb"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// errHeld marks an attempt that found its key held (two workers drew the same
// random key): contention, not a failure, and not a sample.
var errHeld = errors.New("held")

// benchKeys is the key space: random keys out of 100k, as in DESIGN.md §7.
const benchKeys = 100_000

// benchCase is one measured operation; op runs once per iteration.
type benchCase struct {
	name string
	what string
	op   func(ctx context.Context, rng *rand.Rand) error
}

// benchResult is one case at one concurrency.
type benchResult struct {
	Case    string  `json:"case"`
	What    string  `json:"what"`
	Workers int     `json:"workers"`
	Ops     int     `json:"ops"`
	Errors  int     `json:"errors"`
	Held    int     `json:"held"` // attempts that found the random key held by another worker
	OpsPerS float64 `json:"ops_per_s"`
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
}

func runBench(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "bench", "bench [--database-url URL] [--duration 3s] [--workers 1,8] [--cases a,b] [--json]")
	var db dbFlags
	db.register(fs)
	duration := fs.Duration("duration", 3*time.Second, "how long each case runs at each concurrency")
	workersFlag := fs.String("workers", "1,8", "comma-separated concurrency levels")
	casesFlag := fs.String("cases", "", "comma-separated case names (default: all)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, interspersed(fs, args)); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("bench takes no arguments, got %q", fs.Args())
	}
	if *duration < 100*time.Millisecond || *duration > 10*time.Minute {
		return usageError("--duration must be between 100ms and 10m, got %s", *duration)
	}
	var workers []int
	for _, s := range strings.Split(*workersFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 256 {
			return usageError("--workers: %q is not a number from 1 to 256", s)
		}
		workers = append(workers, n)
	}
	url := db.url
	if url == "" {
		url = e.getenv("DATABASE_URL")
	}
	maxWorkers := slices.Max(workers)
	d, err := devdb.Open(ctx, url, &devdb.Options{Progress: e.stderr, MaxConns: int32(maxWorkers + 4)})
	if err != nil {
		return &cliError{msg: redact(err.Error()), hint: "omit --database-url to use a throwaway local PostgreSQL, or pass a reachable URL", code: exitUnavailable, err: err}
	}
	defer d.Close()
	defer func() { _, _ = d.Pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS pgfence_bench CASCADE`) }()

	cases, cleanup, err := benchCases(ctx, d.Pool)
	if err != nil {
		return err
	}
	defer cleanup()
	if *casesFlag != "" {
		var picked []benchCase
		for _, name := range strings.Split(*casesFlag, ",") {
			i := slices.IndexFunc(cases, func(c benchCase) bool { return c.name == strings.TrimSpace(name) })
			if i < 0 {
				var names []string
				for _, c := range cases {
					names = append(names, c.name)
				}
				return usageError("--cases: unknown case %q (have %s)", name, strings.Join(names, ", "))
			}
			picked = append(picked, cases[i])
		}
		cases = picked
	}

	var settings struct{ fsync, syncCommit string }
	_ = d.Pool.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&settings.fsync, &settings.syncCommit)
	fmt.Fprintf(e.stderr, "bench: %d case(s) × workers %v × %s; fsync=%s synchronous_commit=%s\n", len(cases), workers, *duration, settings.fsync, settings.syncCommit)

	var results []benchResult
	for _, c := range cases {
		for _, n := range workers {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r := measure(ctx, c, n, *duration)
			fmt.Fprintf(e.stderr, "  %-16s %3d workers: %8.0f ops/s  p50 %.2f ms  p99 %.2f ms\n", c.name, n, r.OpsPerS, r.P50ms, r.P99ms)
			results = append(results, r)
		}
	}
	if *asJSON {
		return writeJSON(e, map[string]any{"fsync": settings.fsync, "synchronous_commit": settings.syncCommit, "results": results})
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CASE\tWORKERS\tOPS/S\tP50 MS\tP99 MS\tHELD\tERRORS\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%.2f\t%d\t%d\t\n", r.Case, r.Workers, r.OpsPerS, r.P50ms, r.P99ms, r.Held, r.Errors)
	}
	tw.Flush()
	fmt.Fprintln(e.stdout)
	for _, c := range cases {
		fmt.Fprintf(e.stdout, "  %-16s %s\n", c.name, c.what)
	}
	return nil
}

// measure runs c with n workers for d and summarizes the latencies.
func measure(ctx context.Context, c benchCase, n int, d time.Duration) benchResult {
	// Warm up: open the connections and plan the statements outside the clock.
	var warm sync.WaitGroup
	for w := range n {
		warm.Add(1)
		go func() {
			defer warm.Done()
			_ = c.op(ctx, rand.New(rand.NewPCG(uint64(w), 0)))
		}()
	}
	warm.Wait()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var lat []time.Duration
	errs, held := 0, 0
	var wg sync.WaitGroup
	start := time.Now()
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			var mine []time.Duration
			bad, busy := 0, 0
			for ctx.Err() == nil {
				t0 := time.Now()
				err := c.op(ctx, rng)
				if ctx.Err() != nil {
					break // cut off by the deadline: not a sample
				}
				if errors.Is(err, errHeld) || errors.Is(err, leases.ErrLeaseHeld) {
					busy++
					continue
				}
				if err != nil {
					bad++
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += bad
			held += busy
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	r := benchResult{Case: c.name, What: c.what, Workers: n, Ops: len(lat), Errors: errs, Held: held, OpsPerS: float64(len(lat)) / elapsed.Seconds()}
	if len(lat) > 0 {
		r.P50ms = float64(lat[len(lat)/2]) / 1e6
		r.P99ms = float64(lat[len(lat)*99/100]) / 1e6
	}
	return r
}

// benchCases prepares the tables and returns every case.
func benchCases(ctx context.Context, pool *pgxpool.Pool) ([]benchCase, func(), error) {
	if _, err := pool.Exec(ctx, `
		DROP SCHEMA IF EXISTS pgfence_bench CASCADE;
		CREATE SCHEMA pgfence_bench;
		CREATE TABLE pgfence_bench.stock (id int PRIMARY KEY, qty bigint NOT NULL);
		INSERT INTO pgfence_bench.stock SELECT g, 0 FROM generate_series(1, 100000) g;
		CREATE TABLE pgfence_bench.orders (id bigserial PRIMARY KEY, item int NOT NULL);
		ANALYZE pgfence_bench.stock`); err != nil {
		return nil, nil, fmt.Errorf("bench setup: %w", err)
	}
	client, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		return nil, nil, err
	}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	key := func(rng *rand.Rand) string { return "bench/" + strconv.Itoa(rng.IntN(benchKeys)) }
	var seq sync.Mutex
	var n int64
	nextID := func() int64 { seq.Lock(); defer seq.Unlock(); n++; return n }
	// Fenced writes present one token per resource that never goes backwards:
	// the token of a single long-held lease (equal tokens pass).
	var token int64
	if err := pool.QueryRow(ctx, `SELECT pgfence.next_token(NULL)`).Scan(&token); err != nil {
		client.Close()
		return nil, nil, err
	}
	const update = `UPDATE pgfence_bench.stock SET qty = qty + 1 WHERE id = $1`

	cases := []benchCase{
		{"advisory-lock", "pg_advisory_xact_lock in a transaction (not durable, no token) — reference", func(ctx context.Context, rng *rand.Rand) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, key(rng))
				return err
			})
		}},
		{"raw-lease", "pgfence.try_acquire + pgfence.release sent as raw SQL over pgx (2 commits)", func(ctx context.Context, rng *rand.Rand) error {
			k := key(rng)
			var ok bool
			var holder string
			var tok int64
			if err := pool.QueryRow(ctx, `SELECT acquired, holder::text, token FROM pgfence.try_acquire($1, interval '30 seconds')`, k).Scan(&ok, &holder, &tok); err != nil {
				return err
			}
			if !ok {
				return errHeld
			}
			_, err := pool.Exec(ctx, `SELECT pgfence.release($1, $2::uuid, $3, false)`, k, holder, tok)
			return err
		}},
		{"leases", "leases.Client TryAcquire + Lease.Release (the library)", func(ctx context.Context, rng *rand.Rand) error {
			l, err := client.TryAcquire(ctx, key(rng), 30*time.Second, nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"raw-update", "UPDATE of one row, unfenced (1 commit)", func(ctx context.Context, rng *rand.Rand) error {
			_, err := pool.Exec(ctx, update, 1+rng.IntN(benchKeys))
			return err
		}},
		{"fenced-update", "pgfence.Exec: the same UPDATE fenced by a token, one round trip", func(ctx context.Context, rng *rand.Rand) error {
			id := 1 + rng.IntN(benchKeys)
			_, err := pgfence.Exec(ctx, pool, "bench/"+strconv.Itoa(id), token, update, id)
			return err
		}},
		{"raw-insert-tx", "a transaction inserting one order row (1 commit)", func(ctx context.Context, rng *rand.Rand) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO pgfence_bench.orders (item) VALUES ($1)`, rng.IntN(benchKeys))
				return err
			})
		}},
		{"idempotent-tx", "idempotency.Store.Do: the same insert under a new key, result stored", func(ctx context.Context, rng *rand.Rand) error {
			_, err := store.Do(ctx, pool, idempotency.Request{Scope: "bench", Key: strconv.FormatInt(nextID(), 10)}, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				_, err := tx.Exec(ctx, `INSERT INTO pgfence_bench.orders (item) VALUES ($1)`, rng.IntN(benchKeys))
				return []byte("ok"), err
			})
			return err
		}},
	}
	return cases, func() { client.Close() }, nil
}
