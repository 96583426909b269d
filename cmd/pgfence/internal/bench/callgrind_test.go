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
	"slices"
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
// twice on fresh connections, closed after the run: WARM + OPS operations,
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
		for i, n := range []int{2 * ops, 3 * ops} {
			op, cleanup, err := c.prepare(ctx, lab, 1)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			// Both runs start from the same tables: without autovacuum,
			// the dead rows of earlier runs would make every later one
			// dearer.
			if _, err := lab.db.Pool.Exec(ctx, sqlCallgrindVacuum); err != nil {
				t.Fatal(err)
			}
			lab.pool.Reset() // the run's connections are its own
			before := settled(t, dir)
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
			lab.pool.Reset()
			var sum int64
			for _, name := range settled(t, dir) {
				if !slices.Contains(before, name) {
					sum += instructions(t, name)
					if i == 1 {
						runs = append(runs, name)
					}
				}
			}
			ir[i] = sum
			cleanup()
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

// outFiles lists the callgrind outputs in dir.
func outFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "callgrind.out.*"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// settled waits until the processes that exited have written their counts
// (no output in dir changes for a second) and lists the outputs.
func settled(t *testing.T, dir string) []string {
	t.Helper()
	var last string
	for range 120 {
		time.Sleep(time.Second)
		files := outFiles(t, dir)
		var state strings.Builder
		for _, name := range files {
			fi, err := os.Stat(name)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&state, "%s %d %d\n", name, fi.Size(), instructions(t, name))
		}
		if state.String() == last {
			return files
		}
		last = state.String()
	}
	t.Fatal("the exited processes' counts never settled")
	return nil
}

// instructions reads the total of one callgrind output.
func instructions(t *testing.T, name string) int64 {
	t.Helper()
	f, err := os.Open(name)
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
