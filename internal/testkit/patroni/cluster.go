package patroni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
)

// ErrNotInstalled is returned when patroni, etcd or the PostgreSQL server
// binaries are missing.
var ErrNotInstalled = errors.New("patroni: patroni, etcd or the PostgreSQL server binaries are not installed (Debian/Ubuntu: apt-get install patroni etcd-server postgresql)")

// Defaults of [Config].
const (
	NodesDefault        = 2
	TTLDefault          = 8 * time.Second
	LoopWaitDefault     = 1 * time.Second
	RetryTimeoutDefault = 3 * time.Second
)

// The etcd APIs Patroni can use.
const (
	// DCSEtcdV3 is etcd's v3 API (Patroni's etcd3 section).
	DCSEtcdV3 = "etcd3"
	// DCSEtcdV2 is etcd's v2 API (Patroni's etcd section; etcd runs with
	// --enable-v2). Patroni before 3.0.3 updates its leader key through
	// the v3 API with an unconditional put once its lease has expired: a
	// primary frozen past the TTL that resumes overwrites the key its
	// promoted replica holds, and the replica, with everything it
	// acknowledged on its new timeline, is demoted and rewound. Its v2
	// client updates the key with a compare-and-swap on its own name.
	DCSEtcdV2 = "etcd"
)

// waitTimeout bounds every wait for a state of the cluster.
const waitTimeout = 2 * time.Minute

// EnvKeep, when set, makes Close keep the cluster's directory (its logs and
// data directories) for a look after a failed test. Its processes are
// stopped all the same.
const EnvKeep = "PGFENCE_PATRONI_KEEP"

// dirPrefix names every cluster directory so that stale ones can be swept.
const dirPrefix = "pgfence-patroni-"

// Config configures [Start]. A nil *Config uses the defaults.
type Config struct {
	// BinDir holds the PostgreSQL server binaries. Default:
	// pgcluster.FindBinaries.
	BinDir string
	// Nodes is the number of PostgreSQL nodes, 2 or more. Default
	// [NodesDefault].
	Nodes int
	// SynchronousMode turns Patroni's synchronous_mode on: one replica is a
	// synchronous standby, every commit waits until it has the commit
	// flushed, and Patroni promotes only that standby.
	SynchronousMode bool
	// TTL, LoopWait and RetryTimeout are Patroni's ttl, loop_wait and
	// retry_timeout, in whole seconds. Defaults [TTLDefault],
	// [LoopWaitDefault], [RetryTimeoutDefault].
	TTL, LoopWait, RetryTimeout time.Duration
	// DCS is the etcd API Patroni uses: [DCSEtcdV3] or [DCSEtcdV2]. Default:
	// v3, except for Patroni before 3.0.3, whose v3 client can take the
	// leader key back from the node that replaced it (see [DCSEtcdV2]).
	DCS string
	// Settings are extra PostgreSQL parameters of every node.
	Settings map[string]string
	// Progress, when set, receives one line per step.
	Progress func(msg string)
}

// Cluster is one running etcd member and its Patroni nodes.
type Cluster struct {
	root     string
	scope    string
	cred     *syscall.Credential
	binDir   string
	progress func(string)
	etcd     *process
	dcs      string
	nodes    []*Node
	client   *http.Client

	closeOnce sync.Once
}

// Start starts etcd and the Patroni nodes in a new temp directory and waits
// until the first node leads and every other one streams from it.
func Start(ctx context.Context, cfg *Config) (*Cluster, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	nodes := cfg.Nodes
	if nodes == 0 {
		nodes = NodesDefault
	}
	if nodes < 2 {
		return nil, fmt.Errorf("patroni: Config.Nodes must be 2 or more, got %d", nodes)
	}
	timing := map[string]time.Duration{"TTL": cfg.TTL, "LoopWait": cfg.LoopWait, "RetryTimeout": cfg.RetryTimeout}
	defaults := map[string]time.Duration{"TTL": TTLDefault, "LoopWait": LoopWaitDefault, "RetryTimeout": RetryTimeoutDefault}
	for name, d := range timing {
		if d == 0 {
			timing[name] = defaults[name]
		} else if d < time.Second || d%time.Second != 0 {
			return nil, fmt.Errorf("patroni: Config.%s must be whole seconds, got %s", name, d)
		}
	}
	if timing["LoopWait"]+2*timing["RetryTimeout"] > timing["TTL"] {
		return nil, fmt.Errorf("patroni: Patroni needs loop_wait + 2 × retry_timeout ≤ ttl, got %s + 2 × %s > %s", timing["LoopWait"], timing["RetryTimeout"], timing["TTL"])
	}
	binDir := cfg.BinDir
	if binDir == "" {
		var err error
		if binDir, err = pgcluster.FindBinaries(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNotInstalled, err)
		}
	}
	// Patroni runs pg_controldata, pg_basebackup and pg_rewind from bin_dir:
	// the installation's own directory, not a PATH directory of links to
	// some of its programs.
	if real, err := filepath.EvalSymlinks(filepath.Join(binDir, "postgres")); err == nil {
		binDir = filepath.Dir(real)
	}
	for _, tool := range []string{"pg_controldata", "pg_basebackup", "pg_rewind"} {
		if _, err := os.Stat(filepath.Join(binDir, tool)); err != nil {
			return nil, fmt.Errorf("%w: %s is not next to postgres in %s", ErrNotInstalled, tool, binDir)
		}
	}
	patroniBin, err1 := exec.LookPath("patroni")
	etcdBin, err2 := exec.LookPath("etcd")
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotInstalled, errors.Join(err1, err2))
	}
	dcs := cfg.DCS
	switch dcs {
	case DCSEtcdV2, DCSEtcdV3:
	case "":
		dcs = DCSEtcdV3
		if v, err := version(patroniBin); err == nil && less(v, [3]int{3, 0, 3}) {
			dcs = DCSEtcdV2
		}
	default:
		return nil, fmt.Errorf("patroni: Config.DCS: %q is not %s or %s", cfg.DCS, DCSEtcdV3, DCSEtcdV2)
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	sweepStale()
	root, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	c := &Cluster{
		root: root, cred: cred, binDir: binDir, progress: cfg.Progress, dcs: dcs,
		scope:  "pgfence-" + filepath.Base(root)[len(dirPrefix):],
		client: &http.Client{},
	}
	if c.progress == nil {
		c.progress = func(string) {}
	}
	if err := os.WriteFile(filepath.Join(root, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		c.Close()
		return nil, fmt.Errorf("patroni: %w", err)
	}
	if err := c.chown(root); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.startEtcd(ctx, etcdBin); err != nil {
		c.Close()
		return nil, err
	}
	for i := range nodes {
		n, err := c.newNode(i, patroniBin, cfg, timing)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	// The first node bootstraps (initdb) and leads; the others clone it.
	if err := c.nodes[0].start(); err != nil {
		c.Close()
		return nil, err
	}
	c.progress("waiting for " + c.nodes[0].Name + " to bootstrap and lead")
	if _, err := c.WaitFor(ctx, c.nodes[0].Name+" leads", func(ms []Member) bool {
		m, ok := find(ms, c.nodes[0].Name)
		return ok && m.Role == RoleLeader && m.State == "running"
	}); err != nil {
		c.Close()
		return nil, err
	}
	for _, n := range c.nodes[1:] {
		if err := n.start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	c.progress("waiting for the replicas to stream")
	if _, err := c.WaitFor(ctx, "every replica streams", func(ms []Member) bool {
		return c.healthy(ms, cfg.SynchronousMode)
	}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// healthy reports whether ms has one running leader and every other node
// running on its timeline, one of them synchronous when sync is set.
func (c *Cluster) healthy(ms []Member, sync bool) bool {
	leader, ok := leaderOf(ms)
	if !ok || len(ms) != len(c.nodes) {
		return false
	}
	syncs := 0
	for _, m := range ms {
		if m.Name == leader.Name {
			continue
		}
		if m.State != "running" || m.Timeline != leader.Timeline || m.Lag == nil || *m.Lag > 16<<20 {
			return false
		}
		if m.Role == RoleSyncStandby {
			syncs++
		}
	}
	return !sync || syncs > 0
}

// WaitHealthy waits until one node leads and every other one streams from
// it on its timeline (with sync, one of them as the synchronous standby),
// and returns the members.
func (c *Cluster) WaitHealthy(ctx context.Context, sync bool) ([]Member, error) {
	return c.WaitFor(ctx, "one leader and every replica streaming on its timeline", func(ms []Member) bool { return c.healthy(ms, sync) })
}

func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("patroni: running as root and no postgres user to run etcd, Patroni and PostgreSQL as; create one (useradd postgres)")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

func (c *Cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
		return fmt.Errorf("patroni: %w", err)
	}
	return nil
}

// freePorts asks the kernel for n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("patroni: find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startEtcd starts the one etcd member and waits until it is healthy.
func (c *Cluster) startEtcd(ctx context.Context, bin string) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	client, peer := fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	dir := filepath.Join(c.root, "etcd")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("patroni: %w", err)
	}
	if err := c.chown(dir); err != nil {
		return err
	}
	c.progress("starting etcd on " + client + " (Patroni uses its " + map[string]string{DCSEtcdV2: "v2", DCSEtcdV3: "v3"}[c.dcs] + " API)")
	p, err := c.spawn("etcd", bin, []string{
		"--name", "etcd0", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "etcd0=" + peer, "--initial-cluster-state", "new",
		"--initial-cluster-token", c.scope, "--log-level", "warn",
		"--enable-v2=" + strconv.FormatBool(c.dcs == DCSEtcdV2),
	}, dir, filepath.Join(c.root, "etcd.log"))
	if err != nil {
		return err
	}
	c.etcd = p
	c.etcd.url = client
	deadline := time.Now().Add(waitTimeout)
	for {
		resp, err := c.client.Get(client + "/health")
		if err == nil {
			var h struct{ Health string }
			derr := json.NewDecoder(resp.Body).Decode(&h)
			resp.Body.Close()
			if derr == nil && h.Health == "true" {
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("patroni: etcd exited during startup: %s", tail(filepath.Join(c.root, "etcd.log"), 5))
		case <-ctx.Done():
			return fmt.Errorf("patroni: waiting for etcd: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("patroni: etcd not healthy after %s: %s", waitTimeout, tail(filepath.Join(c.root, "etcd.log"), 5))
		}
	}
}

// process is a child process the cluster started: etcd or a Patroni daemon.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	url    string // etcd's client URL
}

// spawn starts bin as the cluster's OS user, with its output appended to
// logPath. The child gets SIGKILL if the test process dies (its
// PostgreSQL, which outlives a killed Patroni, is swept by the next Start).
func (c *Cluster) spawn(name, bin string, args []string, dir, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "TZ=UTC", "HOME="+dir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("patroni: start %s: %w", name, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	// Recorded for the sweep of a test process that dies without Close.
	_ = os.WriteFile(filepath.Join(c.root, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
	return p, nil
}

// stop sends sig and waits up to grace for the process to exit, then kills it.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a frozen process cannot act on sig
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// version returns the version patroni --version prints.
func version(bin string) ([3]int, error) {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return [3]int{}, err
	}
	var v [3]int
	f := strings.Fields(string(out))
	if len(f) < 2 {
		return v, fmt.Errorf("patroni --version: %q", out)
	}
	for i, part := range strings.SplitN(f[len(f)-1], ".", 3) {
		if v[i], err = strconv.Atoi(strings.TrimFunc(part, func(r rune) bool { return r < '0' || r > '9' })); err != nil {
			return v, fmt.Errorf("patroni --version: %q", out)
		}
	}
	return v, nil
}

func less(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// DCS returns the etcd API Patroni uses: [DCSEtcdV3] or [DCSEtcdV2].
func (c *Cluster) DCS() string { return c.dcs }

// Nodes returns the PostgreSQL nodes in the order they were started; the
// first bootstrapped the cluster.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// ConnString returns a multi-host URL for database on every node that
// connects to whichever is the primary (target_session_attrs=read-write),
// trying each node for at most connect_timeout (2 s): a frozen node accepts
// the TCP connection and then never answers.
func (c *Cluster) ConnString(database string) string {
	hosts := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		hosts[i] = n.Addr()
	}
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		pgcluster.Superuser, strings.Join(hosts, ","), database)
}

// Close stops every Patroni node (which stops its PostgreSQL), then etcd, and
// removes the cluster's directory. PostgreSQL servers that outlive their
// Patroni (a node frozen or killed by the test) are killed.
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		var wg sync.WaitGroup
		for _, n := range c.nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.close()
			}()
		}
		wg.Wait()
		c.etcd.stop(syscall.SIGTERM, 10*time.Second)
		if os.Getenv(EnvKeep) != "" {
			c.progress("keeping " + c.root + " (" + EnvKeep + " is set)")
			_ = os.Remove(filepath.Join(c.root, "owner.pid"))
			return
		}
		_ = os.RemoveAll(c.root)
	})
}

// sweepStale removes cluster directories of test processes that died
// without Close, killing what they left running.
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		owner := readPID(filepath.Join(d, "owner.pid"))
		if owner <= 0 || syscall.Kill(owner, 0) == nil || errors.Is(syscall.Kill(owner, 0), syscall.EPERM) {
			continue // not ours, being created, or its owner lives
		}
		pids, _ := filepath.Glob(filepath.Join(d, "*.pid"))
		more, _ := filepath.Glob(filepath.Join(d, "*", "data", "postmaster.pid"))
		for _, f := range append(pids, more...) {
			if filepath.Base(f) == "owner.pid" {
				continue
			}
			if pid := readPID(f); pid > 0 && runsIn(pid, d) {
				_ = syscall.Kill(pid, syscall.SIGCONT)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(d)
	}
}

// runsIn reports whether process pid belongs to the directory dir: its
// command line names a path in dir (Patroni's configuration, etcd's and
// PostgreSQL's data directories) or it runs in dir (PostgreSQL changes to its
// data directory). A pid file outlives its process, and pids are reused
// (pid_max may be as low as 32768): a stale file must not make us signal
// somebody else's process.
func runsIn(pid int, dir string) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	proc := "/proc/" + strconv.Itoa(pid)
	if cwd, err := os.Readlink(proc + "/cwd"); err == nil && (cwd == dir || strings.HasPrefix(cwd, dir+"/")) {
		return true
	}
	cmdline, err := os.ReadFile(proc + "/cmdline")
	return err == nil && strings.Contains(string(cmdline), dir)
}

// readPID reads the pid on the first line of a pid file (0 if none).
func readPID(path string) int {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0
	}
	return pid
}

// tail returns the last n lines of a log file, on one line.
func tail(path string, n int) string {
	raw, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Logs returns the tail of every log of the cluster (etcd, each Patroni and
// each PostgreSQL), for a failure message.
func (c *Cluster) Logs(n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "etcd: %s\n", tail(filepath.Join(c.root, "etcd.log"), n))
	for _, node := range c.nodes {
		fmt.Fprintf(&b, "%s patroni: %s\n", node.Name, tail(node.patroniLog(), n))
		fmt.Fprintf(&b, "%s postgres: %s\n", node.Name, node.postgresLogTail(n))
	}
	return b.String()
}
