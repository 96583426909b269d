package patroni

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
)

// Node is one PostgreSQL server and the Patroni daemon that manages it.
type Node struct {
	// Name is the node's Patroni member name: node0, node1, ...
	Name     string
	port     int
	restPort int
	dir      string
	bin      string
	c        *Cluster
	patroni  *process
}

func (c *Cluster) newNode(i int, bin string, cfg *Config, timing map[string]time.Duration) (*Node, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	n := &Node{Name: "node" + strconv.Itoa(i), port: ports[0], restPort: ports[1], bin: bin, c: c}
	n.dir = filepath.Join(c.root, n.Name)
	if err := os.Mkdir(n.dir, 0o700); err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	if err := c.chown(n.dir); err != nil {
		return nil, err
	}
	local := map[string]any{
		"unix_socket_directories": n.dir,
		"shared_buffers":          "32MB",
		"max_connections":         200,
		"log_min_messages":        "warning",
		"log_line_prefix":         "%m [%p] ",
		"logging_collector":       "on",
		"log_directory":           filepath.Join(n.dir, "pglog"),
		"log_filename":            "postgresql.log",
		"log_rotation_age":        0,
		"log_rotation_size":       0,
	}
	for k, v := range cfg.Settings {
		local[k] = v
	}
	// JSON is YAML: Patroni reads it as its configuration file.
	conf := map[string]any{
		"scope":     c.scope,
		"namespace": "/pgfence/",
		"name":      n.Name,
		"log":       map[string]any{"level": "INFO"},
		"restapi": map[string]any{
			"listen":          n.RESTAddr(),
			"connect_address": n.RESTAddr(),
		},
		c.dcs: map[string]any{"hosts": []string{c.etcd.url[len("http://"):]}, "protocol": "http"},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl":                     int(timing["TTL"] / time.Second),
				"loop_wait":               int(timing["LoopWait"] / time.Second),
				"retry_timeout":           int(timing["RetryTimeout"] / time.Second),
				"maximum_lag_on_failover": 1 << 20,
				"primary_start_timeout":   0,
				"synchronous_mode":        cfg.SynchronousMode,
				"check_timeline":          true,
				"postgresql": map[string]any{
					"use_pg_rewind": true,
					"use_slots":     true,
					"parameters": map[string]any{
						"wal_level":             "replica",
						"hot_standby":           "on",
						"max_wal_senders":       10,
						"max_replication_slots": 10,
						"wal_keep_size":         "128MB",
					},
				},
			},
			"initdb": []any{map[string]string{"encoding": "UTF8"}, map[string]string{"locale": "C"}, "data-checksums"},
		},
		"postgresql": map[string]any{
			"listen":          n.Addr(),
			"connect_address": n.Addr(),
			"data_dir":        n.DataDir(),
			"bin_dir":         c.binDir,
			"pgpass":          filepath.Join(n.dir, "pgpass"),
			"authentication": map[string]any{
				"superuser":   map[string]string{"username": pgcluster.Superuser},
				"replication": map[string]string{"username": pgcluster.Superuser},
				"rewind":      map[string]string{"username": pgcluster.Superuser},
			},
			"parameters": local,
			"pg_hba": []string{
				"local all all trust",
				"host all all 127.0.0.1/32 trust",
				"host replication all 127.0.0.1/32 trust",
			},
			"basebackup": []any{map[string]string{"checkpoint": "fast"}},
		},
	}
	raw, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	if err := os.WriteFile(n.configPath(), raw, 0o644); err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	return n, nil
}

func (n *Node) configPath() string { return filepath.Join(n.dir, "patroni.yml") }
func (n *Node) patroniLog() string { return filepath.Join(n.dir, "patroni.log") }

// postgresLogTail returns the last n lines of the node's PostgreSQL log.
func (n *Node) postgresLogTail(lines int) string {
	return tail(filepath.Join(n.dir, "pglog", "postgresql.log"), lines)
}

// start starts the node's Patroni daemon.
func (n *Node) start() error {
	n.c.progress(fmt.Sprintf("starting Patroni %s (PostgreSQL on %s, REST on %s)", n.Name, n.Addr(), n.RESTAddr()))
	p, err := n.c.spawn(n.Name+"-patroni", n.bin, []string{n.configPath()}, n.dir, n.patroniLog())
	if err != nil {
		return err
	}
	n.patroni = p
	return nil
}

// Addr is the node's PostgreSQL host:port.
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// Port is the node's PostgreSQL port.
func (n *Node) Port() int { return n.port }

// RESTAddr is the host:port of the node's Patroni REST API.
func (n *Node) RESTAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.restPort)) }

// DataDir is the node's PostgreSQL data directory.
func (n *Node) DataDir() string { return filepath.Join(n.dir, "data") }

// ConnString returns a URL for database on this node alone, as the
// superuser, whatever its role.
func (n *Node) ConnString(database string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&connect_timeout=2", pgcluster.Superuser, n.Addr(), database)
}

// PostmasterPID returns the pid of the node's postmaster, from
// postmaster.pid (0 when it is not running).
func (n *Node) PostmasterPID() int {
	pid := readPID(filepath.Join(n.DataDir(), "postmaster.pid"))
	if pid <= 0 || !runsIn(pid, n.DataDir()) {
		return 0 // not running; the file of a crashed postmaster is stale
	}
	return pid
}

// KillPostmaster sends SIGKILL to the node's postmaster alone, as a crash of
// it would: its backends notice and exit, and Patroni finds PostgreSQL down.
// It returns the pid it killed.
func (n *Node) KillPostmaster() (int, error) {
	pid := n.PostmasterPID()
	if pid == 0 {
		return 0, fmt.Errorf("patroni: %s has no running postmaster", n.Name)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("patroni: kill %s's postmaster %d: %w", n.Name, pid, err)
	}
	return pid, nil
}

// Freeze stops the whole node with SIGSTOP, as a paused VM: its Patroni
// daemon, the postmaster and every PostgreSQL process. Nothing of it runs
// until [Node.Thaw]; the kernel still accepts TCP connections on its ports.
func (n *Node) Freeze() error { return n.signalAll(syscall.SIGSTOP) }

// Thaw resumes a node stopped by [Node.Freeze].
func (n *Node) Thaw() error { return n.signalAll(syscall.SIGCONT) }

// signalAll sends sig to Patroni, the postmaster and every process below
// them. The postmaster first for SIGSTOP (so it forks nothing the scan would
// miss), last for SIGCONT.
func (n *Node) signalAll(sig syscall.Signal) error {
	if n.patroni == nil {
		return fmt.Errorf("patroni: %s is not running", n.Name)
	}
	pids := []int{n.patroni.cmd.Process.Pid}
	if pm := n.PostmasterPID(); pm != 0 {
		if sig == syscall.SIGSTOP {
			_ = syscall.Kill(pm, sig)
		}
		pids = append(pids, pm)
	}
	for _, p := range append([]int(nil), pids...) {
		pids = append(pids, pgcluster.Descendants(p)...)
	}
	for _, p := range pids {
		if err := syscall.Kill(p, sig); err != nil && err != syscall.ESRCH {
			return fmt.Errorf("patroni: signal %d: %w", p, err)
		}
	}
	return nil
}

// close stops the node's Patroni, which stops PostgreSQL (fast), and kills a
// postmaster left behind.
func (n *Node) close() {
	pm := n.PostmasterPID()
	if pm != 0 {
		_ = syscall.Kill(pm, syscall.SIGCONT)
		for _, p := range pgcluster.Descendants(pm) {
			_ = syscall.Kill(p, syscall.SIGCONT)
		}
	}
	n.patroni.stop(syscall.SIGTERM, 30*time.Second)
	if pm := n.PostmasterPID(); pm != 0 {
		pids := append(pgcluster.Descendants(pm), pm)
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		deadline := time.Now().Add(10 * time.Second)
		for _, p := range pids {
			for syscall.Kill(p, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}
