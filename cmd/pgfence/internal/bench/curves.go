package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
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

// CurveNames are the curves [Lab.Curves] can measure, in the order it
// measures them.
func CurveNames() []string {
	return []string{"retention", "rows", "keys", "resources", "waiters", "churn", "failover", "followers"}
}

// CurvesOptions says what [Lab.Curves] measures. Each curve starts at its
// smallest size: 10^3 lease rows, 10^4 keys, 1 resource, 1 waiter.
type CurvesOptions struct {
	// Curves are the curves to measure, from [CurveNames]; empty for all.
	Curves []string
	Timing Timing
	// Workers is the concurrency at each point (the waiters curve varies its
	// waiters instead).
	Workers int
	// MaxRows, MaxKeys, MaxResources and MaxWaiters are the largest size of
	// each curve; Cycles is the number of acquire/release cycles of the churn
	// measurement.
	MaxRows, MaxKeys, MaxResources, MaxWaiters, Cycles int64
	// OneOff is how many one-off resources the retention curve makes.
	OneOff int64
	// ElectionTTL is the election's TTL in the failover and followers
	// curves; Failovers the number of leaders the failover curve kills;
	// MaxFollowers the largest election of the followers curve (1, 4, 16 …),
	// each size measured for IdleWindow.
	ElectionTTL  time.Duration
	Failovers    int
	MaxFollowers int64
	IdleWindow   time.Duration
}

// Point is one measurement of a curve at size X.
type Point struct {
	Curve string
	X     int64
	benchrun.Result
}

// TableStats is what the churn curve reads of pgfence.leases and its grant
// history, pgfence.lease_events, from the statistics views.
type TableStats struct {
	LiveTuples, DeadTuples, Updates, HotUpdates, Vacuums int64
	TotalBytes                                           int64
	EventRows, EventsBytes                               int64
	// The grant history's dead rows (pruned, not yet vacuumed) and vacuums.
	EventsDead, EventsVacuums int64
}

// Churn is the leases table after many acquire/release cycles on a fixed set
// of keys.
type Churn struct {
	Cycles     int64
	Keys       int
	Elapsed    time.Duration
	CyclesPerS float64
	Before     TableStats
	After      TableStats
	// Settings are the autovacuum settings and the table's storage options.
	Settings string
}

// CurvesReport is what [Lab.Curves] measured.
type CurvesReport struct {
	Machine, Settings string
	Timing            Timing
	Workers           int
	Points            []Point
	// Churn is nil unless the churn curve ran.
	Churn *Churn
	// Retention is nil unless the retention curve ran.
	Retention   *Retention
	Comparisons []string
	// FenceRowsKept is true on a database of the caller's: the fence rows
	// the resources curve made stay (accepted tokens are never deleted).
	FenceRowsKept bool
}

// Curves measures how the cost of each operation grows with the data: acquire
// with more lease rows, an idempotency claim with more stored keys, a fenced
// write over more resources, a hot key with more waiters, what many
// acquire/release cycles leave in the leases table, how long an election
// goes without a leader after its leader is killed, and what the idle
// followers of an election cost. It deletes the rows it loaded, except fence
// rows.
func (lab *Lab) Curves(ctx context.Context, opts CurvesOptions) (*CurvesReport, error) {
	defer lab.cleanupCurves()
	t := opts.Timing
	want := map[string]bool{}
	for _, c := range CurveNames() {
		want[c] = len(opts.Curves) == 0 || slices.Contains(opts.Curves, c)
	}
	fmt.Fprintf(lab.progress, "bench curves: %s per point (after %s of warm-up), %d workers; %s\n", t.Duration, t.Warmup, opts.Workers, lab.settings)

	rep := &CurvesReport{Machine: machine(), Settings: lab.settings, Timing: t, Workers: opts.Workers, FenceRowsKept: !lab.db.Throwaway()}
	measure := func(curve string, x int64, n int, op benchrun.Op) {
		done := startProgress(lab.progress, fmt.Sprintf("%s = %d, %d workers", curve, x, n), t.total(), 0)
		var before int64
		r := benchrun.Run(ctx, op, t.config(n, func() { before = lab.stmts.Load() }))
		done()
		r.SetStatements(lab.stmts.Load() - before)
		r.Case = curve
		fmt.Fprintf(lab.progress, "  %s\n", resultLine(r))
		rep.Points = append(rep.Points, Point{Curve: curve, X: x, Result: r})
	}
	record := func(curve string, x int64, r benchrun.Result) {
		r.Case = curve
		rep.Points = append(rep.Points, Point{Curve: curve, X: x, Result: r})
	}
	n := opts.Workers
	steps := []struct {
		name string
		run  func() error
	}{
		// First, before the other curves load rows of their own into the
		// tables it measures.
		{"retention", func() (err error) {
			if !lab.db.Throwaway() {
				if len(opts.Curves) > 0 {
					return errors.New("it advances the retention floor and moves rows back in time, so it runs on the throwaway cluster only (leave out --database-url and unset DATABASE_URL)")
				}
				fmt.Fprintln(lab.progress, "  retention: skipped on --database-url (it advances the retention floor and moves rows back in time)")
				return nil
			}
			rep.Retention, err = lab.curveRetention(ctx, opts.OneOff)
			return err
		}},
		{"rows", func() error { return lab.curveRows(ctx, powers(1000, opts.MaxRows, 10), n, measure) }},
		{"keys", func() error { return lab.curveKeys(ctx, powers(10_000, opts.MaxKeys, 10), n, measure) }},
		{"resources", func() error { return lab.curveResources(ctx, powers(1, opts.MaxResources, 10), n, measure) }},
		{"waiters", func() error {
			for _, w := range powers(1, opts.MaxWaiters, 4) {
				op, cleanup, err := prepareHotKey(ctx, lab, int(w))
				if err != nil {
					return err
				}
				measure("hot-key-waiters", w, int(w), op)
				cleanup()
			}
			return nil
		}},
		{"churn", func() (err error) {
			rep.Churn, err = lab.curveChurn(ctx, opts.Cycles)
			return err
		}},
		{"failover", func() error { return lab.curveFailover(ctx, opts.ElectionTTL, opts.Failovers, record) }},
		{"followers", func() error {
			return lab.curveFollowers(ctx, powers(1, opts.MaxFollowers, 4), opts.ElectionTTL, opts.IdleWindow, record)
		}},
	}
	for _, s := range steps {
		if !want[s.name] {
			continue
		}
		if err := s.run(); err != nil {
			return nil, fmt.Errorf("curve %s: %w", s.name, err)
		}
	}
	rep.Comparisons = append(curveVerdicts(rep.Points, rep.Churn), electionVerdicts(rep.Points)...)
	rep.Comparisons = append(rep.Comparisons, retentionVerdict(rep.Retention)...)
	return rep, nil
}

// WriteText prints the report as tables.
func (r *CurvesReport) WriteText(w io.Writer) {
	printCurves(w, r.Points, r.Churn)
	if r.Retention != nil {
		printRetention(w, r.Retention)
	}
	if len(r.Comparisons) > 0 {
		fmt.Fprintln(w, "\nAgainst the goals:")
		for _, v := range r.Comparisons {
			fmt.Fprintf(w, "  %s\n", v)
		}
	}
	fmt.Fprintf(w, "\n%s; %s\n", r.Machine, r.Settings)
	if r.FenceRowsKept {
		fmt.Fprintf(w, "note: the fence rows %q… stay in pgfence.fences (accepted tokens are never deleted)\n", curvePrefix)
	}
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

// The statements that load the curves' rows and read the statistics. They
// write pgfence's tables directly on purpose: loading 10^6 rows through the
// protocol would take longer than measuring them.
const (
	sqlAnalyze    = `ANALYZE pgfence.leases, pgfence.idempotency_keys, pgfence.fences, pgfence_bench.locks, pgfence_bench.curve_fences`
	sqlLoadLeases = `INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at, released_at)
		SELECT $1 OPERATOR(pg_catalog.||) 'lease/' OPERATOR(pg_catalog.||) g, pg_catalog.gen_random_uuid(), 1, t, t, t
		FROM pg_catalog.generate_series($2::bigint, $3::bigint OPERATOR(pg_catalog.-) 1) g,
		     (SELECT pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '1 hour' AS t) c`
	// The hand-written floors' rows, beside pgfence's: expired lock rows of
	// the lock floor, and fence rows at token 1 of the fence-row floor.
	sqlLoadFloorLocks = `INSERT INTO pgfence_bench.locks (key, holder, token, expires_at)
		SELECT $1 OPERATOR(pg_catalog.||) 'lock/' OPERATOR(pg_catalog.||) g, pg_catalog.gen_random_uuid(), 1,
		       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '1 hour'
		FROM pg_catalog.generate_series($2::bigint, $3::bigint OPERATOR(pg_catalog.-) 1) g`
	sqlLoadFloorFences = `INSERT INTO pgfence_bench.curve_fences (resource, token)
		SELECT $1 OPERATOR(pg_catalog.||) 'fence/' OPERATOR(pg_catalog.||) g, 1
		FROM pg_catalog.generate_series($2::bigint, $3::bigint OPERATOR(pg_catalog.-) 1) g`
	sqlLoadKeys = `INSERT INTO pgfence.idempotency_keys (scope, key, fingerprint, mode, status, result, retention, completed_at, expires_at)
		SELECT $1, 'k' OPERATOR(pg_catalog.||) g, pg_catalog.sha256(g::pg_catalog.text::pg_catalog.bytea), 'atomic', 'succeeded', '\x6f6b',
		       interval '1 day', t, t OPERATOR(pg_catalog.+) interval '1 day'
		FROM pg_catalog.generate_series($2::bigint, $3::bigint OPERATOR(pg_catalog.-) 1) g, (SELECT pg_catalog.clock_timestamp() AS t) c`
	// sqlLoadFenceLeases records that each fence resource's lease issued the
	// curve's token (a fenced write presents only such tokens).
	sqlLoadFenceLeases = `INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at, released_at)
		SELECT $1 OPERATOR(pg_catalog.||) 'fence/' OPERATOR(pg_catalog.||) g, pg_catalog.gen_random_uuid(), $2, t, t, t
		FROM pg_catalog.generate_series($3::bigint, $4::bigint OPERATOR(pg_catalog.-) 1) g,
		     (SELECT pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '1 hour' AS t) c`
	sqlLoadFences = `SELECT pg_catalog.count(pgfence.fence($1 OPERATOR(pg_catalog.||) 'fence/' OPERATOR(pg_catalog.||) g, $2))
		FROM pg_catalog.generate_series($3::bigint, $4::bigint OPERATOR(pg_catalog.-) 1) g`
	sqlLoadChurnKeys = `SELECT pg_catalog.count(*) FROM pg_catalog.generate_series(0, $2::int OPERATOR(pg_catalog.-) 1) g,
		pgfence.try_acquire($1 OPERATOR(pg_catalog.||) 'churn/' OPERATOR(pg_catalog.||) g, interval '1 second')`
	sqlDeleteCurveLeases = `DELETE FROM pgfence.leases WHERE pg_catalog.starts_with(key, $1)`
	sqlDeleteCurveEvents = `DELETE FROM pgfence.lease_events WHERE pg_catalog.starts_with(key, $1)`
	sqlDeleteCurveKeys   = `DELETE FROM pgfence.idempotency_keys WHERE scope OPERATOR(pg_catalog.=) $1`
	sqlChurnSettings     = `SELECT name OPERATOR(pg_catalog.||) '=' OPERATOR(pg_catalog.||) setting FROM pg_catalog.pg_settings
		WHERE name OPERATOR(pg_catalog.=) ANY ('{autovacuum,autovacuum_naptime,autovacuum_vacuum_threshold,autovacuum_vacuum_scale_factor,autovacuum_vacuum_cost_limit}'::pg_catalog.text[])
		UNION ALL
		SELECT 'pgfence.leases reloptions=' OPERATOR(pg_catalog.||) coalesce(pg_catalog.array_to_string(reloptions, ','), 'none (fillfactor 100)')
		FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) 'pgfence.leases'::pg_catalog.regclass`
	sqlLeaseStats = `
	SELECT s.n_live_tup, s.n_dead_tup, s.n_tup_upd, s.n_tup_hot_upd, s.autovacuum_count,
	       pg_catalog.pg_total_relation_size('pgfence.leases'),
	       (SELECT pg_catalog.count(*) FROM pgfence.lease_events), pg_catalog.pg_total_relation_size('pgfence.lease_events'),
	       e.n_dead_tup, e.autovacuum_count
	FROM pg_catalog.pg_stat_user_tables s, pg_catalog.pg_stat_user_tables e
	WHERE s.relid OPERATOR(pg_catalog.=) 'pgfence.leases'::pg_catalog.regclass
	  AND e.relid OPERATOR(pg_catalog.=) 'pgfence.lease_events'::pg_catalog.regclass`
)

// bulk runs one loading statement with progress, then ANALYZE.
func (lab *Lab) bulk(ctx context.Context, what string, sql string, args ...any) error {
	start := time.Now()
	fmt.Fprintf(lab.progress, "  loading %s…\n", what)
	if _, err := lab.db.Pool.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("load %s: %w", what, err)
	}
	if _, err := lab.db.Pool.Exec(ctx, sqlAnalyze); err != nil {
		return err
	}
	fmt.Fprintf(lab.progress, "  loaded %s in %s\n", what, time.Since(start).Round(time.Millisecond))
	return nil
}

// curveRows: TryAcquire + Release on a random existing key with 10^3…
// released lease rows in pgfence.leases.
func (lab *Lab) curveRows(ctx context.Context, sizes []int64, n int, measure measureFunc) error {
	client, err := leases.New(lab.pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		return err
	}
	defer client.Close()
	var loaded int64
	for _, size := range sizes {
		if err := lab.bulk(ctx, fmt.Sprintf("lease rows %d…%d", loaded, size), sqlLoadLeases, curvePrefix, loaded, size); err != nil {
			return err
		}
		if err := lab.bulk(ctx, fmt.Sprintf("floor lock rows %d…%d", loaded, size), sqlLoadFloorLocks, curvePrefix, loaded, size); err != nil {
			return err
		}
		loaded = size
		measure("floor-acquire-vs-lock-rows", size, n, func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			return 0, floorLockCycle(ctx, lab, curvePrefix+"lock/"+strconv.FormatInt(w.Rand.Int64N(size), 10), randomUUID(w))
		})
		measure("acquire-vs-lease-rows", size, n, func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			l, err := client.TryAcquire(ctx, curvePrefix+"lease/"+strconv.FormatInt(w.Rand.Int64N(size), 10), 30*time.Second, nil)
			if errors.Is(err, pgfence.ErrLeaseHeld) {
				return 0, benchrun.ErrHeld
			}
			if err != nil {
				return 0, err
			}
			return 0, l.Release(ctx)
		})
	}
	// The churn curve measures the table's growth: leave it as it was.
	if _, err := lab.db.Pool.Exec(ctx, sqlDeleteCurveLeases, curvePrefix+"lease/"); err != nil {
		return err
	}
	_, _ = lab.db.Pool.Exec(ctx, `VACUUM pgfence.leases`) // best effort: needs ownership on a --database-url
	return nil
}

// curveKeys: idempotency.Store.Do on a new key with 10^4… completed keys
// stored.
func (lab *Lab) curveKeys(ctx context.Context, sizes []int64, n int, measure measureFunc) error {
	store, err := idempotency.NewStore(nil)
	if err != nil {
		return err
	}
	var loaded int64
	var seq atomic.Int64
	for _, size := range sizes {
		if err := lab.bulk(ctx, fmt.Sprintf("idempotency keys %d…%d", loaded, size), sqlLoadKeys, curveScope, loaded, size); err != nil {
			return err
		}
		loaded = size
		measure("claim-vs-keys", size, n, func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			req := idempotency.Request{Scope: curveScope, Key: "new/" + strconv.FormatInt(seq.Add(1), 10)}
			_, err := store.Do(ctx, lab.pool, req, func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil })
			return 0, err
		})
	}
	return nil
}

// curveResources: pgfence.Exec on one of 1… resources (each fenced once
// before), updating the resource's stock row.
func (lab *Lab) curveResources(ctx context.Context, sizes []int64, n int, measure measureFunc) error {
	var token int64
	if err := lab.db.Pool.QueryRow(ctx, sqlNextToken).Scan(&token); err != nil {
		return err
	}
	var loaded int64
	for _, size := range sizes {
		if err := lab.bulk(ctx, fmt.Sprintf("fence leases %d…%d", loaded, size), sqlLoadFenceLeases, curvePrefix, token, loaded, size); err != nil {
			return err
		}
		if err := lab.bulk(ctx, fmt.Sprintf("fence rows %d…%d", loaded, size), sqlLoadFences, curvePrefix, token, loaded, size); err != nil {
			return err
		}
		if err := lab.bulk(ctx, fmt.Sprintf("floor fence rows %d…%d", loaded, size), sqlLoadFloorFences, curvePrefix, loaded, size); err != nil {
			return err
		}
		loaded = size
		measure("floor-write-vs-fence-rows", size, n, func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			i := w.Rand.Int64N(size)
			return 0, floorFencedWrite(ctx, lab, sqlCurveFenceRow, curvePrefix+"fence/"+strconv.FormatInt(i, 10), int(i%benchrun.Keys), randomUUID(w))
		})
		measure("fenced-write-vs-resources", size, n, func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			i := w.Rand.Int64N(size)
			_, err := pgfence.Exec(ctx, lab.pool, pgfence.LeaseOf(curvePrefix+"fence/"+strconv.FormatInt(i, 10), "", token), sqlUpdate, i%benchrun.Keys)
			return 0, err
		})
	}
	return nil
}

func (lab *Lab) readLeaseStats(ctx context.Context) (TableStats, error) {
	// Backends report their counters when they go idle or exit, at most once a
	// second: give the closed churn connections the time to.
	var s TableStats
	select {
	case <-time.After(1500 * time.Millisecond):
	case <-ctx.Done():
		return s, ctx.Err()
	}
	conn, err := lab.db.Pool.Acquire(ctx)
	if err != nil {
		return s, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_catalog.pg_stat_clear_snapshot()`); err != nil {
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
        k := '%schurn/' OPERATOR(pg_catalog.||) pg_catalog.floor(pg_catalog.random() OPERATOR(pg_catalog.*) %d)::int;
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
func (lab *Lab) curveChurn(ctx context.Context, cycles int64) (*Churn, error) {
	res := &Churn{Cycles: cycles, Keys: churnKeys}
	rows, err := lab.db.Pool.Query(ctx, sqlChurnSettings)
	if err != nil {
		return nil, err
	}
	settings, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	res.Settings = strings.Join(settings, " ")
	// Every key gets its row first, so the cycles measure updates only.
	if err := lab.bulk(ctx, fmt.Sprintf("%d churn keys", churnKeys), sqlLoadChurnKeys, curvePrefix, churnKeys); err != nil {
		return nil, err
	}
	if res.Before, err = lab.readLeaseStats(ctx); err != nil {
		return nil, err
	}
	const conns = 4
	var cyclesDone atomic.Int64
	status := func() string {
		return fmt.Sprintf("%d of %d cycles (%.0f%%)", cyclesDone.Load(), cycles, 100*float64(cyclesDone.Load())/float64(max(cycles, 1)))
	}
	done := startProgressStatus(lab.progress, fmt.Sprintf("churn: %d acquire/release cycles on %d keys over %d connections", cycles, churnKeys, conns), 0, 0, status)
	// Elsewhere than on a terminal, a line at every tenth.
	var (
		reportMu sync.Mutex
		reported int64 // tenths reported
		lines    = !isTerminal(lab.progress)
		tenth    = max(cycles/10, 1)
	)
	report := func() {
		reportMu.Lock()
		defer reportMu.Unlock()
		if step := cyclesDone.Load() / tenth; lines && step > reported && step < 10 {
			reported = step
			fmt.Fprintf(lab.progress, "  churn: %s\n", status())
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, lab.url)
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
	res.Elapsed = time.Since(start)
	res.CyclesPerS = float64(cycles) / res.Elapsed.Seconds()
	if res.After, err = lab.readLeaseStats(ctx); err != nil {
		return nil, err
	}
	return res, nil
}

// cleanupCurves deletes the rows the curves loaded (not the fence rows).
func (lab *Lab) cleanupCurves() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _ = lab.db.Pool.Exec(ctx, sqlDeleteCurveLeases, curvePrefix)
	_, _ = lab.db.Pool.Exec(ctx, sqlDeleteCurveEvents, curvePrefix)
	_, _ = lab.db.Pool.Exec(ctx, sqlDeleteCurveKeys, curveScope)
}

func printCurves(w io.Writer, points []Point, churn *Churn) {
	if len(points) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "CURVE\tX\tWORKERS\tOPS/S\tP50 MS\tP99 MS\tSTMTS/OP\tSTMTS/S\tERRORS\t")
		for _, p := range points {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.0f\t%d\t\n", p.Curve, p.X, p.Workers, p.OpsPerS, ms(p.P50), ms(p.P99), p.StatementsPerOp, p.StatementsPerS, p.Errors)
		}
		tw.Flush()
	}
	if churn == nil {
		return
	}
	fmt.Fprintf(w, "\nchurn: %d acquire/release cycles on %d keys in %.1fs (%.0f cycles/s); %s\n", churn.Cycles, churn.Keys, churn.Elapsed.Seconds(), churn.CyclesPerS, churn.Settings)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pgfence.leases\tLIVE\tDEAD\tUPDATES\tHOT UPDATES\tAUTOVACUUMS\tTOTAL SIZE\tEVENT ROWS\tEVENTS DEAD\tEVENTS AUTOVACUUMS\tEVENTS SIZE\t")
	for _, r := range []struct {
		name string
		s    TableStats
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
func curveVerdicts(points []Point, churn *Churn) []string {
	var out []string
	ends := func(curve string) (first, last *Point) {
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
	// The scale goal: p50 at the largest size against that at 10^3 (the
	// resources curve starts at 1, where every worker writes the same row).
	scale := func(curve, what string, floor bool) {
		var first, last *Point
		for i := range points {
			if p := &points[i]; p.Curve == curve && p.Ops > 0 && p.X >= 1000 {
				if first == nil {
					first = p
				}
				last = p
			}
		}
		if first == nil || last == first || first.P50 <= 0 {
			return
		}
		r := float64(last.P50) / float64(first.P50)
		note := "goal ≤ 1.5× from 10^3 to 10^7"
		if floor {
			note = "the same growth without pgfence"
		}
		out = append(out, fmt.Sprintf("%s p50 at %d rows is %.2f× that at %d (%s)", what, last.X, r, first.X, note))
	}
	scale("acquire-vs-lease-rows", "acquire + release, by lease rows:", false)
	scale("floor-acquire-vs-lock-rows", "the hand-written lock floor, by lock rows:", true)
	scale("claim-vs-keys", "idempotency claim, by stored keys:", false)
	scale("fenced-write-vs-resources", "fenced write, by fenced resources:", false)
	scale("floor-write-vs-fence-rows", "the hand-written fence row floor, by fence rows:", true)
	if f, l := ends("hot-key-waiters"); f != nil && l != f && f.StatementsPerS > 0 {
		var ratios, handoffs []string
		for _, p := range points {
			if p.Curve == "hot-key-waiters" && p.Ops > 0 {
				ratios = append(ratios, fmt.Sprintf("%d: %.2f×", p.X, p.StatementsPerS/f.StatementsPerS))
				handoffs = append(handoffs, fmt.Sprintf("%d: %.2f ms", p.X, ms(p.P50)))
			}
		}
		out = append(out, fmt.Sprintf("hot key, statements/s against %d waiter(s) — %s (goal: ≤ 2× at every count up to 256)", f.X, strings.Join(ratios, ", ")),
			fmt.Sprintf("hot key, hand-off p50 by waiters — %s (goal ≤ 5 ms)", strings.Join(handoffs, ", ")))
	}
	if churn != nil && churn.Before.TotalBytes > 0 {
		out = append(out, fmt.Sprintf("churn: pgfence.leases went from %s to %s (%.2f×) over %d cycles on %d keys; %d of %d updates were HOT (goal: the table does not grow)",
			bytesString(churn.Before.TotalBytes), bytesString(churn.After.TotalBytes), float64(churn.After.TotalBytes)/float64(churn.Before.TotalBytes),
			churn.Cycles, churn.Keys, churn.After.HotUpdates-churn.Before.HotUpdates, churn.After.Updates-churn.Before.Updates))
	}
	return out
}
