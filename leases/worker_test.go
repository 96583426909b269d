package leases_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// Worker processes: the test binary re-executed with envWorker set runs one of
// these modes instead of the tests, so leases are held by real OS processes
// that can be killed.
const (
	envWorker = "PGFENCE_LEASES_WORKER" // "race" or "hold"
	envURL    = "PGFENCE_LEASES_URL"
	envKey    = "PGFENCE_LEASES_KEY"
	envStart  = "PGFENCE_LEASES_START"  // race: unix nanoseconds of the first attempt
	envTarget = "PGFENCE_LEASES_TARGET" // race: grants to reach in total
	envTTL    = "PGFENCE_LEASES_TTL"    // hold: lease TTL
	envRacers = "PGFENCE_LEASES_RACERS" // race: goroutines + processes
)

func runWorker(mode string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envURL))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer pool.Close()
	c, err := leases.New(pool, nil)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer c.Close()
	key := os.Getenv(envKey)
	switch mode {
	case "race":
		start, _ := strconv.ParseInt(os.Getenv(envStart), 10, 64)
		target, _ := strconv.Atoi(os.Getenv(envTarget))
		racers, _ := strconv.Atoi(os.Getenv(envRacers))
		won, err := raceOnce(ctx, c, pool, key, time.Unix(0, start), racers)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("race", won)
		if err := participate(ctx, c, pool, key, "process-"+strconv.Itoa(os.Getpid()), target, nil); err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("done")
		return 0
	case "hold":
		ttl, _ := time.ParseDuration(os.Getenv(envTTL))
		l, err := c.Acquire(ctx, key, ttl, nil) // kept alive until the process dies
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("held", l.Token(), l.Holder())
		<-l.Context().Done()
		fmt.Println("error keep-alive ended:", l.Err())
		return 1
	}
	fmt.Println("error unknown mode", mode)
	return 2
}

// raceOnce waits until start and makes one TryAcquire, then records its
// attempt in race_attempts. The winner keeps the lease until all racers have
// tried (however late a process started), then releases it.
func raceOnce(ctx context.Context, c *leases.Client, pool *pgxpool.Pool, key string, start time.Time, racers int) (bool, error) {
	time.Sleep(time.Until(start))
	l, err := c.TryAcquire(ctx, key, time.Minute, nil)
	if err != nil && !errors.Is(err, pgfence.ErrLeaseHeld) {
		return false, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO race_attempts DEFAULT VALUES`); err != nil {
		return false, err
	}
	if l == nil {
		return false, nil
	}
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM race_attempts`).Scan(&n); err != nil {
			return true, err
		}
		if n >= racers {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true, l.Release(ctx)
}

// participate takes the lease on key again and again until the grants table
// holds target grants. Under each grant it writes one row to grants, checked
// against the lease in the same statement (the row lock makes a takeover wait
// for it). Every third grant it simulates a crash: it backdates its own expiry
// and walks away, so the next grant is a takeover. Its leases are not kept
// alive: a crashed holder renews nothing.
func participate(ctx context.Context, c *leases.Client, pool *pgxpool.Pool, key, who string, target int, onGrant func()) error {
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM grants`).Scan(&n); err != nil {
			return err
		}
		if n >= target {
			return nil
		}
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		l, err := c.Acquire(actx, key, 5*time.Second, &leases.AcquireOptions{NoKeepAlive: true})
		cancel()
		if err != nil {
			return err
		}
		if onGrant != nil {
			onGrant()
		}
		tag, err := pool.Exec(ctx, `
INSERT INTO grants (token, holder, granted_at, who)
SELECT l.token, l.holder, l.granted_at, $4
  FROM pgfence.leases l
 WHERE l.key = $1 AND l.holder = $2::uuid AND l.token = $3
   AND l.released_at IS NULL AND l.expires_at > clock_timestamp()
   FOR SHARE`, key, l.Holder(), l.Token(), who)
		if err != nil {
			return fmt.Errorf("grant %d: %w", l.Token(), err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("grant %d (holder %s) was not the live lease when written", l.Token(), l.Holder())
		}
		if l.Token()%3 == 0 {
			if _, err := pool.Exec(ctx, `UPDATE pgfence.leases SET expires_at = greatest(granted_at, clock_timestamp() - interval '1 ms')
WHERE key = $1 AND holder = $2::uuid`, key, l.Holder()); err != nil {
				return err
			}
			// Expiry is not announced; time moved by backdating, so tell the
			// waiters, or they would sleep until the expiry they last saw.
			if _, err := pool.Exec(ctx, `SELECT pg_notify($1, $2)`, leases.NotifyChannel, key); err != nil {
				return err
			}
			if err := l.Renew(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
				return fmt.Errorf("renewal of an expired grant %d: got %v, want ErrLeaseLost", l.Token(), err)
			}
			continue
		}
		if err := l.Release(ctx); err != nil {
			return fmt.Errorf("release %d: %w", l.Token(), err)
		}
	}
}

// worker is a running worker process.
type worker struct {
	cmd   *exec.Cmd
	lines chan string
}

func startWorker(t *testing.T, mode string, env ...string) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{envWorker + "=" + mode}, env...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{cmd: cmd, lines: make(chan string, 100)}
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return w
}

// next returns the worker's next output line, failing on "error" lines.
func (w *worker) next(t *testing.T, timeout time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-w.lines:
		if !ok {
			t.Fatalf("worker %d exited without output", w.cmd.Process.Pid)
		}
		if strings.HasPrefix(line, "error") {
			t.Fatalf("worker %d: %s", w.cmd.Process.Pid, line)
		}
		return line
	case <-time.After(timeout):
		t.Fatalf("worker %d: no output within %s", w.cmd.Process.Pid, timeout)
	}
	return ""
}
