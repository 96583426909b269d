package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const benchUsage = `bench [--database-url URL] [--duration 3s] [--warmup 1s] [--workers 1,8] [--cases a,b] [--rounds 1] [--peers redis|none] [--json]
       pgfence bench curves [--database-url URL] [--duration 2s] [--warmup 1s] [--workers 4] [--curves rows,keys,resources,waiters,churn]
                            [--max-rows 1e5] [--max-keys 1e6] [--max-resources 1e5] [--max-waiters 64] [--cycles 20000] [--json]`

func runBench(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 && args[0] == "curves" {
		return runBenchCurves(ctx, e, args[1:])
	}
	fs := newFlags(e, "bench", benchUsage)
	var db dbFlags
	db.register(fs)
	duration := fs.Duration("duration", 3*time.Second, "how long each case runs at each concurrency")
	warmup := fs.Duration("warmup", time.Second, "how long each case runs before its clock starts, outcomes discarded (0 to 10m)")
	workersFlag := fs.String("workers", "1,8", "comma-separated concurrency levels (hot-key: the number of waiters)")
	casesFlag := fs.String("cases", "", "comma-separated case names (default: all)")
	peersFlag := fs.String("peers", "redis", "peers measured in the same run: redis (a local redis-server through redsync, durable and in memory) or none")
	rounds := fs.Int("rounds", 1, "run every case this many times, interleaved, and report each one's median run by ops/s (1 to 20)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, interspersed(fs, args)); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("bench takes no arguments (or the subcommand curves), got %q", fs.Args())
	}
	if *rounds < 1 || *rounds > 20 {
		return usageError("--rounds must be between 1 and 20, got %d", *rounds)
	}
	if err := checkDuration(*duration); err != nil {
		return err
	}
	if err := checkWarmup(*warmup); err != nil {
		return err
	}
	timing := benchTiming{duration: *duration, warmup: *warmup}
	workers, err := parseWorkers(*workersFlag)
	if err != nil {
		return err
	}
	var withRedis bool
	switch *peersFlag {
	case "redis":
		withRedis = true
	case "none", "":
	default:
		return usageError("--peers: %q is not redis or none", *peersFlag)
	}
	all := benchCases()
	cases := slices.DeleteFunc(slices.Clone(all), func(c *benchCase) bool { return c.peer != "" && !withRedis })
	if *casesFlag != "" {
		cases = nil
		for _, name := range strings.Split(*casesFlag, ",") {
			i := slices.IndexFunc(all, func(c *benchCase) bool { return c.name == strings.TrimSpace(name) })
			if i < 0 {
				var names []string
				for _, c := range all {
					names = append(names, c.name)
				}
				return usageError("--cases: unknown case %q (have %s)", name, strings.Join(names, ", "))
			}
			cases = append(cases, all[i])
		}
	}

	b, err := openBench(ctx, e, &db, slices.Max(workers))
	if err != nil {
		return err
	}
	defer b.close()
	peer := &peerRunner{e: e}
	defer peer.close()

	fmt.Fprintf(e.stderr, "bench: %d case(s) × workers %v × %s (after %s of warm-up) × %d round(s); %s\n", len(cases), workers, *duration, *warmup, *rounds, b.settings)
	// Rounds interleave: a drift of the machine (a checkpoint, autovacuum,
	// another process) spreads over every case instead of hitting one.
	samples := make([][]benchrun.Result, len(cases)*len(workers))
	total, step := len(samples)**rounds, 0
	for round := 1; round <= *rounds; round++ {
		for ci, c := range cases {
			for wi, n := range workers {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				step++
				label := fmt.Sprintf("[%d/%d] %s, %d workers", step, total, c.name, n)
				if *rounds > 1 {
					label += fmt.Sprintf(", round %d/%d", round, *rounds)
				}
				done := startProgress(e.stderr, label, timing.total(), time.Duration(total-step+1)*(timing.total()+500*time.Millisecond))
				var r benchrun.Result
				if c.peer != "" {
					r, err = peer.measure(ctx, c.peer, n, timing)
				} else {
					r, err = b.measure(ctx, c, n, timing)
				}
				done()
				if err != nil {
					return fmt.Errorf("bench %s with %d workers: %w", c.name, n, err)
				}
				r.Case, r.Group, r.What = c.name, c.group, c.what
				fmt.Fprintf(e.stderr, "  %s\n", resultLine(r))
				samples[ci*len(workers)+wi] = append(samples[ci*len(workers)+wi], r)
			}
		}
	}
	results := make([]benchrun.Result, len(samples))
	for i, runs := range samples {
		results[i] = medianRun(runs)
	}
	comparisons := compare(samples)
	if *asJSON {
		return writeJSON(e, map[string]any{"machine": b.machine(), "settings": b.settings, "duration_s": duration.Seconds(), "warmup_s": warmup.Seconds(), "rounds": *rounds, "results": results, "comparisons": comparisons})
	}
	printBenchResults(e.stdout, results)
	if len(comparisons) > 0 {
		fmt.Fprintln(e.stdout, "\nAgainst the goals (issue #9, DESIGN.md §7):")
		for _, c := range comparisons {
			fmt.Fprintf(e.stdout, "  %s\n", c)
		}
	}
	fmt.Fprintln(e.stdout)
	for _, c := range cases {
		fmt.Fprintf(e.stdout, "  %-16s %s\n", c.name, c.what)
	}
	fmt.Fprintf(e.stdout, "\n%s; %s\n", b.machine(), b.settings)
	return nil
}

// medianRun returns the run with the median ops/s (the lower middle one of an
// even count), whole: its latencies and counts belong to the same run. Errors
// are not hidden by the choice: it carries the errors of every run.
func medianRun(runs []benchrun.Result) benchrun.Result {
	sorted := slices.Clone(runs)
	slices.SortStableFunc(sorted, func(a, b benchrun.Result) int { return cmp.Compare(a.OpsPerS, b.OpsPerS) })
	m := sorted[(len(sorted)-1)/2]
	m.Errors, m.FirstError = 0, ""
	for _, r := range runs {
		m.Errors += r.Errors
		if m.FirstError == "" {
			m.FirstError = r.FirstError
		}
	}
	return m
}

// benchTiming is how long one case or curve point runs: warmup, then
// duration on the clock.
type benchTiming struct {
	duration, warmup time.Duration
}

func (t benchTiming) total() time.Duration { return t.warmup + t.duration }

// config is the benchrun configuration of n workers; started is called when
// the clock starts.
func (t benchTiming) config(n int, started func()) benchrun.Config {
	return benchrun.Config{Workers: n, Duration: t.duration, Warmup: t.warmup, Started: started}
}

// checkWarmup checks --warmup: 0 (the first operation of each worker only)
// up to maxBenchDuration.
func checkWarmup(d time.Duration) error {
	if d < 0 || d > maxBenchDuration {
		return usageError("--warmup must be from 0 to %s, got %s", maxBenchDuration, d)
	}
	return nil
}

// maxBenchDuration is the longest --duration, of one case or one curve point.
const maxBenchDuration = 10 * time.Minute

func checkDuration(d time.Duration) error {
	if d < 100*time.Millisecond || d > maxBenchDuration {
		return usageError("--duration must be between 100ms and 10m, got %s", d)
	}
	return nil
}

func parseWorkers(s string) ([]int, error) {
	var workers []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 256 {
			return nil, usageError("--workers: %q is not a number from 1 to 256", f)
		}
		workers = append(workers, n)
	}
	return workers, nil
}

// benchDB is the database a bench runs on, with a pool whose statements are
// counted.
type benchDB struct {
	db       *pgfencetest.Database
	pool     *pgxpool.Pool // traced: the cases run here
	stmts    *statementCounter
	settings string // the durability settings, for the report
	version  string
}

// openBench opens the database (or a throwaway durable local cluster) and a
// traced pool sized for maxWorkers, and creates the bench tables.
func openBench(ctx context.Context, e *env, db *dbFlags, maxWorkers int) (*benchDB, error) {
	url := db.url
	if url == "" {
		url = e.getenv("DATABASE_URL")
	}
	if url != "" {
		// Every command's check first: a bad or unreachable URL is explained
		// as everywhere else, within --connect-timeout.
		pool, err := db.connect(ctx, e)
		if err != nil {
			return nil, err
		}
		pool.Close()
	}
	d, err := pgfencetest.Start(ctx, &pgfencetest.StartOptions{URL: url, Progress: e.stderr, MaxConns: 8, Settings: map[string]string{
		// hot-key: one LISTEN connection per waiter, besides the pool
		"max_connections": strconv.Itoa(2*maxWorkers + 100),
		"shared_buffers":  "128MB",
	}})
	if err != nil {
		return nil, &cliError{msg: redact(err.Error()), hint: "omit --database-url to use a throwaway local PostgreSQL, or pass a reachable URL", code: exitUnavailable, err: err}
	}
	b := &benchDB{db: d, stmts: &statementCounter{}}
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	cfg.MaxConns = int32(maxWorkers + 8)
	cfg.ConnConfig.Tracer = b.stmts
	if b.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		_ = d.Close()
		return nil, err
	}
	var fsync, syncCommit, autovacuum string
	if err := d.Pool.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('autovacuum'), current_setting('server_version')`).Scan(&fsync, &syncCommit, &autovacuum, &b.version); err != nil {
		b.close()
		return nil, err
	}
	b.settings = fmt.Sprintf("PostgreSQL %s, fsync=%s synchronous_commit=%s autovacuum=%s", b.version, fsync, syncCommit, autovacuum)
	if d.Throwaway() {
		b.settings += " (throwaway local cluster)"
	}
	if _, err := d.Pool.Exec(ctx, benchSchema); err != nil {
		b.close()
		return nil, fmt.Errorf("bench setup: %w", err)
	}
	return b, nil
}

// cleanupTimeout bounds what the bench undoes on its way out (also after
// Ctrl-C, or with the database gone): it must not hang the exit.
const cleanupTimeout = 30 * time.Second

func (b *benchDB) close() {
	if b.pool != nil {
		b.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = b.db.Pool.Exec(ctx, `DROP SCHEMA IF EXISTS pgfence_bench CASCADE`)
	_ = b.db.Close()
}

func (b *benchDB) machine() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%s, %d CPUs, %s, host %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), host)
}

// measure runs one PostgreSQL case with n workers as t says and counts the
// statements the pool sent while the clock ran.
func (b *benchDB) measure(ctx context.Context, c *benchCase, n int, t benchTiming) (benchrun.Result, error) {
	op, cleanup, err := c.prepare(ctx, b, n)
	if err != nil {
		return benchrun.Result{}, err
	}
	defer cleanup()
	// Every case starts right after a checkpoint, so none pays for another's
	// checkpoint I/O, and then warms up: the first change of each page after
	// a checkpoint writes a full-page image to the WAL, a cost that a server
	// spreads over its checkpoint interval (5 min by default) but that would
	// dominate a few seconds measured right after one, charged to whichever
	// case writes more pages. Without the privilege (pg_checkpoint, on
	// --database-url) the cases run as the server's checkpoints fall.
	_, _ = b.db.Pool.Exec(ctx, `CHECKPOINT`)
	var before int64
	r := benchrun.Run(ctx, op, t.config(n, func() { before = b.stmts.Load() }))
	r.SetStatements(b.stmts.Load() - before)
	return r, nil
}

// startProgress shows what runs on w: on a terminal a line refreshed with the
// elapsed and remaining time, elsewhere one line when the step starts. d is the
// step's duration and left the whole run's estimate (0: unknown). The returned
// function clears the line.
func startProgress(w io.Writer, label string, d, left time.Duration) (done func()) {
	return startProgressStatus(w, label, d, left, nil)
}

// isTerminal reports whether w is a terminal (progress lines are redrawn).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// startProgressStatus is startProgress with a status (how far the step has
// come) appended to the refreshed line; nil for none.
func startProgressStatus(w io.Writer, label string, d, left time.Duration, status func() string) (done func()) {
	tty := isTerminal(w)
	if d > 0 {
		label += " for " + d.String()
	}
	if !tty {
		if left > 0 {
			label += fmt.Sprintf(" (about %s left in all)", left.Round(time.Second))
		}
		fmt.Fprintf(w, "  %s\n", label)
		return func() {}
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		start := time.Now()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			el := time.Since(start)
			line := fmt.Sprintf("\r\033[K  %s: %s elapsed", label, el.Round(100*time.Millisecond))
			if status != nil {
				line += ", " + status()
			}
			if left > 0 {
				line += fmt.Sprintf(", about %s left in all", max(left-el, 0).Round(time.Second))
			}
			fmt.Fprint(w, line)
			select {
			case <-stop:
				fmt.Fprint(w, "\r\033[K")
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(stop); <-stopped }
}

func resultLine(r benchrun.Result) string {
	if r.Skipped != "" {
		return fmt.Sprintf("%-16s %3d workers: skipped: %s", r.Case, r.Workers, r.Skipped)
	}
	s := fmt.Sprintf("%-16s %3d workers: %8.0f ops/s  p50 %.2f ms  p99 %.2f ms  %.2f statements/op", r.Case, r.Workers, r.OpsPerS, r.P50ms, r.P99ms, r.StatementsPerOp)
	if r.Errors > 0 {
		s += fmt.Sprintf("  %d errors (first: %s)", r.Errors, oneLine(r.FirstError))
	}
	return s
}

func printBenchResults(w io.Writer, results []benchrun.Result) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "GROUP\tCASE\tWORKERS\tOPS/S\tP50 MS\tP99 MS\tSTMTS/OP\tSTMTS/S\tHELD\tERRORS\t")
	var skipped, failed []string
	for _, r := range results {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\t%d\tskipped\t-\t-\t-\t-\t-\t-\t\n", r.Group, r.Case, r.Workers)
			if s := r.Case + ": " + r.Skipped; !slices.Contains(skipped, s) {
				skipped = append(skipped, s)
			}
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.0f\t%d\t%d\t\n", r.Group, r.Case, r.Workers, r.OpsPerS, r.P50ms, r.P99ms, r.StatementsPerOp, r.StatementsPerS, r.Held, r.Errors)
		if r.Errors > 0 {
			failed = append(failed, fmt.Sprintf("%s, %d workers: %d errors, first: %s", r.Case, r.Workers, r.Errors, oneLine(r.FirstError)))
		}
	}
	tw.Flush()
	for _, s := range skipped {
		fmt.Fprintf(w, "skipped %s\n", s)
	}
	for _, s := range failed {
		fmt.Fprintf(w, "errors in %s\n", s)
	}
}

// compare states the run's figures against the goals of issue #9. runs holds
// every round of each case at each concurrency. A ratio between two cases is
// taken round by round, between runs that ran next to each other, and the
// median of those is reported with their range: the machine's drift between
// rounds (fsync latency varies by a third on a VM) cancels instead of
// landing on whichever case it hit.
func compare(runs [][]benchrun.Result) []string {
	find := func(name string, n int) []benchrun.Result {
		for _, rs := range runs {
			if len(rs) > 0 && rs[0].Case == name && rs[0].Workers == n {
				return rs
			}
		}
		return nil
	}
	var out []string
	var levels []int
	for _, rs := range runs {
		if len(rs) > 0 && !slices.Contains(levels, rs[0].Workers) {
			levels = append(levels, rs[0].Workers)
		}
	}
	opsRatio := func(a, b benchrun.Result) float64 { return a.OpsPerS / b.OpsPerS }
	p50Ratio := func(a, b benchrun.Result) float64 { return a.P50ms / b.P50ms }
	pct := func(x float64) string { return fmt.Sprintf("%.0f%%", 100*x) }
	times := func(x float64) string { return fmt.Sprintf("%.2f×", x) }
	for _, n := range levels {
		pair := func(a, b string, ratio func(a, b benchrun.Result) float64, show func(float64) string, text string) {
			if v, ok := pairedRatio(find(a, n), find(b, n), ratio, show); ok {
				out = append(out, fmt.Sprintf("%3d workers: "+text, n, v))
			}
		}
		pair("leases", "raw-lock-upsert", opsRatio, pct, "leases acquire+release at %s of the raw inline-upsert floor's ops/s (goal ≥ 90%%)")
		pair("leases", "redis-durable", opsRatio, pct, "leases acquire+release at %s of durable Redis (redsync) ops/s")
		pair("fenced-update", "raw-update", p50Ratio, times, "fenced write (pgfence.Exec) p50 %s the unfenced UPDATE (goal ≤ 1.15×)")
		pair("raw-fence-row", "raw-update", p50Ratio, times, "a hand-written fence row in the same batch: p50 %s the unfenced UPDATE (the floor of a fence that records its writes)")
		pair("versioned-update", "raw-update", p50Ratio, times, "versioned row write (pgfence.UpdateRow) p50 %s the unfenced UPDATE (goal ≤ 1.15×)")
		if h := medianOf(find("hot-key", n)); h != nil {
			out = append(out, fmt.Sprintf("%3d workers: hot-key hand-off p50 %.2f ms (goal ≤ 5 ms)", n, h.P50ms))
		}
	}
	if len(levels) > 1 {
		most := slices.Max(levels)
		stmts := func(a, b benchrun.Result) float64 { return a.StatementsPerS / b.StatementsPerS }
		if v, ok := pairedRatio(find("hot-key", most), find("hot-key", 1), stmts, times); ok && most > 1 {
			out = append(out, fmt.Sprintf("hot key: %d waiters send %s the statements/s of 1 (goal for 64: ≤ 2×)", most, v))
		}
	}
	return out
}

// pairedRatio computes ratio(a[i], b[i]) for every round i in which both ran,
// and formats the median with show; with more than one round it adds their
// range. ok is false when no round has both.
func pairedRatio(a, b []benchrun.Result, ratio func(a, b benchrun.Result) float64, show func(float64) string) (_ string, ok bool) {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if usable(a[i]) && usable(b[i]) {
			if v := ratio(a[i], b[i]); v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
				rs = append(rs, v)
			}
		}
	}
	if len(rs) == 0 {
		return "", false
	}
	slices.Sort(rs)
	m := show(rs[(len(rs)-1)/2])
	if len(rs) > 1 {
		m += fmt.Sprintf(" (%d rounds: %s to %s)", len(rs), show(rs[0]), show(rs[len(rs)-1]))
	}
	return m, true
}

// usable tells whether a run measured something.
func usable(r benchrun.Result) bool { return r.Skipped == "" && r.Ops > 0 }

// medianOf is the median run of the usable ones, nil if none.
func medianOf(runs []benchrun.Result) *benchrun.Result {
	ok := slices.DeleteFunc(slices.Clone(runs), func(r benchrun.Result) bool { return !usable(r) })
	if len(ok) == 0 {
		return nil
	}
	m := medianRun(ok)
	return &m
}
