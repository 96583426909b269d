package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
)

// Mode is how the Redis server persists.
type Mode string

// The modes.
const (
	// Durable: appendonly yes, appendfsync always; an acknowledged lock
	// survives a crash, like a committed PostgreSQL grant.
	Durable Mode = "durable"
	// Memory: no persistence at all; a restart forgets every lock.
	Memory Mode = "memory"
)

// config returns the redis-server arguments of the mode.
func (m Mode) config() ([]string, error) {
	switch m {
	case Durable:
		return []string{"--appendonly", "yes", "--appendfsync", "always", "--save", ""}, nil
	case Memory:
		return []string{"--appendonly", "no", "--save", ""}, nil
	}
	return nil, fmt.Errorf("unknown mode %q (want durable or memory)", m)
}

// Describe says what a case of the mode does, for the bench table's legend.
func (m Mode) Describe() string {
	if m == Durable {
		return "redsync SET NX PX + compare-and-delete script, appendonly yes + appendfsync always (durable)"
	}
	return "redsync SET NX PX + compare-and-delete script, no persistence"
}

// findServer returns the redis-server binary, or "" if there is none.
func findServer() string {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
		return ""
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/bin", "/usr/sbin", "/usr/local/bin"} {
		p := filepath.Join(dir, "redis-server")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// server is a running local redis-server.
type server struct {
	cmd  *exec.Cmd
	dir  string
	addr string
	done chan error
}

// startServer starts redis-server in a temporary directory on a free port and
// waits until it answers PING.
func startServer(ctx context.Context, bin string, mode Mode) (*server, error) {
	args, err := mode.config()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgfence-benchpeer-")
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--daemonize", "no", "--protected-mode", "yes", "--logfile", filepath.Join(dir, "redis.log")}, args...)
	cmd := exec.Command(bin, args...)
	// Killed, the peer (run by `pgfence bench` with a deadline) cannot stop the
	// server itself: the kernel does, so no redis-server outlives it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &server{cmd: cmd, dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	client := redis.NewClient(&redis.Options{Addr: s.addr})
	defer client.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := client.Ping(pctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case werr := <-s.done:
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("redis-server exited (%v): %s", werr, log)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s did not answer PING: %w", s.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the server and removes its directory.
func (s *server) stop() {
	_ = s.cmd.Process.Kill()
	<-s.done
	_ = os.RemoveAll(s.dir)
}

// commandCounter counts the commands a go-redis client sends, as the pgx
// tracer counts statements on the PostgreSQL side.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// Measure starts a redis-server in mode, runs lock + unlock with redsync on
// random keys out of 100k as cfg says (its Started is Measure's own), and
// stops the server.
// Without a redis-server binary the result is marked skipped; a run that ctx
// cuts short is an error, never a result.
func Measure(ctx context.Context, mode Mode, cfg benchrun.Config) (benchrun.Result, error) {
	workers, d := max(cfg.Workers, 1), cfg.Duration
	name := "redis-" + string(mode)
	skipped := benchrun.Result{Case: name, Workers: workers, What: mode.Describe()}
	if _, err := mode.config(); err != nil {
		return benchrun.Result{}, err
	}
	bin := findServer()
	if bin == "" {
		skipped.Skipped = "redis-server not found (set REDIS_SERVER or install it, e.g. apt-get install redis-server)"
		if env := os.Getenv("REDIS_SERVER"); env != "" {
			skipped.Skipped = fmt.Sprintf("redis-server not found: REDIS_SERVER=%s does not exist", env)
		}
		return skipped, nil
	}
	srv, err := startServer(ctx, bin, mode)
	if err != nil {
		return benchrun.Result{}, err
	}
	defer srv.stop()

	client := redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: workers + 2})
	defer client.Close()
	var commands commandCounter
	client.AddHook(&commands)
	rs := redsync.New(goredis.NewPool(client))
	op := func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
		m := rs.NewMutex("bench/"+strconv.Itoa(w.Key()), redsync.WithExpiry(30*time.Second), redsync.WithTries(1))
		if err := m.LockContext(ctx); err != nil {
			var taken *redsync.ErrTaken
			if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
				return 0, benchrun.ErrHeld
			}
			return 0, err
		}
		ok, err := m.UnlockContext(ctx)
		if err == nil && !ok {
			err = errors.New("unlock: the lock was no longer ours")
		}
		return 0, err
	}
	var before int64
	cfg.Workers, cfg.Started = workers, func() { before = commands.n.Load() }
	r := benchrun.Run(ctx, op, cfg)
	if ctx.Err() != nil {
		// A run cut short would pass for a figure: none.
		return benchrun.Result{}, fmt.Errorf("interrupted after %s of %s: no result: %w", r.Elapsed.Round(100*time.Millisecond), d, context.Cause(ctx))
	}
	r.Case, r.What = name, mode.Describe()
	r.SetStatements(commands.n.Load() - before)
	return r, nil
}
