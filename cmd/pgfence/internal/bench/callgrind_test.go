package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
)

// TestCallgrind counts the CPU instructions the server spends per operation
// of each case, one worker, as callgrind counts them: deterministic where the
// bench's timings are not (another process on the machine, fsync latency),
// and fine enough to tell what one check costs. It runs only when told where:
//
//	PGFENCE_BENCH_CALLGRIND_URL    the database of a server started under
//	                               valgrind --tool=callgrind --vgdb=no
//	                               --callgrind-out-file=DIR/callgrind.out.%p
//	PGFENCE_BENCH_CALLGRIND_DIR    that DIR
//	PGFENCE_BENCH_CALLGRIND_CASES  comma-separated case names
//	PGFENCE_BENCH_CALLGRIND_OPS    operations counted per case (default 200)
//
// callgrind writes a backend's count when the backend exits. Each case runs
// on fresh connections, closed after the run: 3×OPS operations not counted
// (the tables as the counted runs find them), then WARM + OPS operations,
// then WARM + 2×OPS (WARM = OPS: plans cached, pages in the buffer cache);
// the difference of the two counts, divided by OPS, is one operation in the
// steady state, without the connection's start and the warm-up. The worker's
// keys come from a fixed seed, so both runs begin with the same keys. The
// server should run with full_page_writes = off and autovacuum = off: a
// full-page image after a checkpoint, or an autovacuum worker, is not the
// operation's cost.
func TestCallgrind(t *testing.T) {
	url, dir := os.Getenv("PGFENCE_BENCH_CALLGRIND_URL"), os.Getenv("PGFENCE_BENCH_CALLGRIND_DIR")
	if url == "" || dir == "" {
		t.Skip("PGFENCE_BENCH_CALLGRIND_URL and PGFENCE_BENCH_CALLGRIND_DIR are not set")
	}
	ops := 200
	if s := os.Getenv("PGFENCE_BENCH_CALLGRIND_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("PGFENCE_BENCH_CALLGRIND_OPS=%q: want a positive count", s)
		}
		ops = n
	}
	ctx := context.Background()
	lab, err := Open(ctx, url, 1, 0, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	for _, name := range strings.Split(os.Getenv("PGFENCE_BENCH_CALLGRIND_CASES"), ",") {
		c := findCase(name)
		if c == nil || c.Peer() {
			t.Fatalf("no PostgreSQL case %q", name)
		}
		var (
			ir   [2]int64
			runs []string // the outputs of the longer run
		)
		// A first run, not counted, leaves the tables as the counted runs
		// find them (the lock rows of the raw floor exist after it).
		for i, n := range []int{3 * ops, 2 * ops, 3 * ops} {
			op, cleanup, err := c.prepare(ctx, lab, 1)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			// Every run starts from vacuumed tables: without autovacuum,
			// the dead rows of earlier runs would make every later one
			// dearer.
			if _, err := lab.db.Pool.Exec(ctx, sqlCallgrindVacuum); err != nil {
				t.Fatal(err)
			}
			closePool(t, lab, dir) // the run's connections are its own
			w := &benchrun.Worker{Rand: rand.New(rand.NewPCG(1, 2))}
			for done := 0; done < n; {
				switch _, err := op(ctx, w); {
				case errors.Is(err, benchrun.ErrHeld):
				case err != nil:
					t.Fatalf("%s: %v", name, err)
				default:
					done++
				}
			}
			files := closePool(t, lab, dir)
			cleanup()
			if i == 0 {
				continue
			}
			for _, name := range files {
				ir[i-1] += instructions(t, name)
			}
			if i == 2 {
				runs = files
			}
		}
		fmt.Printf("callgrind %-20s %10.0f instructions/op (%d ops; %s)\n", name, float64(ir[1]-ir[0])/float64(ops), ops, strings.Join(runs, " "))
	}
}

// sqlCallgrindVacuum vacuums the tables the cases write.
const sqlCallgrindVacuum = `VACUUM pgfence.leases, pgfence.lease_events, pgfence.fences, pgfence.idempotency_keys,
	pgfence_bench.stock, pgfence_bench.orders, pgfence_bench.locks, pgfence_bench.fences, pgfence_bench.keys`

func findCase(name string) *Case {
	for _, c := range Cases() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// closePool closes the connections of the lab's pool and returns the
// callgrind outputs their backends wrote when they exited.
func closePool(t *testing.T, lab *Lab, dir string) []string {
	t.Helper()
	var files []string
	for _, c := range lab.pool.AcquireAllIdle(context.Background()) {
		files = append(files, filepath.Join(dir, fmt.Sprintf("callgrind.out.%d", c.Conn().PgConn().PID())))
		c.Release()
	}
	lab.pool.Reset()
	for range 600 {
		done := 0
		for _, name := range files {
			if instructions(t, name) > 0 {
				done++
			}
		}
		if done == len(files) {
			return files
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the backends of %v never wrote their counts", files)
	return nil
}

// instructions reads the total of one callgrind output.
func instructions(t *testing.T, name string) int64 {
	t.Helper()
	f, err := os.Open(name)
	if os.IsNotExist(err) {
		return 0 // not written yet
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		for _, prefix := range []string{"summary: ", "totals: "} {
			if v, ok := strings.CutPrefix(s.Text(), prefix); ok {
				n, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				return n
			}
		}
	}
	return 0 // still being written
}
