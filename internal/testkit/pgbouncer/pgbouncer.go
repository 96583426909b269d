// Package pgbouncer starts a throwaway PgBouncer in front of a test cluster,
// with the settings that decide what a client sees through it: the pool mode,
// the pool size, how server connections are reused (LIFO, PgBouncer's
// default, or round robin), and how long PgBouncer waits before it retries a
// server login that failed.
//
// PgBouncer listens on 127.0.0.1 and a free port, keeps its files in a temp
// directory, and runs as the server's OS user when the caller is root. It
// receives SIGKILL if the test process dies. Close stops it and removes its
// directory.
//
// # Guarantees
//
//   - [Start] returns once PgBouncer accepts TCP connections, or an error
//     with the tail of its log.
//   - [PgBouncer.Warm] leaves the pool with exactly the number of server
//     connections it asks for, so a test knows which backends can serve it.
//
// # Failure handling
//
// A missing binary is [ErrNotFound]. Tests skip on it, except under CI=true,
// where they fail.
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotFound is returned when the pgbouncer binary cannot be found.
var ErrNotFound = errors.New("pgbouncer: the pgbouncer binary is not on PATH nor in /usr/sbin; install it (Debian/Ubuntu: apt-get install pgbouncer)")

// Defaults of [Config].
const (
	PoolModeDefault         = "transaction"
	PoolSizeDefault         = 3
	ServerLoginRetryDefault = 15 * time.Second // PgBouncer's own default
)

// Config configures [Start]. A nil *Config uses the defaults.
type Config struct {
	// Upstream is the server's host:port. Required.
	Upstream string
	// User is the role PgBouncer logs in as (trust authentication upstream).
	// Default "postgres".
	User string
	// PoolMode is session, transaction or statement. Default
	// [PoolModeDefault].
	PoolMode string
	// PoolSize is default_pool_size: server connections per database and
	// user. Default [PoolSizeDefault].
	PoolSize int
	// RoundRobin sets server_round_robin = 1: idle server connections are
	// reused oldest first, so consecutive transactions of one client reach
	// different backends even when nothing else runs. Default: LIFO, the most
	// recently used connection first, so an idle PgBouncer tends to give a
	// client the backend it just had.
	RoundRobin bool
	// ServerLoginRetry is server_login_retry: after a failed server login,
	// PgBouncer refuses clients (08P01 "server login has been failing") for
	// this long before it tries again. Default [ServerLoginRetryDefault].
	ServerLoginRetry time.Duration
	// Credential is the OS user PgBouncer runs as (nil: the caller's; it
	// refuses to run as root).
	Credential *syscall.Credential
}

// PgBouncer is one running PgBouncer.
type PgBouncer struct {
	dir    string
	port   int
	user   string
	cmd    *exec.Cmd
	exited chan struct{}
	once   sync.Once
}

// Start starts PgBouncer in front of cfg.Upstream.
func Start(ctx context.Context, cfg *Config) (*PgBouncer, error) {
	if cfg == nil || cfg.Upstream == "" {
		return nil, errors.New("pgbouncer: Config.Upstream is required")
	}
	host, upPort, err := net.SplitHostPort(cfg.Upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: Config.Upstream: %w", err)
	}
	user := cmpOr(cfg.User, "postgres")
	mode := cmpOr(cfg.PoolMode, PoolModeDefault)
	switch mode {
	case "session", "transaction", "statement":
	default:
		return nil, fmt.Errorf("pgbouncer: Config.PoolMode: %q is not session, transaction or statement", mode)
	}
	size := cfg.PoolSize
	if size <= 0 {
		size = PoolSizeDefault
	}
	retry := cfg.ServerLoginRetry
	if retry <= 0 {
		retry = ServerLoginRetryDefault
	}
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			return nil, ErrNotFound
		}
		bin = "/usr/sbin/pgbouncer"
	}
	dir, err := os.MkdirTemp("", "pgfence-bouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	if c := cfg.Credential; c != nil {
		if err := os.Chown(dir, int(c.Uid), int(c.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("pgbouncer: %w", err)
		}
	}
	port, err := freePort()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	roundRobin := 0
	if cfg.RoundRobin {
		roundRobin = 1
	}
	// server_login_retry takes seconds; fractions are PgBouncer ≥ 1.19 only.
	retrySeconds := max(1, int((retry+time.Second-1)/time.Second))
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
admin_users = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
server_round_robin = %d
server_login_retry = %d
ignore_startup_parameters = extra_float_digits,application_name
server_reset_query =
logfile = %s
pidfile = %s
`, host, upPort, user, port, user, mode, size, roundRobin, retrySeconds,
		filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	conf := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(conf, []byte(ini), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	cmd := exec.Command(bin, conf)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cfg.Credential, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgbouncer: start: %w", err)
	}
	b := &PgBouncer{dir: dir, port: port, user: user, cmd: cmd, exited: make(chan struct{})}
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
			log := b.LogTail(5)
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("pgbouncer: exited during startup: %s", log)
		case <-ctx.Done():
			b.Close()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Close()
			return nil, errors.New("pgbouncer: not listening after 20s")
		}
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgbouncer: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr is PgBouncer's host:port.
func (b *PgBouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// Port is PgBouncer's port.
func (b *PgBouncer) Port() int { return b.port }

// ConnString returns a URL for database through PgBouncer, as its login
// user, with nothing a pooler would need added.
func (b *PgBouncer) ConnString(database string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", b.user, b.Addr(), database)
}

// Admin runs one command on PgBouncer's admin console (database pgbouncer:
// SHOW POOLS, RECONNECT, PAUSE, ...) and returns its rows as text.
func (b *PgBouncer) Admin(ctx context.Context, command string) ([][]string, error) {
	cfg, err := pgx.ParseConfig(b.ConnString("pgbouncer"))
	if err != nil {
		return nil, err
	}
	// The console speaks the simple query protocol only.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: admin console: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, command)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %s: %w", command, err)
	}
	defer rows.Close()
	var out [][]string
	for rows.Next() {
		vals := rows.RawValues()
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = string(v)
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgbouncer: %s: %w", command, err)
	}
	return out, nil
}

// Warm makes PgBouncer hold exactly n idle server connections to database
// (n ≤ the pool size): it opens n client connections, holds one transaction
// open on each at once so that each needs a server connection of its own,
// and ends them. It returns the backend pids.
func (b *PgBouncer) Warm(ctx context.Context, database string, n int) ([]int32, error) {
	conns := make([]*pgx.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close(context.WithoutCancel(ctx))
		}
	}()
	var pids []int32
	for range n {
		cfg, err := pgx.ParseConfig(b.ConnString(database))
		if err != nil {
			return nil, err
		}
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("pgbouncer: warm: %w", err)
		}
		conns = append(conns, c)
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			return nil, fmt.Errorf("pgbouncer: warm: %w", err)
		}
		var pid int32
		if err := c.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&pid); err != nil {
			return nil, fmt.Errorf("pgbouncer: warm: %w", err)
		}
		pids = append(pids, pid)
	}
	for _, c := range conns {
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			return nil, fmt.Errorf("pgbouncer: warm: %w", err)
		}
	}
	return pids, nil
}

// LogTail returns the last n lines of PgBouncer's log.
func (b *PgBouncer) LogTail(n int) string {
	raw, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Close stops PgBouncer and removes its directory. It is safe to call more
// than once.
func (b *PgBouncer) Close() {
	b.once.Do(func() {
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.exited:
		case <-time.After(5 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.exited
		}
		_ = os.RemoveAll(b.dir)
	})
}
