package pgcluster_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
)

// envChild turns the test binary into a process that starts a cluster, prints
// its root directory and address, and waits to be killed or interrupted.
const envChild = "PGCLUSTER_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(envChild); mode != "" {
		os.Exit(child(mode))
	}
	code := m.Run()
	pgcluster.CleanupPristine()
	os.Exit(code)
}

func child(mode string) int {
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, nil)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	if mode == "interrupt" {
		// What pgfencetest.Main and the CLI do on Ctrl-C.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, os.Interrupt)
		fmt.Println(c.Root(), c.Addr())
		<-sigs
		_ = c.Close()
		pgcluster.CleanupPristine()
		return 130
	}
	fmt.Println(c.Root(), c.Addr())
	select {}
}

func startChild(t *testing.T, mode string) (*exec.Cmd, string, string) {
	t.Helper()
	if _, err := pgcluster.FindBinaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child said nothing: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 2 || f[0] == "error" {
		t.Fatalf("child: %s", line)
	}
	if !accepting(f[1]) {
		t.Fatalf("child's server at %s does not accept connections", f[1])
	}
	return cmd, f[0], f[1]
}

func accepting(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A test process that dies (SIGKILL, a panic) takes its server with it, and
// the next cluster start sweeps the directory it left behind.
func TestParentDeathStopsServer(t *testing.T) {
	cmd, root, addr := startChild(t, "block")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitFor(t, "the orphaned server to stop", func() bool { return !accepting(addr) })
	waitFor(t, "postmaster.pid to go", func() bool {
		_, err := os.Stat(filepath.Join(root, "data", "postmaster.pid"))
		return os.IsNotExist(err)
	})
	c, err := pgcluster.Start(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("stale cluster directory %s was not swept: %v", root, err)
	}
}

// Ctrl-C stops the server and removes its directory.
func TestInterruptCleansUp(t *testing.T) {
	cmd, root, addr := startChild(t, "interrupt")
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if accepting(addr) {
		t.Fatalf("server at %s still up after Ctrl-C", addr)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s left behind after Ctrl-C", root)
	}
}

func TestCloseRemovesDirectory(t *testing.T) {
	c, err := pgcluster.Start(context.Background(), nil)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	root, addr := c.Root(), c.Addr()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if accepting(addr) {
		t.Fatal("server still accepting after Close")
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("%s still exists after Close", root)
	}
	if err := c.Start(context.Background()); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}

// Kill takes the backends down with the postmaster before it returns: they
// live in sessions of their own, and one still alive would hold the shared
// memory segment and make the next Start fail.
func TestKillStopsBackendsAndRestarts(t *testing.T) {
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, nil)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for round := 0; round < 3; round++ {
		var backends []int
		for i := 0; i < 4; i++ {
			conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var pid int
			if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			backends = append(backends, pid)
		}
		if err := c.Kill(); err != nil {
			t.Fatal(err)
		}
		for _, pid := range backends {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !zombie(b) {
				t.Fatalf("round %d: backend %d still running after Kill: %s", round, pid, b)
			}
		}
		if err := c.Start(ctx); err != nil {
			t.Fatalf("round %d: start after Kill: %v", round, err)
		}
	}
}

func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X')
}
