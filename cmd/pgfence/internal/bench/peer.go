package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
)

// The Redis peer is a separate program, pgfence-benchpeer, built from the
// nested Go module cmd/pgfence/internal/benchpeer so that pgfence users never inherit its
// Redis dependencies. The bench runs it once per mode and concurrency; it
// starts its own redis-server and prints one benchrun.Result as JSON.
const (
	// PeerBinary is the peer program's name on PATH.
	PeerBinary = "pgfence-benchpeer"
	// PeerDir is the peer's source, from the root of a pgfence checkout.
	PeerDir = "cmd/pgfence/internal/benchpeer"
	// PeerEnv names the peer binary to use instead of searching for it.
	PeerEnv = "PGFENCE_BENCHPEER"
	// peerGrace is the time a peer gets beyond the run's duration: starting
	// redis-server (the peer waits at most 10s for it), the warm-up, stopping.
	peerGrace = time.Minute
	// peerBuildTimeout bounds building the peer from source.
	peerBuildTimeout = 5 * time.Minute
)

// peerRunner finds (or builds) the peer binary on first use.
type peerRunner struct {
	progress io.Writer
	getenv   func(string) string
	resolved bool
	bin      string
	missing  string // why there is no peer: its cases are reported as skipped
	tmp      string
	grace    time.Duration // a run's time beyond its duration; 0: peerGrace
}

func (p *peerRunner) close() {
	if p.tmp != "" {
		_ = os.RemoveAll(p.tmp)
	}
}

// resolve looks for the peer: $PGFENCE_BENCHPEER, then pgfence-benchpeer on
// PATH, then a source checkout around the working directory, built with
// `go build`.
func (p *peerRunner) resolve(ctx context.Context) {
	if p.resolved {
		return
	}
	p.resolved = true
	getenv := p.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if v := getenv(PeerEnv); v != "" {
		if _, err := os.Stat(v); err != nil {
			p.missing = fmt.Sprintf("%s=%s: %v", PeerEnv, v, err)
			return
		}
		p.bin = v
		return
	}
	if bin, err := exec.LookPath(PeerBinary); err == nil {
		p.bin = bin
		return
	}
	src := findPeerSource()
	goBin, err := exec.LookPath("go")
	if src == "" || err != nil {
		p.missing = fmt.Sprintf("the Redis peer is not available: put %s on PATH (cd %s && go build -o ~/go/bin/%s .) or run from a pgfence source checkout with Go installed", PeerBinary, PeerDir, PeerBinary)
		return
	}
	if p.tmp, err = os.MkdirTemp("", "pgfence-bench-"); err != nil {
		p.missing = err.Error()
		return
	}
	bin := filepath.Join(p.tmp, PeerBinary)
	fmt.Fprintf(p.progress, "  building the Redis peer: go build in %s\n", src)
	// The first build may download the peer's modules: bounded all the same.
	bctx, cancel := context.WithTimeout(ctx, peerBuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(bctx, goBin, "build", "-o", bin, ".")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		if bctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("not done within %s", peerBuildTimeout)
		}
		p.missing = fmt.Sprintf("building the Redis peer in %s failed: %v: %s", src, err, oneLine(string(out)))
		return
	}
	p.bin = bin
}

// findPeerSource returns cmd/pgfence/internal/benchpeer of the source checkout that holds
// the working directory, or "".
func findPeerSource() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		src := filepath.Join(dir, PeerDir)
		if _, err := os.Stat(filepath.Join(src, "go.mod")); err == nil {
			return src
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// measure runs the peer in mode with n workers as t says. A missing peer, or one
// that fails, gives a skipped result saying why: never a figure.
func (p *peerRunner) measure(ctx context.Context, mode string, n int, t Timing) (benchrun.Result, error) {
	p.resolve(ctx)
	if p.missing != "" {
		return benchrun.Result{Workers: n, Skipped: p.missing}, nil
	}
	grace := cmp.Or(p.grace, peerGrace)
	limit := t.total() + grace
	pctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(pctx, p.bin, "-mode", mode, "-workers", strconv.Itoa(n), "-duration", t.Duration.String(), "-warmup", t.Warmup.String())
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Interrupted, the peer stops its redis-server and removes its directory;
	// one that does not exit within WaitDelay is killed (its server dies with it).
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	switch {
	case ctx.Err() != nil:
		return benchrun.Result{}, ctx.Err()
	case pctx.Err() != nil:
		return benchrun.Result{Workers: n, Skipped: fmt.Sprintf("the Redis peer did not finish within %s (the run's duration + %s)", limit, grace)}, nil
	case err != nil:
		return benchrun.Result{Workers: n, Skipped: fmt.Sprintf("the Redis peer failed: %v: %s", err, oneLine(stderr.String()))}, nil
	}
	var r benchrun.Result
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		return benchrun.Result{Workers: n, Skipped: fmt.Sprintf("the Redis peer printed no result: %v", err)}, nil
	}
	return r, nil
}
