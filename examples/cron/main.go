// Command cron shows a scheduled job that runs on several instances and still
// runs each time slot exactly once, even when an instance freezes mid-run.
//
// Three instances tick through four slots of the job "nightly-report". For
// every slot each of them asks for the lease on "cron/nightly-report/<slot>";
// the winner checks that the slot has no recorded run, runs the job and records
// the slot's result with a fenced write (token of its lease). In slot 03:00 the
// winner freezes mid-run for longer than its lease: another instance takes the
// slot over, runs it and records it; when the frozen one wakes up, its result is
// rejected by the database.
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
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	job        = "nightly-report"
	pausedSlot = "03:00"
	ttl        = 500 * time.Millisecond // longer than a run, shorter than the pause
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
	Skipped       int            // lease won, but the slot was already recorded
	StaleRejected int            // late results refused by the fence
	Dropped       int            // late results of a slot recorded meanwhile
	TakenOver     bool           // the frozen slot was recorded by another instance
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
	client, err := leases.New(pool, nil)
	if err != nil {
		return res, err
	}
	defer client.Close()
	fmt.Fprintf(out, "cron: job %s, slots %v, on %d instances\n", job, slots, len(instances))

	var (
		freezeOnce sync.Once
		recorded   = make(chan struct{}) // closed when the paused slot is recorded
	)
	runSlot := func(instance, slot string) error {
		key := "cron/" + job + "/" + slot // lease key and fenced resource
		// Everyone waits for the slot's lease; losers get it after the winner
		// releases (or its lease expires) and then skip the finished slot.
		lease, err := client.Acquire(ctx, key, ttl, &leases.AcquireOptions{MaxWait: 5 * time.Second, HolderInfo: instance})
		if err != nil {
			return err
		}
		defer lease.Release(ctx) //nolint:errcheck // the frozen one's lease is long gone

		var done bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM example_cron_runs WHERE job = $1 AND slot = $2)`, job, slot).Scan(&done); err != nil {
			return err
		}
		if done {
			mu.Lock()
			res.Skipped++
			mu.Unlock()
			return nil
		}

		// The job itself. The first winner of the paused slot freezes here (a
		// GC pause, a frozen container) until another instance recorded it.
		frozen := false
		if slot == pausedSlot {
			freezeOnce.Do(func() { frozen = true })
		}
		if frozen {
			say("%s %s got the lease (token %d) and froze mid-run", slot, instance, lease.Token())
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

		// Record the slot's result. The write is fenced by the lease token,
		// not by the lease's context: a pause can strike between any check
		// and the write, and only the database can tell the write is late.
		// ON CONFLICT covers the reverse order: an instance that stalled
		// (without our injected pause) recorded the slot with an older token
		// after our check; then our run is the duplicate and is dropped.
		tag, err := pgfence.Exec(ctx, pool, lease,
			`INSERT INTO example_cron_runs VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
			job, slot, instance, lease.Token(), "report for "+slot+" by "+instance)
		var stale *pgfence.StaleTokenError
		switch {
		case errors.As(err, &stale):
			mu.Lock()
			res.StaleRejected++
			mu.Unlock()
			say("%s %s woke up and recorded its result with token %d: REJECTED (token %d was accepted since)", slot, instance, stale.Presented, stale.Accepted)
			return nil
		case err != nil:
			return err
		case tag.RowsAffected() == 0:
			mu.Lock()
			res.Dropped++
			mu.Unlock()
			say("%s %s: the slot was recorded meanwhile; this run's result is dropped", slot, instance)
			return nil
		}
		say("%s run by %s (token %d)", slot, instance, lease.Token())
		if slot == pausedSlot {
			mu.Lock()
			res.TakenOver = true
			mu.Unlock()
			close(recorded)
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
	rows, err := pool.Query(ctx, `SELECT slot, count(*) FROM example_cron_runs WHERE job = $1 GROUP BY slot`, job)
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
	fmt.Fprintf(out, "result: runs per slot %v; %d job executions, %d late result(s) rejected, %d dropped, %d skips of finished slots\n",
		res.RunsPerSlot, res.Executions, res.StaleRejected, res.Dropped, res.Skipped)
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
