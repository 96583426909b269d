package leases_test

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// 50 goroutines and 4 OS processes race for a new key: exactly one wins. Then
// they take the key from each other until 200 grants were made, a third of them
// takeovers of a "crashed" holder: every grant's checked write succeeds, tokens
// are unique and strictly increase in grant order.
func TestRaceGoroutinesAndProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	checkLeaks(t)
	const (
		goroutines = 50
		processes  = 4
		clients    = 5 // the goroutines share these
		target     = 200
	)
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE grants (token bigint PRIMARY KEY, holder uuid NOT NULL UNIQUE,
granted_at timestamptz NOT NULL, who text NOT NULL);
CREATE TABLE race_attempts (at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	key := "race"
	start := time.Now().Add(2 * time.Second)

	workers := make([]*worker, processes)
	for i := range workers {
		workers[i] = startWorker(t, "race", envURL+"="+db.URL, envKey+"="+key,
			envStart+"="+strconv.FormatInt(start.UnixNano(), 10), envTarget+"="+strconv.Itoa(target),
			envRacers+"="+strconv.Itoa(goroutines+processes))
	}
	var cs []*leases.Client
	for range clients {
		cs = append(cs, newClient(t, db.Pool, nil))
	}

	var (
		wg       sync.WaitGroup
		wins     atomic.Int32
		holding  atomic.Int32 // goroutines holding the lease right now
		overlaps atomic.Int32
		errs     = make(chan error, goroutines)
	)
	for i := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cs[i%clients]
			won, err := raceOnce(ctx, c, db.Pool, key, start, goroutines+processes)
			if err != nil {
				errs <- err
				return
			}
			if won {
				wins.Add(1)
			}
			err = participate(ctx, c, db.Pool, key, "goroutine-"+strconv.Itoa(i), target, func() {
				if holding.Add(1) > 1 {
					overlaps.Add(1)
				}
				time.Sleep(time.Millisecond)
				holding.Add(-1)
			})
			if err != nil {
				errs <- err
			}
		}()
	}
	for _, w := range workers {
		line := w.next(t, 30*time.Second)
		switch line {
		case "race true":
			wins.Add(1)
		case "race false":
		default:
			t.Fatalf("worker: %q", line)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, w := range workers {
		if line := w.next(t, time.Minute); line != "done" {
			t.Fatalf("worker: %q", line)
		}
	}
	if n := wins.Load(); n != 1 {
		t.Fatalf("%d racers won the new key, want exactly 1", n)
	}
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d grants overlapped another goroutine's", n)
	}

	rows, err := db.Pool.Query(ctx, `SELECT token, who FROM grants ORDER BY granted_at, token`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var (
		prev     int64
		n        int
		procs    int
		byWorker = map[string]int{}
	)
	for rows.Next() {
		var token int64
		var who string
		if err := rows.Scan(&token, &who); err != nil {
			t.Fatal(err)
		}
		if token <= prev {
			t.Fatalf("grant %d: token %d after %d, want strictly increasing", n, token, prev)
		}
		prev = token
		n++
		byWorker[who]++
		if strings.HasPrefix(who, "process-") {
			procs++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n < target {
		t.Fatalf("%d grants, want at least %d", n, target)
	}
	var takeovers int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM grants WHERE token % 3 = 0`).Scan(&takeovers); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d grants (%d by processes, %d abandoned and taken over), %d distinct holders of the race",
		n, procs, takeovers, len(byWorker))
	if procs == 0 {
		t.Fatal("no grant went to a worker process")
	}
}
