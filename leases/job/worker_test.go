package job_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/job"
)

// A jobber worker is a replica of a job's process: it runs the slots of a
// list in order, each with Runner.Run, until each is completed (by it or by
// another replica), retrying what fails; or, given a period, it calls
// Runner.RunPeriod every 20 ms until closed.

type jobberArgs struct {
	URL   string        `json:"url"`
	Key   string        `json:"key"`
	Name  string        `json:"name"`
	TTL   time.Duration `json:"ttl"`
	Slots []string      `json:"slots"`
	// Period mode: RunPeriod's period and Config.CatchUp. The first run that
	// takes a row out of job_hang hangs until the process is killed.
	Period  time.Duration `json:"period"`
	CatchUp int           `json:"catch_up"`
}

type jobberStatus struct {
	Done      bool     `json:"done"`
	Completed int      `json:"completed"` // slots this process completed
	Skipped   int      `json:"skipped"`   // slots found completed
	Errors    []string `json:"errors"`    // failed runs (retried)
	Hanging   string   `json:"hanging"`   // the slot whose run hangs
}

var jobber jobberState

type jobberState struct {
	mu     sync.Mutex
	status jobberStatus
	stop   context.CancelFunc
	done   chan struct{}
}

func (j *jobberState) record(res job.Result, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case err != nil:
		j.status.Errors = append(j.status.Errors, err.Error())
	case res.Ran:
		j.status.Completed++
	default:
		j.status.Skipped++
	}
}

func serveJobber(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	switch op {
	case "open":
		var a jobberArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, err
		}
		return "ok", openJobber(a)
	case "status":
		jobber.mu.Lock()
		defer jobber.mu.Unlock()
		return jobber.status, nil
	case "close":
		jobber.stop()
		<-jobber.done
		return "ok", nil
	}
	return nil, fmt.Errorf("unknown op %q", op)
}

func openJobber(a jobberArgs) error {
	cfg, err := pgxpool.ParseConfig(a.URL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return err
	}
	client, err := leases.New(pool, nil)
	if err != nil {
		return err
	}
	r, err := job.New(client, a.Key, &job.Config{TTL: a.TTL, CatchUp: a.CatchUp, AcquireOptions: leases.AcquireOptions{MaxWait: 5 * time.Second, HolderInfo: a.Name}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	jobber.stop, jobber.done = cancel, make(chan struct{})
	go func() {
		defer close(jobber.done)
		defer pool.Close()
		defer client.Close()
		for a.Period > 0 && ctx.Err() == nil {
			res, err := r.RunPeriod(ctx, a.Period, func(ctx context.Context, s *job.Slot) error {
				if err := pool.QueryRow(ctx, `DELETE FROM job_hang RETURNING true`).Scan(new(bool)); err == nil {
					jobber.mu.Lock()
					jobber.status.Hanging = s.Name()
					jobber.mu.Unlock()
					<-ctx.Done() // until killed
				}
				return work(ctx, s, a.Name)
			})
			jobber.record(res, err)
			_ = sleep(ctx, 20*time.Millisecond)
		}
		for _, slot := range a.Slots {
			for ctx.Err() == nil {
				res, err := r.Run(ctx, slot, func(ctx context.Context, s *job.Slot) error { return work(ctx, s, a.Name) })
				jobber.record(res, err)
				if err == nil {
					break
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(rand.IntN(20)) * time.Millisecond):
				}
			}
		}
		jobber.mu.Lock()
		jobber.status.Done = ctx.Err() == nil
		jobber.mu.Unlock()
	}()
	return nil
}

// work is a slot's job in two steps, with a checkpoint between them: the
// business effect is written with the completion.
func work(ctx context.Context, s *job.Slot, name string) error {
	if s.Checkpoint() == "" {
		if err := sleep(ctx, time.Duration(10+rand.IntN(40))*time.Millisecond); err != nil {
			return err
		}
		if err := s.Save(ctx, "step 1 done by "+name); err != nil {
			return err
		}
	}
	if err := sleep(ctx, time.Duration(10+rand.IntN(40))*time.Millisecond); err != nil {
		return err
	}
	return s.Finish(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO job_effects (slot, token, by, resumed) VALUES ($1, $2, $3, $4)`,
			s.Name(), s.Lease().Token(), name, s.Runs() > 1)
		return err
	})
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return errors.Join(ctx.Err(), context.Cause(ctx))
	case <-time.After(d):
		return nil
	}
}
