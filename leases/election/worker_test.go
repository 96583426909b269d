package election_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/election"
	"github.com/pgfence/pgfence/pgfence"
)

// A replica worker is a test process taking part in an election, driven by
// the test over workerproc: it runs Election.Run and, while it leads,
// samples the database clock and writes with its term through the fence.

// replicaArgs opens a replica.
type replicaArgs struct {
	URL  string        `json:"url"`
	Key  string        `json:"key"`
	Name string        `json:"name"`
	TTL  time.Duration `json:"ttl"`
	Poll time.Duration `json:"poll"`
}

// sample is a moment the replica led by its own account, by the database
// clock: it trusted its term before it sent the statement and after the
// answer came, so it led while the statement ran.
type sample struct {
	Term int64     `json:"term"`
	At   time.Time `json:"at"`
}

// replicaReport is what a replica tells the test.
type replicaReport struct {
	Leading  bool             `json:"leading"`
	Term     int64            `json:"term"` // current term if leading
	Samples  []sample         `json:"samples"`
	Observed []int64          `json:"observed"` // OnLeader's terms, 0 for none
	Started  []int64          `json:"started"`
	Stopped  map[int64]string `json:"stopped"` // term: cause
	Writes   int              `json:"writes"`  // accepted fenced writes
}

var rep struct {
	mu     sync.Mutex
	e      *election.Election
	pool   *pgxpool.Pool
	client *leases.Client
	name   string
	stop   context.CancelFunc
	done   chan error
	last   *election.Term // the latest term this replica led
	report replicaReport
}

// serveReplica runs in a worker process.
func serveReplica(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	switch op {
	case "open":
		var a replicaArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, err
		}
		return "ok", openReplica(a)
	case "report":
		rep.mu.Lock()
		defer rep.mu.Unlock()
		r := rep.report
		r.Leading = rep.e.IsLeader()
		if t := rep.e.Term(); t != nil && r.Leading {
			r.Term = t.Token()
		}
		return r, nil
	case "stale_write":
		// The latest term's write, whether or not it still leads: what a
		// leader paused mid-write sends when it resumes.
		rep.mu.Lock()
		term := rep.last
		rep.mu.Unlock()
		if term == nil {
			return nil, errors.New("never led")
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := pgfence.Exec(wctx, rep.pool, term, `INSERT INTO election_writes (replica, term, at) VALUES ($1, $2, clock_timestamp())`, rep.name+" (late)", term.Token())
		var stale *pgfence.StaleTokenError
		switch {
		case errors.As(err, &stale):
			return map[string]int64{"presented": stale.Presented, "accepted": stale.Accepted}, nil
		case err != nil:
			return nil, err
		}
		return nil, fmt.Errorf("the write of term %d was accepted", term.Token())
	case "close":
		rep.stop()
		err := <-rep.done
		rep.client.Close()
		rep.pool.Close()
		return "ok", err // nil: a stop asked for is not a failure
	}
	return nil, fmt.Errorf("unknown op %q", op)
}

func openReplica(a replicaArgs) error {
	cfg, err := pgxpool.ParseConfig(a.URL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return err
	}
	client, err := leases.New(pool, nil)
	if err != nil {
		return err
	}
	e, err := election.New(client, a.Key, &election.Config{
		TTL: a.TTL, PollInterval: a.Poll, AcquireOptions: leases.AcquireOptions{HolderInfo: a.Name},
		OnStartedLeading: lead,
		OnStoppedLeading: func(term *election.Term, cause error) {
			rep.mu.Lock()
			defer rep.mu.Unlock()
			rep.report.Stopped[term.Token()] = cause.Error()
		},
		OnLeader: func(l election.Leader) {
			rep.mu.Lock()
			defer rep.mu.Unlock()
			rep.report.Observed = append(rep.report.Observed, l.Term)
		},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	rep.mu.Lock()
	rep.e, rep.pool, rep.client, rep.name, rep.stop, rep.done = e, pool, client, a.Name, cancel, make(chan error, 1)
	rep.report.Stopped = map[int64]string{}
	rep.mu.Unlock()
	go func() { rep.done <- e.Run(ctx) }()
	return nil
}

// lead is OnStartedLeading: until the term ends, sample the database clock
// and write through the fence with the term.
func lead(ctx context.Context, term *election.Term) {
	rep.mu.Lock()
	rep.last = term
	rep.report.Started = append(rep.report.Started, term.Token())
	rep.mu.Unlock()
	for i := 0; ctx.Err() == nil; i++ {
		if term.Err() == nil {
			var at time.Time
			err := rep.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at)
			if err == nil && term.Err() == nil {
				rep.mu.Lock()
				rep.report.Samples = append(rep.report.Samples, sample{Term: term.Token(), At: at})
				rep.mu.Unlock()
			}
		}
		if i%3 == 0 {
			_, err := pgfence.Exec(ctx, rep.pool, term, `INSERT INTO election_writes (replica, term, at) VALUES ($1, $2, clock_timestamp())`, rep.name, term.Token())
			if err == nil {
				rep.mu.Lock()
				rep.report.Writes++
				rep.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}
