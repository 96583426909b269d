package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/bench"
	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchreport"
)

// Limits of `bench contention`'s flags.
const (
	contentionMaxWorkers = 256
	contentionMaxKeys    = 1000
	contentionMinTTL     = 10 * time.Millisecond
	contentionMaxConsum  = 64
)

func benchContention(fs *flag.FlagSet) runFunc {
	mode := fs.String("mode", bench.ModeLock, "lock: workers take the key's lease and write under it; tasks: workers are producers that enqueue ordered tasks and are told when consumers applied them, after a floor of bare INSERTs of the task rows")
	consumers := fs.Int("consumers", 2, "--mode tasks: consumers applying the keys' tasks, each with its own leases.Client, under leases of --ttl (1 to 64)")
	workers := fs.Int("workers", 16, "concurrent workers, each with its own leases.Client (1 to 256)")
	keys := fs.Int("keys", 4, "hot keys the workers contend for; each grant picks one at random (1 to 1000)")
	duration := fs.Duration("duration", 10*time.Second, "how long workers take new grants (a paused holder's write comes after)")
	ttl := fs.Duration("ttl", 500*time.Millisecond, "the lease TTL of every grant")
	maxWait := fs.Duration("max-wait", time.Second, "how long an Acquire waits before it gives up (0: until the run ends)")
	hold := fs.Duration("hold", 0, "business work per grant before its write, renewing with KeepAlive every TTL/3 (0: write at once)")
	pauseRate := fs.Float64("pause-rate", 0.05, "share of grants whose holder stalls for --pause, without renewing, then still writes (0 to 1)")
	pause := fs.Duration("pause", 2*time.Second, "how long a paused holder stalls; must exceed --ttl")
	htmlPath := htmlFlag(fs)
	pauseFirst := fs.Bool("pause-first", false, "also pause the first grant of every key, for --pause and until another worker has written the key (or the run ends), so that every run has stale writes to reject")
	return func(ctx context.Context, in *input) error {
		switch *mode {
		case bench.ModeLock:
			consumersSet := false
			fs.Visit(func(f *flag.Flag) { consumersSet = consumersSet || f.Name == "consumers" })
			if consumersSet {
				return usageError("--consumers: only with --mode tasks")
			}
		case bench.ModeTasks:
			// The lease mode's own flags would be ignored: say so.
			var lockOnly []string
			fs.Visit(func(f *flag.Flag) {
				if slices.Contains([]string{"max-wait", "hold", "pause-rate", "pause", "pause-first"}, f.Name) {
					lockOnly = append(lockOnly, "--"+f.Name)
				}
			})
			if len(lockOnly) > 0 {
				return usageError("%s: only with --mode lock", strings.Join(lockOnly, ", "))
			}
			*pauseRate = 0
		default:
			return usageError("--mode: %q is neither lock nor tasks", *mode)
		}
		if *consumers < 1 || *consumers > contentionMaxConsum {
			return usageError("--consumers: %d is not from 1 to %d", *consumers, contentionMaxConsum)
		}
		if *workers < 1 || *workers > contentionMaxWorkers {
			return usageError("--workers: %d is not from 1 to %d", *workers, contentionMaxWorkers)
		}
		if *keys < 1 || *keys > contentionMaxKeys {
			return usageError("--keys: %d is not from 1 to %d", *keys, contentionMaxKeys)
		}
		if *duration < 100*time.Millisecond || *duration > bench.MaxDuration {
			return usageError("--duration must be between 100ms and %s, got %s", bench.MaxDuration, *duration)
		}
		if *ttl < contentionMinTTL || *ttl > bench.MaxDuration {
			return usageError("--ttl must be between %s and %s, got %s", contentionMinTTL, bench.MaxDuration, *ttl)
		}
		if *maxWait < 0 || *maxWait > bench.MaxDuration {
			return usageError("--max-wait must be from 0 to %s, got %s", bench.MaxDuration, *maxWait)
		}
		if *hold < 0 || *hold > bench.MaxDuration {
			return usageError("--hold must be from 0 to %s, got %s", bench.MaxDuration, *hold)
		}
		// NaN fails both comparisons: test for what is allowed.
		if !(*pauseRate >= 0 && *pauseRate <= 1) {
			return usageError("--pause-rate must be from 0 to 1, got %v", *pauseRate)
		}
		if (*pauseRate > 0 || *pauseFirst) && (*pause <= *ttl || *pause > bench.MaxDuration) {
			return usageError("--pause must be longer than --ttl (%s), so that the paused holder is stale, and at most %s; got %s", *ttl, bench.MaxDuration, *pause)
		}
		html, err := createHTML(*htmlPath)
		if err != nil {
			return err
		}
		defer html.close()
		// Each consumer's leases client listens on a connection of its own.
		lab, err := openLab(ctx, in, *workers+2*(*consumers), 0)
		if err != nil {
			return err
		}
		defer lab.Close()
		rep, err := lab.Contention(ctx, bench.ContentionOptions{Mode: *mode, Consumers: *consumers, Workers: *workers, Keys: *keys, Duration: *duration, TTL: *ttl,
			MaxWait: *maxWait, Hold: *hold, PauseRate: *pauseRate, Pause: *pause, PauseFirst: *pauseFirst})
		if err != nil {
			return err
		}
		if err := in.print(rep.JSON(), rep.WriteText); err != nil {
			return err
		}
		// Drawn whatever the checks say: a run that failed them is the one to look at.
		if err := html.write(func(w io.Writer) error { return benchreport.Contention(w, rep) }, ""); err != nil {
			return err
		}
		if !rep.Reconciled {
			return &cliError{msg: "bench contention: the business table does not reconcile with the writes the workers saw (see the checks)",
				hint: "this is a bug: please report it with the output of `pgfence bench contention --json`", code: exitFailure}
		}
		if rep.Errors > 0 {
			return &cliError{msg: fmt.Sprintf("bench contention: %d operation(s) failed, first: %s", rep.Errors, rep.FirstError),
				hint: "the figures do not describe a clean run; check the database's health and connection limits", code: exitFailure}
		}
		return nil
	}
}
