package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// ErrNoPgBouncer is returned when the pgbouncer binary cannot be found.
var ErrNoPgBouncer = errors.New("pgcluster: pgbouncer not found on PATH or in /usr/sbin; install it (Debian/Ubuntu: apt-get install pgbouncer)")

// PgBouncer is a PgBouncer in transaction pooling mode in front of a cluster,
// for tests of what works through a transaction-mode pooler.
type PgBouncer struct {
	dir    string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartPgBouncer starts PgBouncer (pool_mode = transaction, poolSize server
// connections per database) in front of c, on 127.0.0.1 and a free port,
// connecting to the server as the bootstrap superuser.
func StartPgBouncer(ctx context.Context, c *Cluster, poolSize int) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			return nil, ErrNoPgBouncer
		}
		bin = "/usr/sbin/pgbouncer"
	}
	dir, err := os.MkdirTemp("", dirPrefix+"bouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := c.chown(dir); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,application_name
server_reset_query =
logfile = %s
pidfile = %s
`, c.Port(), Superuser, port, poolSize, filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	conf := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(conf, []byte(ini), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	cmd := exec.Command(bin, conf)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgcluster: start pgbouncer: %w", err)
	}
	b := &PgBouncer{dir: dir, port: port, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(b.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", b.Addr(), 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return b, nil
		}
		select {
		case <-b.exited:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("pgcluster: pgbouncer exited during startup: %s", lastLines(log, 5))
		case <-ctx.Done():
			b.Close()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Close()
			return nil, errors.New("pgcluster: pgbouncer not listening after 20s")
		}
	}
}

// Addr is PgBouncer's host:port.
func (b *PgBouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// ConnString returns a URL for database through PgBouncer.
func (b *PgBouncer) ConnString(database string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", Superuser, b.Addr(), database)
}

// Close stops PgBouncer and removes its directory.
func (b *PgBouncer) Close() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(5 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
	_ = os.RemoveAll(b.dir)
}
