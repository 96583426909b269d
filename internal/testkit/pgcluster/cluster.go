// Package pgcluster starts and controls throwaway local PostgreSQL clusters for
// tests, the CLI's embedded default database and fault experiments.
//
// A cluster lives in a temp directory, listens on 127.0.0.1 only, on a free
// port, and runs as an unprivileged OS user when the caller is root (initdb and
// postgres refuse to run as root). The postmaster is a direct child process that
// receives SIGQUIT (immediate shutdown) if the parent dies, so a crashed or
// interrupted test does not leave a server running; leftover directories of dead
// clusters are swept the next time a cluster starts.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoBinaries is returned when no PostgreSQL server binaries can be found.
var ErrNoBinaries = errors.New("pgcluster: PostgreSQL server binaries (initdb, postgres) not found on PATH or under /usr/lib/postgresql/*/bin; install them (Debian/Ubuntu: apt-get install postgresql) or pass a database URL")

// dirPrefix names every cluster directory so stale ones can be found.
const dirPrefix = "pgfence-pg-"

// Superuser is the bootstrap superuser of every cluster.
const Superuser = "postgres"

// Mode is a shutdown mode, as in pg_ctl stop -m.
type Mode int

const (
	// Fast disconnects clients, rolls back their transactions and checkpoints (SIGINT).
	Fast Mode = iota
	// Immediate aborts every process without a checkpoint: the next start runs
	// crash recovery, as after a power loss of the server processes (SIGQUIT).
	Immediate
	// Smart waits for every client to disconnect (SIGTERM).
	Smart
)

func (m Mode) signal() syscall.Signal {
	switch m {
	case Immediate:
		return syscall.SIGQUIT
	case Smart:
		return syscall.SIGTERM
	default:
		return syscall.SIGINT
	}
}

func (m Mode) String() string {
	switch m {
	case Immediate:
		return "immediate"
	case Smart:
		return "smart"
	default:
		return "fast"
	}
}

// Config configures [Start]. A nil *Config uses the defaults.
type Config struct {
	// BinDir holds initdb and postgres. Default: [FindBinaries].
	BinDir string
	// Settings are server settings passed as -c name=value, on top of the
	// defaults (listen_addresses, port, max_connections=300, ...).
	Settings map[string]string
	// Progress, when set, receives one line per startup step.
	Progress func(msg string)
}

// Cluster is one running (or stopped) local PostgreSQL cluster.
type Cluster struct {
	root     string // temp dir, removed by Close
	dataDir  string
	binDir   string
	port     int
	settings map[string]string
	cred     *syscall.Credential
	progress func(string)

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	closed bool
}

// FindBinaries returns the directory of initdb and postgres: from PATH, else the
// newest /usr/lib/postgresql/*/bin.
func FindBinaries() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// Start creates a new cluster in a temp directory and starts it.
func Start(ctx context.Context, cfg *Config) (*Cluster, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	binDir := cfg.BinDir
	if binDir == "" {
		var err error
		if binDir, err = FindBinaries(); err != nil {
			return nil, err
		}
	}
	sweepStale()
	c := &Cluster{binDir: binDir, settings: cfg.Settings, progress: cfg.Progress}
	if c.progress == nil {
		c.progress = func(string) {}
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	c.cred = cred
	root, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c.root = root
	c.dataDir = filepath.Join(root, "data")
	if err := c.chown(root); err != nil {
		c.removeAll()
		return nil, err
	}
	if err := c.initdb(ctx); err != nil {
		c.removeAll()
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		c.removeAll()
		return nil, err
	}
	running.Store(c.Addr(), c)
	return c, nil
}

// running holds the clusters Start started and Close has not closed, by
// address, for At.
var running sync.Map

// At returns the cluster Start started at addr (host:port) in this process,
// or nil: for the project's fault tests that reach, under a cluster of
// pgfencetest, what its API does not offer (standbys, the server's OS
// credential).
func At(addr string) *Cluster {
	c, _ := running.Load(addr)
	cl, _ := c.(*Cluster)
	return cl
}

// serverCredential returns the OS user to run the server as: nil when the
// caller is not root; else the "postgres" user, falling back to "nobody".
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
	}
	return nil, errors.New("pgcluster: running as root and no unprivileged user (postgres, nobody) to run the server as; create one (useradd postgres)")
}

func (c *Cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.root
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true}
	return cmd
}

// initdb creates the data directory, once per process: later clusters copy a
// pristine data directory, which takes milliseconds instead of a second.
func (c *Cluster) initdb(ctx context.Context) error {
	pristine, err := pristineDataDir(ctx, c)
	if err != nil {
		return err
	}
	c.progress("copying a fresh data directory")
	cmd := exec.CommandContext(ctx, "cp", "-a", pristine, c.dataDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgcluster: copy data directory: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

var pristine struct {
	mu   sync.Mutex
	dir  string
	root string
}

func pristineDataDir(ctx context.Context, c *Cluster) (string, error) {
	pristine.mu.Lock()
	defer pristine.mu.Unlock()
	if pristine.dir != "" {
		if _, err := os.Stat(filepath.Join(pristine.dir, "PG_VERSION")); err == nil {
			return pristine.dir, nil
		}
	}
	root, err := os.MkdirTemp("", dirPrefix+"initdb-")
	if err != nil {
		return "", fmt.Errorf("pgcluster: %w", err)
	}
	if err := c.chown(root); err != nil {
		return "", err
	}
	dir := filepath.Join(root, "data")
	c.progress("running initdb (once per process)")
	cmd := c.command(ctx, "initdb", "-D", dir, "-U", Superuser, "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(root)
		return "", fmt.Errorf("pgcluster: initdb: %v: %s", err, lastLines(out, 5))
	}
	// The owner-only pid file of a live process marks the dir as in use.
	_ = os.WriteFile(filepath.Join(root, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	pristine.dir, pristine.root = dir, root
	return dir, nil
}

// CleanupPristine removes the per-process initdb copy. Call it at process exit
// (the test harness's Main does).
func CleanupPristine() {
	pristine.mu.Lock()
	defer pristine.mu.Unlock()
	if pristine.root != "" {
		_ = os.RemoveAll(pristine.root)
		pristine.dir, pristine.root = "", ""
	}
}

// sweepStale removes cluster directories left by processes that died without
// cleaning up (a panic, SIGKILL, Ctrl-C).
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		pidFile := filepath.Join(d, "owner.pid")
		raw, err := os.ReadFile(pidFile)
		if err != nil {
			continue // not ours, or still being created
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || pid <= 0 {
			continue
		}
		if syscall.Kill(pid, 0) == nil || errors.Is(syscall.Kill(pid, 0), syscall.EPERM) {
			continue // owner still alive
		}
		if postmasterAlive(filepath.Join(d, "data")) {
			continue
		}
		_ = os.RemoveAll(d)
	}
}

func postmasterAlive(dataDir string) bool {
	raw, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return false
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start starts the server of a stopped cluster and waits until it accepts
// connections. The first start picks a free port; restarts keep it.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("pgcluster: cluster is closed")
	}
	if c.cmd != nil {
		return errors.New("pgcluster: already running")
	}
	if err := os.WriteFile(filepath.Join(c.root, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	firstStart := c.port == 0
	for attempt := 0; ; attempt++ {
		if c.port == 0 {
			p, err := freePort()
			if err != nil {
				return err
			}
			c.port = p
		}
		err := c.startLocked(ctx)
		if err == nil {
			return nil
		}
		// Another process may grab the free port between our probe and the
		// server's bind; a first start then tries another port. A restart keeps
		// its port, which clients and proxies already point at.
		if firstStart && attempt < 3 && strings.Contains(err.Error(), "could not bind") {
			c.port = 0
			continue
		}
		return err
	}
}

func (c *Cluster) startLocked(ctx context.Context) error {
	c.progress(fmt.Sprintf("starting PostgreSQL on 127.0.0.1:%d", c.port))
	args := []string{"-D", c.dataDir}
	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(c.port),
		"unix_socket_directories": c.root,
		"max_connections":         "300",
		"logging_collector":       "off",
		"log_min_messages":        "warning",
		"shared_buffers":          "32MB",
		"max_wal_senders":         "10",
		"wal_level":               "replica",
	}
	for k, v := range c.settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	logPath := filepath.Join(c.root, "postgres.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"), args...)
	cmd.Dir = c.root
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: c.cred,
		Setpgid:    true,            // Ctrl-C reaches us, not the server directly
		Pdeathsig:  syscall.SIGQUIT, // our death stops the server
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	c.cmd, c.exited = cmd, exited
	if err := c.waitReady(ctx, exited); err != nil {
		_ = cmd.Process.Signal(syscall.SIGQUIT)
		<-exited
		c.cmd, c.exited = nil, nil
		return fmt.Errorf("%w; server log: %s", err, c.logTail(8))
	}
	return nil
}

func (c *Cluster) waitReady(ctx context.Context, exited <-chan struct{}) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return errors.New("pgcluster: postgres exited during startup")
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, c.ConnString("postgres"))
		cancel()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("pgcluster: waiting for postgres: %w", ctx.Err())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: postgres not ready after 60s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop shuts the server down in the given mode and waits for it to exit.
func (c *Cluster) Stop(mode Mode) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopLocked(mode)
}

func (c *Cluster) stopLocked(mode Mode) error {
	if c.cmd == nil {
		return nil
	}
	c.progress("stopping PostgreSQL (" + mode.String() + ")")
	if err := c.cmd.Process.Signal(mode.signal()); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgcluster: stop: %w", err)
	}
	<-c.exited
	c.cmd, c.exited = nil, nil
	return nil
}

// Kill sends SIGKILL to every server process (the postmaster and all its
// children), as a crash of the whole instance would. The next Start runs
// crash recovery.
//
// PostgreSQL puts each child in a session of its own (setsid), so signalling
// the postmaster's process group would reach the postmaster alone; the
// children are found through /proc instead.
func (c *Cluster) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return nil
	}
	pm := c.cmd.Process.Pid
	// Stopped, the postmaster cannot fork a child the scan would miss.
	_ = syscall.Kill(pm, syscall.SIGSTOP)
	pids := append(Descendants(pm), pm)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-c.exited
	c.cmd, c.exited = nil, nil
	// A backend still alive holds the shared memory segment, and a restart
	// before it is gone fails with "pre-existing shared memory block is still
	// in use". A zombie has already released its memory.
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// Descendants returns the pids of every process below pid, read from /proc
// (the server's children; Patroni's postmaster and its children).
func Descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(p); ok {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		for _, ch := range children[next] {
			out = append(out, ch)
			queue = append(queue, ch)
		}
	}
	return out
}

// procStat returns the state letter and parent pid from /proc/pid/stat.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name is in parentheses and may contain spaces; the fields
	// after its closing parenthesis are "state ppid ...".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil || len(f[0]) == 0 {
		return 0, 0, false
	}
	return f[0][0], ppid, true
}

func parentOf(pid int) (int, bool) {
	_, ppid, ok := procStat(pid)
	return ppid, ok
}

// alive reports whether pid exists and has not yet exited (a zombie has).
func alive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

// Restart stops the server in mode and starts it again on the same port.
func (c *Cluster) Restart(ctx context.Context, mode Mode) error {
	if err := c.Stop(mode); err != nil {
		return err
	}
	return c.Start(ctx)
}

// Running reports whether the server process is up.
func (c *Cluster) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cmd != nil
}

// Close stops the server immediately and removes its directory. It is safe to
// call more than once.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	running.Delete(c.Addr())
	err := c.stopLocked(Immediate)
	c.removeAll()
	return err
}

func (c *Cluster) removeAll() {
	if c.root != "" {
		_ = os.RemoveAll(c.root)
	}
}

// Host is always 127.0.0.1.
func (c *Cluster) Host() string { return "127.0.0.1" }

// Port is the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// Addr is host:port, for a proxy to sit in front of.
func (c *Cluster) Addr() string { return net.JoinHostPort(c.Host(), strconv.Itoa(c.port)) }

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// Root is the cluster's temp directory (data directory, log, socket).
func (c *Cluster) Root() string { return c.root }

// BinDir is where the server binaries are.
func (c *Cluster) BinDir() string { return c.binDir }

// Credential is the OS user the server runs as (nil: the current user).
func (c *Cluster) Credential() *syscall.Credential { return c.cred }

// ConnString returns a URL for database as the bootstrap superuser.
func (c *Cluster) ConnString(database string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", Superuser, c.Addr(), database)
}

// LogTail returns the last n lines of the server log.
func (c *Cluster) LogTail(n int) string { return c.logTail(n) }

func (c *Cluster) logTail(n int) string {
	raw, _ := os.ReadFile(filepath.Join(c.root, "postgres.log"))
	return lastLines(raw, n)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
