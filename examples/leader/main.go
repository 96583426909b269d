// Command leader shows leader election among replicas of a service, where
// the leader's writes carry its term through the fence.
//
// Three replicas of a scheduler run the election "leader/scheduler". The
// leader publishes its address and writes a tick per 50 ms, each a fenced
// write with its term; the followers watch who leads. The first leader then
// freezes (a GC pause, a frozen container) for longer than its lease: it
// stops leading on its own, the database lets its lease expire, a follower
// is elected and writes; when the frozen leader wakes up and writes with its
// old term, PostgreSQL rejects the write, and it exits (a process that finds
// it was paused past its lease starts over). Finally the second leader shuts
// down: it resigns, and the third replica is elected at once.
//
// Run it:
//
//	go run ./examples/leader                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/leader
//
// It exits non-zero if two replicas led at once by their own account, if a
// write of an earlier term was accepted after a later term's, or if the
// frozen leader's late write got through.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/election"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const ttl = time.Second // a dead or frozen leader is replaced about this long after its last renewal

func main() {
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("leader", func(ctx context.Context, db *pgfencetest.Database) error {
		_, err := run(ctx, db.Pool, os.Stdout)
		return err
	})
}

// result is the outcome, checked by main_test.go.
type result struct {
	Leaders       []string         // who was elected, in order
	Seen          map[string][]int // per replica: the terms (numbered 1, 2, ...) it saw begin
	StaleRejected bool             // the frozen leader's late write was refused
	TicksInOrder  bool             // accepted ticks never went back to an earlier term
	Overlap       bool             // two replicas led at once by their own account
	Handover      time.Duration    // from the resignation to the next leader's first tick
}

// replica is one process of the scheduler.
type replica struct {
	name    string
	e       *election.Election
	stop    context.CancelFunc
	done    chan error
	leading chan struct{} // closed when it first leads
	once    sync.Once
}

func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (result, error) {
	res := result{Seen: map[string][]int{}}
	var mu sync.Mutex // serialises output and res
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "  "+format+"\n", args...)
	}
	_, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS example_leader_ticks;
		CREATE TABLE example_leader_ticks (id bigint GENERATED ALWAYS AS IDENTITY, replica text NOT NULL, term bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());`)
	if err != nil {
		return res, err
	}
	// A per-run key, so that a rerun on the same database starts afresh.
	key := "leader/scheduler/" + strconv.FormatInt(time.Now().UnixNano(), 36)

	var (
		terms      []int64 // terms in the order they began, for short numbers
		leadingNow = map[string]bool{}
		frozenOnce sync.Once
		unfrozen   = make(chan struct{}) // closed when a later term has ticked
		unfreeze   = sync.OnceFunc(func() { close(unfrozen) })
		resignedAt time.Time
		handedOver = make(chan struct{})
		woke       = make(chan struct{}) // closed when the frozen leader's late write returned
	)
	number := func(term int64) int { // 1 for the first term, 2, ...
		mu.Lock()
		defer mu.Unlock()
		if i := slices.Index(terms, term); i >= 0 {
			return i + 1
		}
		terms = append(terms, term)
		return len(terms)
	}
	tick := func(ctx context.Context, name string, term *election.Term) error {
		_, err := pgfence.Exec(ctx, pool, term, `INSERT INTO example_leader_ticks (replica, term) VALUES ($1, $2)`, name, term.Token())
		return err
	}

	newReplica := func(name string, hold leases.AcquireOptions) (*replica, error) {
		client, err := leases.New(pool, nil)
		if err != nil {
			return nil, err
		}
		r := &replica{name: name, done: make(chan error, 1), leading: make(chan struct{})}
		hold.HolderInfo = name
		r.e, err = election.New(client, key, &election.Config{
			TTL:            ttl,
			AcquireOptions: hold,
			OnStartedLeading: func(ctx context.Context, term *election.Term) {
				n := number(term.Token())
				mu.Lock()
				for other, on := range leadingNow {
					if on && other != name {
						res.Overlap = true
					}
				}
				leadingNow[name] = true
				res.Leaders = append(res.Leaders, name)
				mu.Unlock()
				defer func() {
					mu.Lock()
					leadingNow[name] = false
					mu.Unlock()
				}()
				say("%s elected: term %d", name, n)
				_ = term.Proclaim(ctx, name+" at 10.0.0."+name[len(name)-1:]+":8080")
				r.once.Do(func() { close(r.leading) })
				frozen := false
				if n == 1 {
					frozenOnce.Do(func() { frozen = true })
				}
				for first := true; ctx.Err() == nil; first = false {
					if err := tick(ctx, name, term); err != nil && ctx.Err() == nil {
						say("%s: tick: %v", name, err)
					}
					if first && n > 1 {
						mu.Lock()
						if !resignedAt.IsZero() && res.Handover == 0 {
							res.Handover = time.Since(resignedAt)
							close(handedOver)
						}
						mu.Unlock()
						unfreeze()
					}
					if frozen {
						mu.Lock()
						leadingNow[name] = false // it no longer knows anything
						mu.Unlock()
						say("%s froze (its keep-alive stopped)", name)
						<-unfrozen
						// Awake, it writes as if nothing happened, with its term.
						err := tick(context.WithoutCancel(ctx), name, term)
						var stale *pgfence.StaleTokenError
						if errors.As(err, &stale) {
							mu.Lock()
							res.StaleRejected = true
							mu.Unlock()
							say("%s woke up and wrote with term %d: REJECTED (term %d has written since); its term ended: %v",
								name, n, number(stale.Accepted), errors.Is(term.Err(), pgfence.ErrLeaseLost))
						} else {
							say("%s woke up and wrote with term %d: ACCEPTED (the fence did not hold!)", name, n)
						}
						close(woke)
						return
					}
					select {
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
			},
			OnLeader: func(l election.Leader) {
				if l.Term == 0 {
					return
				}
				n := number(l.Term)
				mu.Lock()
				if seen := res.Seen[name]; len(seen) == 0 || seen[len(seen)-1] != n {
					res.Seen[name] = append(seen, n)
				}
				mu.Unlock()
			},
		})
		if err != nil {
			client.Close()
			return nil, err
		}
		rctx, cancel := context.WithCancel(ctx)
		r.stop = cancel
		go func() {
			r.done <- r.e.Run(rctx)
			client.Close()
		}()
		return r, nil
	}
	stopAll := func(rs []*replica) {
		for _, r := range rs {
			r.stop()
			<-r.done
		}
	}

	fmt.Fprintf(out, "leader: 3 replicas, election %s, TTL %s\n", "leader/scheduler", ttl)
	// replica-1 starts first and leads; it is the one that freezes: its
	// keep-alive gives up after half a second (as a frozen process's would).
	first, err := newReplica("replica-1", leases.AcquireOptions{MaxHold: 500 * time.Millisecond})
	if err != nil {
		return res, err
	}
	var rs = []*replica{first}
	select {
	case <-first.leading:
	case <-time.After(10 * time.Second):
		stopAll(rs)
		return res, errors.New("replica-1 was not elected")
	}
	for _, name := range []string{"replica-2", "replica-3"} {
		r, err := newReplica(name, leases.AcquireOptions{})
		if err != nil {
			stopAll(rs)
			return res, err
		}
		rs = append(rs, r)
	}
	if l, err := rs[1].e.Leader(ctx); err == nil {
		say("replica-2 sees the leader: %s", l.Value)
	}

	// The frozen leader is replaced; then the second leader shuts down.
	var second *replica
	select {
	case <-unfrozen:
	case <-time.After(10 * time.Second):
		stopAll(rs)
		return res, errors.New("no leader after the freeze")
	}
	for _, r := range rs[1:] {
		if r.e.IsLeader() {
			second = r
		}
	}
	if second == nil {
		stopAll(rs)
		return res, errors.New("the new leader is not leading")
	}
	// The woken leader exits: were it still a candidate, the resignation
	// below could elect it again.
	select {
	case <-woke:
	case <-time.After(10 * time.Second):
		stopAll(rs)
		return res, errors.New("the frozen leader did not wake up")
	}
	say("%s exits", first.name)
	first.stop()
	<-first.done
	running := []*replica{}
	for _, r := range rs[1:] {
		if r != second {
			running = append(running, r)
		}
	}
	time.Sleep(200 * time.Millisecond) // a few ticks
	mu.Lock()
	resignedAt = time.Now()
	mu.Unlock()
	say("%s shuts down (and resigns)", second.name)
	second.stop()
	<-second.done
	select {
	case <-handedOver:
	case <-time.After(10 * time.Second):
		stopAll(running)
		return res, errors.New("nobody took over after the resignation")
	}
	say("handed over in %s", res.Handover.Round(time.Millisecond))
	// The replicas still running see the new term (at once: it is announced).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		caughtUp := true
		for _, r := range running {
			if seen := res.Seen[r.name]; len(seen) == 0 || seen[len(seen)-1] != len(terms) {
				caughtUp = false
			}
		}
		mu.Unlock()
		if caughtUp {
			break
		}
	}
	stopAll(running)

	// Check the business state: ticks never went back to an earlier term.
	rows, err := pool.Query(ctx, `SELECT term FROM example_leader_ticks ORDER BY id`)
	if err != nil {
		return res, err
	}
	ticks, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return res, err
	}
	res.TicksInOrder = slices.IsSorted(ticks)
	fmt.Fprintf(out, "result: leaders %v; %d ticks, in term order: %t; the frozen leader's late write rejected: %t; terms seen by each replica %v\n",
		res.Leaders, len(ticks), res.TicksInOrder, res.StaleRejected, res.Seen)
	switch {
	case res.Overlap:
		return res, errors.New("two replicas led at once")
	case !res.TicksInOrder:
		return res, errors.New("a tick of an earlier term was accepted after a later term's")
	case !res.StaleRejected:
		return res, errors.New("the frozen leader's late write was not rejected")
	}
	fmt.Fprintln(out, "OK: one leader at a time, and the fence held")
	return res, nil
}
