package demo

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// WorkerCommand is the hidden command that runs worker A: the demo starts its
// own executable with it, and the executable's main passes the rest of the
// command line to [Worker].
const WorkerCommand = "demo-worker"

// workerURLEnv carries the database URL to worker A, out of its command line
// (and so out of ps).
const workerURLEnv = "PGFENCE_DEMO_WORKER_URL"

// worker is worker A, a child process running `pgfence demo-worker`.
type worker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// workerLine is one JSON line from worker A.
type workerLine struct {
	Result string `json:"result"`
	Token  int64  `json:"token,omitempty"`
	Holder string `json:"holder,omitempty"`
	Code   string `json:"code,omitempty"`
	Detail string `json:"detail,omitempty"`
}

func startWorker(ctx context.Context, url string, ttl time.Duration, sku string) (*worker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("demo: find own executable for worker A: %w", err)
	}
	cmd := exec.CommandContext(ctx, exe, WorkerCommand, "--ttl", ttl.String(), "--sku", sku)
	cmd.Env = append(os.Environ(), workerURLEnv+"="+url)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("demo: start worker A: %w", err)
	}
	return &worker{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}, nil
}

func (w *worker) next() (workerLine, error) {
	var l workerLine
	if !w.out.Scan() {
		return l, fmt.Errorf("demo: worker A stopped talking: %v", w.out.Err())
	}
	if err := json.Unmarshal(w.out.Bytes(), &l); err != nil {
		return l, fmt.Errorf("demo: worker A said %q: %w", w.out.Text(), err)
	}
	return l, nil
}

func (w *worker) send(cmd string) error {
	_, err := fmt.Fprintln(w.stdin, cmd)
	return err
}

func (w *worker) wait() error {
	w.stdin.Close()
	return w.cmd.Wait()
}

func (w *worker) kill() {
	if w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	}
}

// demoRunID returns 8 random hex digits that name one run of the demo.
func demoRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Worker is worker A's side, run in the child process with the arguments
// after [WorkerCommand]: take the lease, say so on stdout, wait for "write"
// on stdin (the parent freezes and resumes us meanwhile), then write as if
// the lease were still ours: through the fence, through plain SQL, then
// release. getenv looks up the database URL the parent passed.
func Worker(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet(WorkerCommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ttl := fs.Duration("ttl", time.Second, "lease TTL")
	sku := fs.String("sku", demoSKU, "the stock row; the lease key and resource are "+demoPrefix+"SKU")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s: %w", WorkerCommand, err)
	}
	key := demoPrefix + *sku
	url := getenv(workerURLEnv)
	say := func(l workerLine) { _ = json.NewEncoder(stdout).Encode(l) }
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		say(workerLine{Result: "error", Detail: err.Error()})
		return err
	}
	defer pool.Close()
	client, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		say(workerLine{Result: "error", Detail: err.Error()})
		return err
	}
	defer client.Close()
	l, err := client.TryAcquire(ctx, key, *ttl, &leases.AcquireOptions{HolderInfo: "demo worker A"})
	if err != nil {
		say(workerLine{Result: "error", Detail: err.Error()})
		return err
	}
	say(workerLine{Result: "ok", Token: l.Token(), Holder: l.Holder()})

	in := bufio.NewScanner(stdin)
	if !in.Scan() || in.Text() != "write" {
		return fmt.Errorf("%s: expected \"write\" on stdin", WorkerCommand)
	}
	// A does not look at its lease: the point is that it does not have to.
	_, err = pgfence.Exec(ctx, pool, l,
		`UPDATE pgfence_demo.stock SET quantity = quantity - 1, last_token = $2, last_writer = 'A' WHERE sku = $1`, *sku, l.Token())
	say(outcomeLine(err))
	_, err = pool.Exec(ctx, `UPDATE pgfence_demo.stock SET quantity = quantity - 1, last_token = $2, last_writer = 'A (plain SQL)' WHERE sku = $1`, *sku, l.Token())
	say(outcomeLine(err))
	err = l.Release(ctx)
	switch {
	case err == nil:
		say(workerLine{Result: "released"})
	case errors.Is(err, pgfence.ErrLeaseLost):
		say(workerLine{Result: "lost", Detail: "changes nothing: " + err.Error()})
	default:
		say(workerLine{Result: "error", Detail: err.Error()})
	}
	return nil
}

func outcomeLine(err error) workerLine {
	if err == nil {
		return workerLine{Result: "accepted"}
	}
	if code := pgerr.Code(err); code != "" {
		msg := err.Error()
		if pe := pgerr.PgError(err); pe != nil {
			msg = pe.Message
		}
		return workerLine{Result: "rejected", Code: code, Detail: code + ": " + msg}
	}
	return workerLine{Result: "error", Detail: err.Error()}
}
