package patroni

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// start starts a cluster for t, closed when t ends; skipped without the
// binaries, except under CI=true.
func start(t *testing.T, cfg *Config) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if cfg == nil {
		cfg = &Config{}
	}
	cfg.Progress = func(msg string) { t.Log(msg) }
	c, err := Start(ctx, cfg)
	if err != nil {
		if errors.Is(err, ErrNotInstalled) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// A cluster starts with node0 leading and node1 streaming; the multi-host
// URL reaches the primary; Close leaves no process and no file.
func TestCluster(t *testing.T) {
	for _, dcs := range []string{DCSEtcdV2, DCSEtcdV3} {
		t.Run(dcs, func(t *testing.T) { testCluster(t, dcs) })
	}
}

func testCluster(t *testing.T, dcs string) {
	c := start(t, &Config{DCS: dcs})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, m, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if leader.Name != "node0" || m.Timeline != 1 {
		t.Fatalf("leader %s on timeline %d, want node0 on 1", leader.Name, m.Timeline)
	}
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var inRecovery bool
	var port int
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), inet_server_port()`).Scan(&inRecovery, &port); err != nil {
		t.Fatal(err)
	}
	if inRecovery || port != leader.Port() {
		t.Fatalf("the multi-host URL reached port %d (in recovery: %v), want the primary %d", port, inRecovery, leader.Port())
	}
	conn.Close(ctx)

	pids := []int{c.etcd.cmd.Process.Pid}
	for _, n := range c.Nodes() {
		pids = append(pids, n.patroni.cmd.Process.Pid, n.PostmasterPID())
	}
	c.Close()
	for _, pid := range pids {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
			if state, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")); len(state) > 0 {
				t.Errorf("process %d still exists after Close: %s", pid, state)
			}
		}
	}
	if _, err := os.Stat(c.root); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Close: %v", c.root, err)
	}
}
