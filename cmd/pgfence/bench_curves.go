package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// The curves' rows live under these names, apart from the bench's own; they
// are deleted at the end (fence rows cannot be: they are the memory of the
// accepted tokens, so on a --database-url they stay).
const (
	curvePrefix = "bench-curve/"
	curveScope  = "bench-curve"
	churnKeys   = 1000
	churnChunk  = 5000 // cycles per statement of the churn curve
)

// countFlag is a count that accepts 1e6 as well as 1000000.
type countFlag int64

func (c *countFlag) String() string { return strconv.FormatInt(int64(*c), 10) }

func (c *countFlag) Set(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f > 1e9 || f != math.Trunc(f) {
		return fmt.Errorf("%q is not a whole number from 0 to 1e9", s)
	}
	*c = countFlag(f)
	return nil
}

// curvePoint is one measurement of a curve at size X.
type curvePoint struct {
	Curve string `json:"curve"`
	X     int64  `json:"x"`
	benchrun.Result
}

// tableStats is what the churn curve reads of pgfence.leases.
type tableStats struct {
	LiveTuples  int64 `json:"n_live_tup"`
	DeadTuples  int64 `json:"n_dead_tup"`
	Updates     int64 `json:"n_tup_upd"`
	HotUpdates  int64 `json:"n_tup_hot_upd"`
	Vacuums     int64 `json:"autovacuum_count"`
	TotalBytes  int64 `json:"total_bytes"`
	EventRows   int64 `json:"lease_events_rows"`
	EventsBytes int64 `json:"lease_events_total_bytes"`
	// The grant history's dead rows (pruned, not yet vacuumed) and vacuums.
	EventsDead    int64 `json:"lease_events_n_dead_tup"`
	EventsVacuums int64 `json:"lease_events_autovacuum_count"`
}

// churnResult is the table after many acquire/release cycles on a fixed set of
// keys.
type churnResult struct {
	Cycles     int64      `json:"cycles"`
	Keys       int        `json:"keys"`
	Seconds    float64    `json:"seconds"`
	CyclesPerS float64    `json:"cycles_per_s"`
	Before     tableStats `json:"before"`
	After      tableStats `json:"after"`
	Settings   string     `json:"settings"`
}

func runBenchCurves(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "bench curves", benchUsage)
	var db dbFlags
	db.register(fs)
	duration := fs.Duration("duration", 2*time.Second, "how long each point is measured")
	warmup := fs.Duration("warmup", time.Second, "how long each point runs before its clock starts, outcomes discarded (0 to 10m)")
	workers := fs.Int("workers", 4, "concurrent workers at each point (the hot-key curve varies its waiters instead)")
	maxRows, maxKeys, maxResources, maxWaiters, cycles := countFlag(100_000), countFlag(1_000_000), countFlag(100_000), countFlag(64), countFlag(20_000)
	fs.Var(&maxRows, "max-rows", "acquire latency with 10^3 … this many lease rows (10^6: opt-in, loads in about a minute)")
	fs.Var(&maxKeys, "max-keys", "idempotency claim with 10^4 … this many stored keys (10^7: opt-in, several minutes)")
	fs.Var(&maxResources, "max-resources", "fenced write over 1 … this many resources")
	fs.Var(&maxWaiters, "max-waiters", "hot key with 1, 4, 16 … this many waiters (256: opt-in)")
	fs.Var(&cycles, "cycles", "acquire/release cycles of the churn measurement (10^6: opt-in, many minutes with fsync on)")
	only := fs.String("curves", "", "comma-separated subset of rows, keys, resources, waiters, churn (default: all)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, interspersed(fs, args)); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("bench curves takes no arguments, got %q", fs.Args())
	}
	if err := checkDuration(*duration); err != nil {
		return err
	}
	if err := checkWarmup(*warmup); err != nil {
		return err
	}
	timing := benchTiming{duration: *duration, warmup: *warmup}
	if *workers < 1 || *workers > 256 {
		return usageError("--workers: %d is not from 1 to 256", *workers)
	}
	if maxWaiters < 1 || maxWaiters > 256 {
		return usageError("--max-waiters: %d is not from 1 to 256", maxWaiters)
	}
	// Each curve starts at its smallest size; a maximum below it would
	// measure nothing and still report success.
	for _, f := range []struct {
		name     string
		got, min countFlag
	}{{"max-rows", maxRows, 1000}, {"max-keys", maxKeys, 10_000}, {"max-resources", maxResources, 1}, {"cycles", cycles, 1}} {
		if f.got < f.min {
			return usageError("--%s: %d is below the curve's first point, %d", f.name, f.got, f.min)
		}
	}
	all := []string{"rows", "keys", "resources", "waiters", "churn"}
	want := map[string]bool{}
	for _, c := range all {
		want[c] = *only == ""
	}
	if *only != "" {
		for _, c := range strings.Split(*only, ",") {
			if !slices.Contains(all, strings.TrimSpace(c)) {
				return usageError("--curves: unknown curve %q (have %s)", c, strings.Join(all, ", "))
			}
			want[strings.TrimSpace(c)] = true
		}
	}

	b, err := openBench(ctx, e, &db, max(*workers, int(maxWaiters)))
	if err != nil {
		return err
	}
	defer b.close()
	defer cleanupCurves(b)
	fmt.Fprintf(e.stderr, "bench curves: %s per point (after %s of warm-up), %d workers; %s\n", *duration, *warmup, *workers, b.settings)

	var points []curvePoint
	measure := func(curve string, x int64, n int, op benchrun.Op) {
		done := startProgress(e.stderr, fmt.Sprintf("%s = %d, %d workers", curve, x, n), timing.total(), 0)
		var before int64
		r := benchrun.Run(ctx, op, timing.config(n, func() { before = b.stmts.Load() }))
		done()
		r.SetStatements(b.stmts.Load() - before)
		r.Case = curve
		fmt.Fprintf(e.stderr, "  %s\n", resultLine(r))
		points = append(points, curvePoint{Curve: curve, X: x, Result: r})
	}
	var churn *churnResult
	steps := []struct {
		name string
		run  func() error
	}{
		{"rows", func() error { return curveRows(ctx, e, b, powers(1000, int64(maxRows), 10), *workers, measure) }},
		{"keys", func() error { return curveKeys(ctx, e, b, powers(10_000, int64(maxKeys), 10), *workers, measure) }},
		{"resources", func() error {
			return curveResources(ctx, e, b, powers(1, int64(maxResources), 10), *workers, measure)
		}},
		{"waiters", func() error {
			for _, w := range powers(1, int64(maxWaiters), 4) {
				op, cleanup, err := prepareHotKey(ctx, b, int(w))
				if err != nil {
					return err
				}
				measure("hot-key-waiters", w, int(w), op)
				cleanup()
			}
			return nil
		}},
		{"churn", func() (err error) {
			churn, err = curveChurn(ctx, e, b, int64(cycles))
			return err
		}},
	}
	for _, s := range steps {
		if !want[s.name] {
			continue
		}
		if err := s.run(); err != nil {
			return fmt.Errorf("curve %s: %w", s.name, err)
		}
	}
	verdicts := curveVerdicts(points, churn)
	if *asJSON {
		return writeJSON(e, map[string]any{"machine": b.machine(), "settings": b.settings, "duration_s": duration.Seconds(), "warmup_s": warmup.Seconds(), "workers": *workers, "points": points, "churn": churn, "comparisons": verdicts})
	}
	printCurves(e.stdout, points, churn)
	if len(verdicts) > 0 {
		fmt.Fprintln(e.stdout, "\nAgainst the goals (issue #9):")
		for _, v := range verdicts {
			fmt.Fprintf(e.stdout, "  %s\n", v)
		}
	}
	fmt.Fprintf(e.stdout, "\n%s; %s\n", b.machine(), b.settings)
	if !b.db.Throwaway() {
		fmt.Fprintf(e.stdout, "note: the fence rows %q… stay in pgfence.fences (accepted tokens are never deleted)\n", curvePrefix)
	}
	return nil
}

// powers returns from, from·step, … up to limit, and limit itself if the
// steps miss it.
func powers(from, limit, step int64) []int64 {
	var out []int64
	for x := from; x <= limit; x *= step {
		out = append(out, x)
	}
	if limit >= 1 && (len(out) == 0 || out[len(out)-1] != limit) {
		out = append(out, limit)
	}
	return out
}

type measureFunc func(curve string, x int64, workers int, op benchrun.Op)

// bulk runs one loading statement with progress, then ANALYZE.
func bulk(ctx context.Context, e *env, b *benchDB, what string, sql string, args ...any) error {
	start := time.Now()
	fmt.Fprintf(e.stderr, "  loading %s…\n", what)
	if _, err := b.db.Pool.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("load %s: %w", what, err)
	}
	if _, err := b.db.Pool.Exec(ctx, `ANALYZE pgfence.leases, pgfence.idempotency_keys, pgfence.fences`); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "  loaded %s in %s\n", what, time.Since(start).Round(time.Millisecond))
	return nil
}

// curveRows: TryAcquire + Release on a random existing key with 10^3…
// released lease rows in pgfence.leases.
func curveRows(ctx context.Context, e *env, b *benchDB, sizes []int64, n int, measure measureFunc) error {
	client, err := leases.New(b.pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		return err
	}
	defer client.Close()
	var loaded int64
	for _, size := range sizes {
		if err := bulk(ctx, e, b, fmt.Sprintf("lease rows %d…%d", loaded, size), `
			INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at, released_at)
			SELECT $1 || 'lease/' || g, gen_random_uuid(), 1, t, t, t
			FROM generate_series($2::bigint, $3::bigint - 1) g, (SELECT clock_timestamp() - interval '1 hour' AS t) c`, curvePrefix, loaded, size); err != nil {
			return err
		}
		loaded = size
		measure("acquire-vs-lease-rows", size, n, func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			l, err := client.TryAcquire(ctx, curvePrefix+"lease/"+strconv.FormatInt(w.Rand.Int64N(size), 10), 30*time.Second, nil)
			if errors.Is(err, leases.ErrLeaseHeld) {
				return 0, benchrun.ErrHeld
			}
			if err != nil {
				return 0, err
			}
			return 0, l.Release(ctx)
		})
	}
	// The churn curve measures the table's growth: leave it as it was.
	if _, err := b.db.Pool.Exec(ctx, `DELETE FROM pgfence.leases WHERE key LIKE 'bench-curve/lease/%'`); err != nil {
		return err
	}
	_, _ = b.db.Pool.Exec(ctx, `VACUUM pgfence.leases`) // best effort: needs ownership on a --database-url
	return nil
}

// curveKeys: idempotency.Store.Do on a new key with 10^4… completed keys
// stored.
func curveKeys(ctx context.Context, e *env, b *benchDB, sizes []int64, n int, measure measureFunc) error {
	store, err := idempotency.NewStore(nil)
	if err != nil {
		return err
	}
	var loaded int64
	var seq atomic.Int64
	for _, size := range sizes {
		if err := bulk(ctx, e, b, fmt.Sprintf("idempotency keys %d…%d", loaded, size), `
			INSERT INTO pgfence.idempotency_keys (scope, key, fingerprint, mode, status, result, retention, completed_at, expires_at)
			SELECT $1, 'k' || g, sha256(g::text::bytea), 'atomic', 'succeeded', '\x6f6b', interval '1 day', t, t + interval '1 day'
			FROM generate_series($2::bigint, $3::bigint - 1) g, (SELECT clock_timestamp() AS t) c`, curveScope, loaded, size); err != nil {
			return err
		}
		loaded = size
		measure("claim-vs-keys", size, n, func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			req := idempotency.Request{Scope: curveScope, Key: "new/" + strconv.FormatInt(seq.Add(1), 10)}
			_, err := store.Do(ctx, b.pool, req, func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil })
			return 0, err
		})
	}
	return nil
}

// curveResources: pgfence.Exec on one of 1… resources (each fenced once
// before), updating the resource's stock row.
func curveResources(ctx context.Context, e *env, b *benchDB, sizes []int64, n int, measure measureFunc) error {
	var token int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT pgfence.next_token(NULL)`).Scan(&token); err != nil {
		return err
	}
	var loaded int64
	for _, size := range sizes {
		if err := bulk(ctx, e, b, fmt.Sprintf("fence rows %d…%d", loaded, size), `
			SELECT count(pgfence.fence($1 || 'fence/' || g, $2)) FROM generate_series($3::bigint, $4::bigint - 1) g`,
			curvePrefix, token, loaded, size); err != nil {
			return err
		}
		loaded = size
		measure("fenced-write-vs-resources", size, n, func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			i := w.Rand.Int64N(size)
			_, err := pgfence.ExecToken(ctx, b.pool, curvePrefix+"fence/"+strconv.FormatInt(i, 10), token, sqlUpdate, i%benchrun.Keys)
			return 0, err
		})
	}
	return nil
}

const sqlLeaseStats = `
	SELECT s.n_live_tup, s.n_dead_tup, s.n_tup_upd, s.n_tup_hot_upd, s.autovacuum_count,
	       pg_total_relation_size('pgfence.leases'),
	       (SELECT count(*) FROM pgfence.lease_events), pg_total_relation_size('pgfence.lease_events'),
	       e.n_dead_tup, e.autovacuum_count
	FROM pg_stat_user_tables s, pg_stat_user_tables e
	WHERE s.relid = 'pgfence.leases'::regclass AND e.relid = 'pgfence.lease_events'::regclass`

func readLeaseStats(ctx context.Context, b *benchDB) (tableStats, error) {
	// Backends report their counters when they go idle or exit, at most once a
	// second: give the closed churn connections the time to.
	var s tableStats
	select {
	case <-time.After(1500 * time.Millisecond):
	case <-ctx.Done():
		return s, ctx.Err()
	}
	conn, err := b.db.Pool.Acquire(ctx)
	if err != nil {
		return s, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return s, err
	}
	err = conn.QueryRow(ctx, sqlLeaseStats).Scan(&s.LiveTuples, &s.DeadTuples, &s.Updates, &s.HotUpdates, &s.Vacuums, &s.TotalBytes, &s.EventRows, &s.EventsBytes, &s.EventsDead, &s.EventsVacuums)
	return s, err
}

// churnSQL runs cycles acquire/release cycles on random keys out of churnKeys
// through the SQL API in one round trip, each grant and each release committed
// on its own as a client's would be.
func churnSQL(cycles int64) string {
	return fmt.Sprintf(`DO $$
DECLARE
    r record;
    k text;
BEGIN
    FOR i IN 1..%d LOOP
        k := '%schurn/' || floor(random() * %d)::int;
        SELECT acquired, holder, token INTO r FROM pgfence.try_acquire(k, interval '30 seconds');
        COMMIT;
        IF r.acquired THEN
            PERFORM pgfence.release(k, r.holder, r.token, false);
            COMMIT;
        END IF;
    END LOOP;
END $$`, cycles, curvePrefix, churnKeys)
}

// curveChurn runs acquire/release cycles on a fixed set of keys and reports
// what the leases table looks like before and after: dead tuples, HOT updates,
// size.
func curveChurn(ctx context.Context, e *env, b *benchDB, cycles int64) (*churnResult, error) {
	res := &churnResult{Cycles: cycles, Keys: churnKeys}
	var settings []string
	rows, err := b.db.Pool.Query(ctx, `SELECT name || '=' || setting FROM pg_settings
		WHERE name IN ('autovacuum', 'autovacuum_naptime', 'autovacuum_vacuum_threshold', 'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_cost_limit')
		UNION ALL SELECT 'pgfence.leases reloptions=' || coalesce(array_to_string(reloptions, ','), 'none (fillfactor 100)') FROM pg_class WHERE oid = 'pgfence.leases'::regclass`)
	if err != nil {
		return nil, err
	}
	if settings, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return nil, err
	}
	res.Settings = strings.Join(settings, " ")
	// Every key gets its row first, so the cycles measure updates only.
	if err := bulk(ctx, e, b, fmt.Sprintf("%d churn keys", churnKeys), `
		SELECT count(*) FROM generate_series(0, $2::int - 1) g, pgfence.try_acquire($1 || 'churn/' || g, interval '1 second')`,
		curvePrefix, churnKeys); err != nil {
		return nil, err
	}
	if res.Before, err = readLeaseStats(ctx, b); err != nil {
		return nil, err
	}
	const conns = 4
	var cyclesDone atomic.Int64
	status := func() string {
		return fmt.Sprintf("%d of %d cycles (%.0f%%)", cyclesDone.Load(), cycles, 100*float64(cyclesDone.Load())/float64(max(cycles, 1)))
	}
	done := startProgressStatus(e.stderr, fmt.Sprintf("churn: %d acquire/release cycles on %d keys over %d connections", cycles, churnKeys, conns), 0, 0, status)
	// Elsewhere than on a terminal, a line at every tenth.
	var (
		reportMu sync.Mutex
		reported int64 // tenths reported
		lines    = !isTerminal(e.stderr)
		tenth    = max(cycles/10, 1)
	)
	report := func() {
		reportMu.Lock()
		defer reportMu.Unlock()
		if step := cyclesDone.Load() / tenth; lines && step > reported && step < 10 {
			reported = step
			fmt.Fprintf(e.stderr, "  churn: %s\n", status())
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, b.db.URL)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(context.WithoutCancel(ctx))
			share := cycles / conns
			if i == 0 {
				share += cycles % conns
			}
			// In chunks, so that progress shows and Ctrl-C stops it soon.
			for share > 0 && errs[i] == nil {
				n := min(share, churnChunk)
				if _, errs[i] = conn.Exec(ctx, churnSQL(n)); errs[i] == nil {
					share -= n
					cyclesDone.Add(n)
					report()
				}
			}
		}()
	}
	wg.Wait()
	done()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res.Seconds = time.Since(start).Seconds()
	res.CyclesPerS = float64(cycles) / res.Seconds
	if res.After, err = readLeaseStats(ctx, b); err != nil {
		return nil, err
	}
	return res, nil
}

// cleanupCurves deletes the rows the curves loaded (not the fence rows).
func cleanupCurves(b *benchDB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _ = b.db.Pool.Exec(ctx, `DELETE FROM pgfence.leases WHERE key LIKE 'bench-curve/%'`)
	_, _ = b.db.Pool.Exec(ctx, `DELETE FROM pgfence.lease_events WHERE key LIKE 'bench-curve/%'`)
	_, _ = b.db.Pool.Exec(ctx, `DELETE FROM pgfence.idempotency_keys WHERE scope = $1`, curveScope)
}

func printCurves(w io.Writer, points []curvePoint, churn *churnResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CURVE\tX\tWORKERS\tOPS/S\tP50 MS\tP99 MS\tSTMTS/OP\tSTMTS/S\tERRORS\t")
	for _, p := range points {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.0f\t%d\t\n", p.Curve, p.X, p.Workers, p.OpsPerS, p.P50ms, p.P99ms, p.StatementsPerOp, p.StatementsPerS, p.Errors)
	}
	tw.Flush()
	if churn == nil {
		return
	}
	fmt.Fprintf(w, "\nchurn: %d acquire/release cycles on %d keys in %.1fs (%.0f cycles/s); %s\n", churn.Cycles, churn.Keys, churn.Seconds, churn.CyclesPerS, churn.Settings)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pgfence.leases\tLIVE\tDEAD\tUPDATES\tHOT UPDATES\tAUTOVACUUMS\tTOTAL SIZE\tEVENT ROWS\tEVENTS DEAD\tEVENTS AUTOVACUUMS\tEVENTS SIZE\t")
	for _, r := range []struct {
		name string
		s    tableStats
	}{{"before", churn.Before}, {"after", churn.After}} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%s\t\n", r.name, r.s.LiveTuples, r.s.DeadTuples, r.s.Updates, r.s.HotUpdates, r.s.Vacuums, bytesString(r.s.TotalBytes),
			r.s.EventRows, r.s.EventsDead, r.s.EventsVacuums, bytesString(r.s.EventsBytes))
	}
	tw.Flush()
}

func bytesString(n int64) string {
	switch {
	case n >= 10<<20:
		return fmt.Sprintf("%d MB", n>>20)
	case n >= 10<<10:
		return fmt.Sprintf("%d kB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// curveVerdicts states the goals the curves can check, as ratios.
func curveVerdicts(points []curvePoint, churn *churnResult) []string {
	var out []string
	ends := func(curve string) (first, last *curvePoint) {
		for i := range points {
			if p := &points[i]; p.Curve == curve && p.Ops > 0 {
				if first == nil {
					first = p
				}
				last = p
			}
		}
		return first, last
	}
	if f, l := ends("acquire-vs-lease-rows"); f != nil && l != f {
		out = append(out, fmt.Sprintf("acquire p50 with %d lease rows is %.2f× that with %d (goal ≤ 1.5× from 10^3 to 10^6)", l.X, l.P50ms/f.P50ms, f.X))
	}
	if f, l := ends("claim-vs-keys"); f != nil && l != f {
		out = append(out, fmt.Sprintf("idempotency claim p50 with %d keys is %.2f× that with %d", l.X, l.P50ms/f.P50ms, f.X))
	}
	if f, l := ends("fenced-write-vs-resources"); f != nil && l != f {
		out = append(out, fmt.Sprintf("fenced write ops/s over %d resources is %.2f× that over %d", l.X, l.OpsPerS/f.OpsPerS, f.X))
	}
	if f, l := ends("hot-key-waiters"); f != nil && l != f && f.StatementsPerS > 0 {
		var ratios, handoffs []string
		for _, p := range points {
			if p.Curve == "hot-key-waiters" && p.Ops > 0 {
				ratios = append(ratios, fmt.Sprintf("%d: %.2f×", p.X, p.StatementsPerS/f.StatementsPerS))
				handoffs = append(handoffs, fmt.Sprintf("%d: %.2f ms", p.X, p.P50ms))
			}
		}
		out = append(out, fmt.Sprintf("hot key, statements/s against %d waiter(s) — %s (goal for 64: ≤ 2×)", f.X, strings.Join(ratios, ", ")),
			fmt.Sprintf("hot key, hand-off p50 by waiters — %s (goal ≤ 5 ms)", strings.Join(handoffs, ", ")))
	}
	if churn != nil && churn.Before.TotalBytes > 0 {
		out = append(out, fmt.Sprintf("churn: pgfence.leases went from %s to %s (%.2f×) over %d cycles on %d keys; %d of %d updates were HOT (goal: the table does not grow)",
			bytesString(churn.Before.TotalBytes), bytesString(churn.After.TotalBytes), float64(churn.After.TotalBytes)/float64(churn.Before.TotalBytes),
			churn.Cycles, churn.Keys, churn.After.HotUpdates-churn.Before.HotUpdates, churn.After.Updates-churn.Before.Updates))
	}
	return out
}
