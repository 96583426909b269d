// Command cron shows a scheduled job that runs on several instances and still
// runs each time slot exactly once, even when an instance freezes mid-run.
//
// Three instances tick through four slots of the job "nightly-report", each
// with a job.Runner on the job's lease: for every slot, Run takes the lease,
// skips the slot if it was completed, and otherwise runs the job, which
// records the slot's result together with the slot's completion
// (Slot.Finish: one transaction, fenced with the run's token). In slot 03:00
// the first instance to run it freezes mid-run for longer than its lease: its
// keep-alive stops, as a frozen process's would, so the lease runs out;
// another instance takes the slot over (run 2) and completes it. When the
// frozen one wakes up, its result is rejected by the database.
//
// Run it:
//
//	go run ./examples/cron                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/cron
//
// It exits non-zero unless every slot has exactly one recorded run and the
// frozen instance's late result was rejected.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/job"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	pausedSlot = "03:00"
	ttl        = time.Second // longer than a run, shorter than the freeze
)

var (
	slots     = []string{"01:00", "02:00", "03:00", "04:00"}
	instances = []string{"instance-a", "instance-b", "instance-c"}
)

func main() {
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("cron", func(ctx context.Context, db *pgfencetest.Database) error {
		_, err := run(ctx, db.Pool, os.Stdout)
		return err
	})
}

// result is the business outcome, checked by main_test.go.
type result struct {
	RunsPerSlot   map[string]int // recorded runs per slot
	Executions    int            // job bodies that ran to the end (the frozen one included)
	Skipped       int            // Run found the slot completed
	StaleRejected int            // late results refused by the fence
	TakenOver     bool           // the frozen slot was completed by another instance, in run 2
}

func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (result, error) {
	res := result{RunsPerSlot: map[string]int{}}
	var mu sync.Mutex // serialises output and res
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "  "+format+"\n", args...)
	}

	_, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS example_cron_runs;
		CREATE TABLE example_cron_runs (
			job text, slot text, instance text NOT NULL, token bigint NOT NULL, result text NOT NULL,
			PRIMARY KEY (job, slot));`)
	if err != nil {
		return res, err
	}
	// The job's lease key, and its fenced resource. The slots are named by
	// the time of day only, so that a rerun on the same database runs them
	// again, the key has a per-run id (a real job names its slots by date,
	// as RunPeriod does, and keeps one key).
	jobKey := "cron/nightly-report/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	client, err := leases.New(pool, nil)
	if err != nil {
		return res, err
	}
	defer client.Close()
	fmt.Fprintf(out, "cron: job nightly-report, slots %v, on %d instances\n", slots, len(instances))

	// Every instance waits for the job's lease (at most 5 s) rather than
	// skipping the slot: the winner may die, and a waiter then takes over.
	hold := leases.AcquireOptions{MaxWait: 5 * time.Second}
	runner, err := job.New(client, jobKey, &job.Config{TTL: ttl, AcquireOptions: hold})
	if err != nil {
		return res, err
	}
	// Slot 03:00 runs with a hold limit of half a second: a run that freezes
	// longer than that loses its keep-alive, as a frozen process would, and
	// its lease runs out by the database clock a TTL after its last renewal.
	freezable := hold
	freezable.MaxHold = 500 * time.Millisecond
	pausable, err := job.New(client, jobKey, &job.Config{TTL: ttl, AcquireOptions: freezable})
	if err != nil {
		return res, err
	}

	var (
		freezeOnce sync.Once
		recorded   = make(chan struct{}) // closed when the paused slot is recorded
	)
	runSlot := func(instance, slot string) error {
		r := runner
		if slot == pausedSlot {
			r = pausable
		}
		outcome, err := r.Run(ctx, slot, func(ctx context.Context, s *job.Slot) error {
			// The job itself. The first run of the paused slot freezes here
			// (a GC pause, a frozen container) until another instance
			// completed it, deaf to its context.
			frozen := false
			if slot == pausedSlot {
				freezeOnce.Do(func() { frozen = true })
			}
			if frozen {
				say("%s %s began the slot (token %d) and froze mid-run", slot, instance, s.Lease().Token())
				select {
				case <-recorded:
				case <-time.After(10 * time.Second):
				}
			} else {
				time.Sleep(20 * time.Millisecond)
			}
			mu.Lock()
			res.Executions++
			mu.Unlock()

			// Record the slot's result with its completion, in one fenced
			// transaction: not guarded by the lease's context (a pause can
			// strike between any check and the write), only the database
			// can tell that the write is late.
			err := s.Finish(context.WithoutCancel(ctx), func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO example_cron_runs VALUES ('nightly-report', $1, $2, $3, $4)`,
					slot, instance, s.Lease().Token(), "report for "+slot+" by "+instance)
				return err
			})
			var stale *pgfence.StaleTokenError
			switch {
			case errors.As(err, &stale):
				mu.Lock()
				res.StaleRejected++
				mu.Unlock()
				say("%s %s woke up and recorded its result with token %d: REJECTED (run %d began with token %d since)", slot, instance, stale.Presented, s.Runs()+1, stale.Accepted)
				return err
			case err != nil:
				return err
			}
			say("%s run by %s (token %d, run %d)", slot, instance, s.Lease().Token(), s.Runs())
			if slot == pausedSlot {
				mu.Lock()
				res.TakenOver = s.Runs() == 2
				mu.Unlock()
				close(recorded)
			}
			return nil
		})
		switch {
		case errors.Is(err, pgfence.ErrStaleToken):
			return nil // the frozen run, refused: reported above
		case err != nil:
			return err
		case !outcome.Ran:
			mu.Lock()
			res.Skipped++
			mu.Unlock()
		}
		return nil
	}

	// Each instance ticks through the slots on its own.
	var wg sync.WaitGroup
	errs := make(chan error, len(instances))
	for _, instance := range instances {
		wg.Go(func() {
			for _, slot := range slots {
				if err := runSlot(instance, slot); err != nil {
					errs <- fmt.Errorf("%s, slot %s: %w", instance, slot, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return res, err
	}

	// Check the business state: one recorded run per slot.
	rows, err := pool.Query(ctx, `SELECT slot, count(*) FROM example_cron_runs GROUP BY slot`)
	if err != nil {
		return res, err
	}
	for rows.Next() {
		var slot string
		var n int
		if err := rows.Scan(&slot, &n); err != nil {
			return res, err
		}
		res.RunsPerSlot[slot] = n
	}
	if err := rows.Err(); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "result: runs per slot %v; %d job executions, %d late result(s) rejected, %d skips of finished slots\n",
		res.RunsPerSlot, res.Executions, res.StaleRejected, res.Skipped)
	for _, slot := range slots {
		if res.RunsPerSlot[slot] != 1 {
			return res, fmt.Errorf("slot %s recorded %d times, want exactly once", slot, res.RunsPerSlot[slot])
		}
	}
	if res.StaleRejected < 1 || !res.TakenOver {
		return res, errors.New("the frozen instance's result was not rejected after a takeover")
	}
	fmt.Fprintln(out, "OK: every slot ran exactly once")
	return res, nil
}
