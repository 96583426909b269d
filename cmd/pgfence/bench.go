package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/bench"
	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchreport"
)

func benchCompare(fs *flag.FlagSet) runFunc {
	duration := fs.Duration("duration", 3*time.Second, "how long each case runs at each concurrency")
	warmup := fs.Duration("warmup", time.Second, "how long each case runs before its clock starts, outcomes discarded (0 to 10m)")
	workersFlag := fs.String("workers", "1,8", "comma-separated concurrency levels (hot-key: the number of waiters)")
	casesFlag := fs.String("cases", "", "comma-separated case names (default: all)")
	peersFlag := fs.String("peers", "redis", "peers measured in the same run: redis (a local redis-server through redsync, durable and in memory) or none")
	rounds := fs.Int("rounds", 1, "run every case this many times, interleaved, and report each one's median run by ops/s (1 to 20)")
	rtt := fs.Duration("rtt", 0, "add this much to every round trip to PostgreSQL, as a network would (a delaying proxy in the bench process; 0 to 100ms; needs --peers none)")
	htmlPath := htmlFlag(fs)
	return func(ctx context.Context, in *input) error {
		if *rounds < 1 || *rounds > 20 {
			return usageError("--rounds must be between 1 and 20, got %d", *rounds)
		}
		if *rtt < 0 || *rtt > maxRTT {
			return usageError("--rtt must be from 0 to %s, got %s", maxRTT, *rtt)
		}
		timing, err := benchTiming(*duration, *warmup)
		if err != nil {
			return err
		}
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
		if *rtt > 0 && withRedis {
			return usageError("--rtt delays PostgreSQL only, so the Redis peers would not be compared fairly: add --peers none")
		}
		all := bench.Cases()
		cases := slices.DeleteFunc(slices.Clone(all), func(c *bench.Case) bool { return c.Peer() && !withRedis })
		if *casesFlag != "" {
			cases = nil
			for _, name := range strings.Split(*casesFlag, ",") {
				i := slices.IndexFunc(all, func(c *bench.Case) bool { return c.Name == strings.TrimSpace(name) })
				if i < 0 {
					var names []string
					for _, c := range all {
						names = append(names, c.Name)
					}
					return usageError("--cases: unknown case %q (have %s)", name, strings.Join(names, ", "))
				}
				cases = append(cases, all[i])
			}
		}
		html, err := createHTML(*htmlPath)
		if err != nil {
			return err
		}
		defer html.close()
		lab, err := openLab(ctx, in, slices.Max(workers), *rtt)
		if err != nil {
			return err
		}
		defer lab.Close()
		rep, err := lab.Compare(ctx, bench.CompareOptions{Cases: cases, Workers: workers, Rounds: *rounds, Timing: timing, Getenv: in.getenv})
		if err != nil {
			return err
		}
		if err := in.print(rep.JSON(), rep.WriteText); err != nil {
			return err
		}
		return html.write(func(w io.Writer) error { return benchreport.Compare(w, rep) },
			"the report draws the ratios between two cases: run both cases of one, such as --cases leases,raw-lock-upsert")
	}
}

func benchCurves(fs *flag.FlagSet) runFunc {
	duration := fs.Duration("duration", 2*time.Second, "how long each point is measured")
	warmup := fs.Duration("warmup", time.Second, "how long each point runs before its clock starts, outcomes discarded (0 to 10m)")
	workers := fs.Int("workers", 4, "concurrent workers at each point (the hot-key curve varies its waiters instead)")
	maxRows, maxKeys, maxResources, maxWaiters, cycles := countFlag(100_000), countFlag(1_000_000), countFlag(100_000), countFlag(64), countFlag(20_000)
	fs.Var(&maxRows, "max-rows", "acquire latency with 10^3 … this many lease rows (10^6: opt-in, loads in about a minute)")
	fs.Var(&maxKeys, "max-keys", "idempotency claim with 10^4 … this many stored keys (10^7: opt-in, several minutes)")
	fs.Var(&maxResources, "max-resources", "fenced write over 1 … this many resources")
	fs.Var(&maxWaiters, "max-waiters", "hot key with 1, 4, 16 … this many waiters (256: opt-in)")
	fs.Var(&cycles, "cycles", "acquire/release cycles of the churn measurement (10^6: opt-in, many minutes with fsync on)")
	oneOff := countFlag(100_000)
	fs.Var(&oneOff, "one-off", "one-off resources the retention curve makes, in 10 cycles each followed by the maintenance (10^7: opt-in, an hour or more)")
	electionTTL := fs.Duration("election-ttl", 2*time.Second, "the election's TTL in the failover and followers curves (1s to 1m)")
	failovers := fs.Int("failovers", 10, "leaders the failover curve kills, one after the other (1 to 1000)")
	maxFollowers := countFlag(64)
	fs.Var(&maxFollowers, "max-followers", "idle followers of one leader: 1, 4, 16 … this many (at most 256)")
	idleWindow := fs.Duration("idle-window", 30*time.Second, "how long the followers curve counts each size's statements (1s to 10m)")
	only := fs.String("curves", "", "comma-separated subset of "+strings.Join(bench.CurveNames(), ", ")+" (default: all)")
	htmlPath := htmlFlag(fs)
	return func(ctx context.Context, in *input) error {
		timing, err := benchTiming(*duration, *warmup)
		if err != nil {
			return err
		}
		switch {
		case *electionTTL < time.Second || *electionTTL > time.Minute:
			return usageError("--election-ttl: %s is not from 1s to 1m", *electionTTL)
		case *failovers < 1 || *failovers > 1000:
			return usageError("--failovers: %d is not from 1 to 1000", *failovers)
		case maxFollowers < 1 || maxFollowers > 256:
			return usageError("--max-followers: %d is not from 1 to 256", maxFollowers)
		case *idleWindow < time.Second || *idleWindow > bench.MaxDuration:
			return usageError("--idle-window: %s is not from 1s to %s", *idleWindow, bench.MaxDuration)
		}
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
		}{{"max-rows", maxRows, 1000}, {"max-keys", maxKeys, 10_000}, {"max-resources", maxResources, 1}, {"cycles", cycles, 1}, {"one-off", oneOff, 10}} {
			if f.got < f.min {
				return usageError("--%s: %d is below the curve's first point, %d", f.name, f.got, f.min)
			}
		}
		var curves []string
		if *only != "" {
			for _, c := range strings.Split(*only, ",") {
				c = strings.TrimSpace(c)
				if !slices.Contains(bench.CurveNames(), c) {
					return usageError("--curves: unknown curve %q (have %s)", c, strings.Join(bench.CurveNames(), ", "))
				}
				curves = append(curves, c)
			}
		}
		html, err := createHTML(*htmlPath)
		if err != nil {
			return err
		}
		defer html.close()
		// Every follower has a pool connection and a LISTEN connection.
		lab, err := openLab(ctx, in, max(*workers, int(maxWaiters), int(maxFollowers)), 0)
		if err != nil {
			return err
		}
		defer lab.Close()
		rep, err := lab.Curves(ctx, bench.CurvesOptions{Curves: curves, Timing: timing, Workers: *workers,
			MaxRows: int64(maxRows), MaxKeys: int64(maxKeys), MaxResources: int64(maxResources), MaxWaiters: int64(maxWaiters), Cycles: int64(cycles), OneOff: int64(oneOff),
			ElectionTTL: *electionTTL, Failovers: *failovers, MaxFollowers: int64(maxFollowers), IdleWindow: *idleWindow})
		if err != nil {
			return err
		}
		if err := in.print(rep.JSON(), rep.WriteText); err != nil {
			return err
		}
		return html.write(func(w io.Writer) error { return benchreport.Curves(w, rep) },
			"churn and failover are tables only: add rows, keys, resources, waiters, followers or retention to --curves")
	}
}

// openLab opens the bench's database: the one of --database-url or
// DATABASE_URL, checked like every command's first, or a throwaway local
// cluster.
// maxRTT is the largest --rtt: more is no longer a network a database
// client would be run across.
const maxRTT = 100 * time.Millisecond

// openLab opens the bench's database; rtt > 0 delays every round trip of
// the cases by that much (bench.Open).
func openLab(ctx context.Context, in *input, maxWorkers int, rtt time.Duration) (*bench.Lab, error) {
	url := in.db.url
	if url == "" {
		url = in.getenv("DATABASE_URL")
	}
	pooled := false
	if url != "" {
		// Every command's check first: a bad or unreachable URL is explained
		// as everywhere else, within --connect-timeout.
		pool, err := in.connect(ctx)
		if err != nil {
			return nil, err
		}
		// The bench measures pgx's default exec mode (prepared statements,
		// one round trip per execution) unless a pooler is in between,
		// where prepared statements break: then it measures exec mode, and
		// says so.
		probe, err := probePooler(ctx, pool)
		pool.Close()
		if err != nil {
			return nil, dbError(err)
		}
		pooled = probe.pooled()
		if pooled && !namesExecMode(url) {
			fmt.Fprintln(in.stderr, "a pooler answers at this URL: the bench sends its statements with default_query_exec_mode=exec, and its figures include the pooler's hop")
			url = withExecMode(url)
		}
	}
	lab, err := bench.Open(ctx, url, maxWorkers, rtt, in.stderr)
	if err != nil {
		return nil, &cliError{msg: redact(err.Error()), hint: "omit --database-url and unset DATABASE_URL to use a throwaway local PostgreSQL, or pass a reachable URL", code: exitUnavailable, err: err}
	}
	lab.SetPooled(pooled)
	return lab, nil
}

// benchTiming checks --duration (100ms to 10m) and --warmup (0, the first
// operation of each worker only, to 10m).
func benchTiming(duration, warmup time.Duration) (bench.Timing, error) {
	if duration < 100*time.Millisecond || duration > bench.MaxDuration {
		return bench.Timing{}, usageError("--duration must be between 100ms and %s, got %s", bench.MaxDuration, duration)
	}
	if warmup < 0 || warmup > bench.MaxDuration {
		return bench.Timing{}, usageError("--warmup must be from 0 to %s, got %s", bench.MaxDuration, warmup)
	}
	return bench.Timing{Duration: duration, Warmup: warmup}, nil
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
