package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
)

// Both modes lock and unlock through a real redis-server; the figures are not
// asserted (speed is measured, never tested), only that the work was done and
// counted: each op is one SET NX PX and one compare-and-delete script.
func TestMeasure(t *testing.T) {
	if findServer() == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not found; CI must install it")
		}
		t.Skip("redis-server not found")
	}
	for _, mode := range []Mode{Durable, Memory} {
		t.Run(string(mode), func(t *testing.T) {
			r, err := Measure(context.Background(), mode, benchrun.Config{Workers: 2, Duration: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if r.Skipped != "" || r.Ops == 0 || r.Errors != 0 || r.Case != "redis-"+string(mode) || r.Workers != 2 {
				t.Fatalf("%+v", r)
			}
			if r.StatementsPerOp < 2 || r.StatementsPerOp > 2.1 {
				t.Fatalf("%.2f commands per op, want 2 (SET NX PX + EVALSHA)", r.StatementsPerOp)
			}
		})
	}
}

// Interrupted (the peer's SIGINT, sent by `pgfence bench` when it is itself
// interrupted or past its deadline), a run gives no result: its partial
// figures would pass for a measurement.
func TestMeasureInterrupted(t *testing.T) {
	if findServer() == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not found; CI must install it")
		}
		t.Skip("redis-server not found")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // redis-server starts well before
	defer cancel()
	r, err := Measure(ctx, Memory, benchrun.Config{Workers: 1, Duration: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "interrupted") || r.Ops != 0 {
		t.Fatalf("Measure cut short: %+v, %v; want an error and no result", r, err)
	}
}

// Without redis-server the result says so instead of pretending to measure.
func TestMeasureWithoutServer(t *testing.T) {
	t.Setenv("REDIS_SERVER", "/nonexistent/redis-server")
	r, err := Measure(context.Background(), Memory, benchrun.Config{Workers: 1, Duration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.Skipped, "redis-server not found") || !strings.Contains(r.Skipped, "/nonexistent/redis-server") || r.Ops != 0 {
		t.Fatalf("%+v", r)
	}
}

func TestUnknownMode(t *testing.T) {
	if _, err := Measure(context.Background(), "fast", benchrun.Config{Workers: 1, Duration: time.Millisecond}); err == nil {
		t.Fatal("mode fast accepted")
	}
}

// holdEnv makes the test binary a peer that starts a redis-server, prints its
// pid and waits to be killed (TestServerDiesWithPeer).
const holdEnv = "PGFENCE_BENCHPEER_TEST_HOLD"

func TestHoldServer(t *testing.T) {
	if os.Getenv(holdEnv) != "1" {
		t.Skip("helper process of TestServerDiesWithPeer")
	}
	srv, err := startServer(context.Background(), findServer(), Memory)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("redis-server pid", srv.cmd.Process.Pid)
	time.Sleep(time.Minute) // killed long before
	srv.stop()
}

// A peer killed with SIGKILL (as `pgfence bench` does past its deadline)
// cannot stop its redis-server: the server must not outlive it.
func TestServerDiesWithPeer(t *testing.T) {
	if findServer() == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not found; CI must install it")
		}
		t.Skip("redis-server not found")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	peer := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestHoldServer$")
	// The killed server leaves its directory behind: in a test directory.
	peer.Env = append(os.Environ(), holdEnv+"=1", "TMPDIR="+t.TempDir())
	out, err := peer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := peer.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	for sc := bufio.NewScanner(out); pid == 0 && sc.Scan(); {
		if rest, ok := strings.CutPrefix(sc.Text(), "redis-server pid "); ok {
			pid, _ = strconv.Atoi(rest)
		}
	}
	if pid == 0 {
		_ = peer.Process.Kill()
		_ = peer.Wait()
		t.Fatal("the helper printed no redis-server pid")
	}
	_ = peer.Process.Kill()
	_ = peer.Wait()
	for !gone(pid) {
		if ctx.Err() != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server %d still runs after its peer was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gone reports whether process pid has exited (a zombie waiting for its new
// parent to reap it counts as exited).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) STATE ...: comm may hold spaces, the state follows the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}
