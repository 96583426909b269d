// Package benchrun runs one operation with N concurrent workers for a fixed
// time and summarizes it: ops/s, p50/p99 latency, statements per operation.
//
// It is shared by `pgfence bench` and by the Redis peer (cmd/pgfence/internal/benchpeer, a
// separate Go module so that pgfence users never inherit Redis dependencies),
// so that every row of the bench table is measured the same way: the same key
// space, the same warm-up, the same stop rule and the same percentiles. It
// depends on the standard library only.
package benchrun

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Keys is the key space: every case picks random keys out of 100k.
const Keys = 100_000

// ErrHeld marks an attempt that found its key held by another worker (two
// workers drew the same random key): contention, counted in Result.Held, not a
// sample and not an error.
var ErrHeld = errors.New("benchrun: key held by another worker")

// Worker is one worker's state, handed to every call of its [Op].
type Worker struct {
	// ID is the worker's index, 0 to Workers-1.
	ID int
	// Rand is the worker's own random source.
	Rand *rand.Rand
}

// Key returns a random key out of [Keys].
func (w *Worker) Key() int { return w.Rand.IntN(Keys) }

// Op runs one operation. It returns the latency sample to record, or 0 to
// record the call's own duration (a hand-off case measures something else
// than its call: the time from one holder's release to the next grant).
type Op func(ctx context.Context, w *Worker) (sample time.Duration, err error)

// Config says how to run an [Op].
type Config struct {
	// Workers is the number of concurrent workers (at least 1).
	Workers int
	// Duration is how long workers start new operations. Every operation
	// started before it ends is awaited and counted, so no connection is cut
	// in the middle of a statement.
	Duration time.Duration
	// Warmup is how long all workers keep running the operation after the
	// first call of each, outside the clock, its outcomes discarded. A
	// database case needs it to reach its steady state: right after a
	// checkpoint the first change of each page writes a full-page image to
	// the WAL, and a case that writes more pages pays more of them.
	Warmup time.Duration
	// Started, if set, is called once the warm-up is over, right before the
	// clock starts (to snapshot statement counters).
	Started func()
}

// Result summarizes one case at one concurrency. The statement fields are
// filled in by the caller, which knows how to count them. Its JSON is how the
// Redis peer hands a result to the bench (durations in nanoseconds), not what
// `pgfence bench compare --json` prints.
type Result struct {
	Case    string `json:"case"`
	Group   string `json:"group,omitempty"`
	What    string `json:"what,omitempty"`
	Workers int    `json:"workers"`
	// Ops counts the successful operations (the samples).
	Ops int `json:"ops"`
	// Errors counts failed operations; FirstError is the first one's text.
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// Held counts attempts that found their random key held by another worker.
	Held int `json:"held"`
	// Elapsed is the time on the clock, from its start until every operation
	// started before Duration ended had returned.
	Elapsed time.Duration `json:"elapsed_ns"`
	OpsPerS float64       `json:"ops_per_s"`
	// P50 and P99 are the latency percentiles of the samples.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// Statements counts the database statements (Redis: commands) the client
	// sent while the clock ran; StatementsPerOp divides it by Ops.
	Statements      int64   `json:"statements"`
	StatementsPerOp float64 `json:"statements_per_op"`
	StatementsPerS  float64 `json:"statements_per_s"`
	// Skipped, when set, says why the case did not run; nothing else is valid.
	Skipped string `json:"skipped,omitempty"`
}

// SetStatements records n statements sent during the run and derives the rates.
func (r *Result) SetStatements(n int64) {
	r.Statements = n
	if r.Ops > 0 {
		r.StatementsPerOp = float64(n) / float64(r.Ops)
	}
	if r.Elapsed > 0 {
		r.StatementsPerS = float64(n) / r.Elapsed.Seconds()
	}
}

// Run warms up (every worker runs op once, outside the clock: connections
// open, statements get planned; then, with cfg.Warmup, all workers keep
// running op for that long, still outside the clock), then runs op with
// cfg.Workers workers until cfg.Duration has passed and every started
// operation has returned.
func Run(ctx context.Context, op Op, cfg Config) Result {
	n := max(cfg.Workers, 1)
	workers := make([]*Worker, n)
	seed := uint64(time.Now().UnixNano())
	for i := range workers {
		workers[i] = &Worker{ID: i, Rand: rand.New(rand.NewPCG(uint64(i), seed))}
	}
	var warm sync.WaitGroup
	for _, w := range workers {
		warm.Add(1)
		go func() {
			defer warm.Done()
			_, _ = op(ctx, w)
		}()
	}
	warm.Wait()
	if cfg.Warmup > 0 {
		drive(ctx, op, workers, cfg.Warmup)
	}
	if cfg.Started != nil {
		cfg.Started()
	}
	start := time.Now()
	t := drive(ctx, op, workers, cfg.Duration)
	return Summarize(t.lat, time.Since(start), n, t.errs, t.held, t.first)
}

// tally is what the workers of one [drive] did.
type tally struct {
	lat        []time.Duration
	errs, held int
	first      error
}

// drive runs op on every worker until d has passed and every started
// operation has returned, and collects the outcomes.
func drive(ctx context.Context, op Op, workers []*Worker, d time.Duration) tally {
	var stop atomic.Bool
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	var (
		mu  sync.Mutex
		all tally
		wg  sync.WaitGroup
	)
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine tally
			for !stop.Load() && ctx.Err() == nil {
				t0 := time.Now()
				sample, err := op(ctx, w)
				switch {
				case errors.Is(err, ErrHeld):
					mine.held++
				case err != nil:
					if ctx.Err() != nil {
						break // interrupted: not the case's failure
					}
					if mine.first == nil {
						mine.first = err
					}
					mine.errs++
				default:
					if sample <= 0 {
						sample = time.Since(t0)
					}
					mine.lat = append(mine.lat, sample)
				}
			}
			mu.Lock()
			all.lat = append(all.lat, mine.lat...)
			all.errs += mine.errs
			all.held += mine.held
			if all.first == nil {
				all.first = mine.first
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all
}

// Summarize turns latency samples into a [Result] (Case and What left empty).
func Summarize(lat []time.Duration, elapsed time.Duration, workers, errs, held int, firstErr error) Result {
	slices.Sort(lat)
	r := Result{Workers: workers, Ops: len(lat), Errors: errs, Held: held, Elapsed: elapsed}
	if firstErr != nil {
		r.FirstError = firstErr.Error()
	}
	if elapsed > 0 {
		r.OpsPerS = float64(len(lat)) / elapsed.Seconds()
	}
	if len(lat) > 0 {
		r.P50 = lat[len(lat)/2]
		r.P99 = lat[len(lat)*99/100]
	}
	return r
}
