package workerproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ErrExited is wrapped by the errors of calls to a worker whose process ended.
var ErrExited = errors.New("workerproc: worker process exited")

// StderrLimit is how many trailing bytes of a worker's stderr are kept.
const StderrLimit = 64 << 10

// CloseTimeoutDefault is how long [Worker.Close] waits for a worker to finish
// its calls and exit before it kills it.
const CloseTimeoutDefault = 5 * time.Second

// Config configures [Start]. A nil *Config uses the defaults.
type Config struct {
	// Env is added to the worker's environment (KEY=value), after the
	// parent's own.
	Env []string
	// CloseTimeout bounds [Worker.Close]. Default [CloseTimeoutDefault].
	CloseTimeout time.Duration
}

// RemoteError is a handler's error, as the parent receives it.
type RemoteError struct {
	Kind, Op string
	Message  string
	// Code is the [CodedError.Code] the handler returned, or "".
	Code string
}

func (e *RemoteError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("worker %s: %s: [%s] %s", e.Kind, e.Op, e.Code, e.Message)
	}
	return fmt.Sprintf("worker %s: %s: %s", e.Kind, e.Op, e.Message)
}

// Worker is a running worker process. Its methods are safe for concurrent use.
type Worker struct {
	kind         string
	cmd          *exec.Cmd
	closeTimeout time.Duration

	writeMu sync.Mutex
	stdin   io.WriteCloser

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan Response

	exited  chan struct{} // closed once the process is reaped
	exitErr error         // set before exited is closed
	stderr  *tail
	done    chan struct{} // closed when the reader goroutine returns
}

// Start starts a worker of the given kind (a key of the map its TestMain
// passes to [Serve]) from the current test binary. The worker is killed and
// reaped when t ends.
func Start(t testing.TB, kind string, cfg *Config) *Worker {
	t.Helper()
	w, err := start(kind, cfg)
	if err != nil {
		t.Fatalf("workerproc: start %s: %v", kind, err)
	}
	t.Cleanup(func() {
		_ = w.Kill()
		<-w.done
		if t.Failed() {
			if s := w.Stderr(); s != "" {
				t.Logf("worker %s (pid %d) stderr:\n%s", kind, w.PID(), s)
			}
		}
	})
	return w
}

func start(kind string, cfg *Config) (*Worker, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.CloseTimeout < 0 {
		return nil, fmt.Errorf("workerproc: Config.CloseTimeout must not be negative, got %v", c.CloseTimeout)
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = CloseTimeoutDefault
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	// -test.run=^$: a test binary whose TestMain forgot Serve runs no test and
	// prints a line that is not JSON, which the parent reports.
	cmd := exec.Command(exe, "-test.run=^$")
	// A -race binary sleeps 1s at exit to let goroutines report; a worker's
	// exit should be prompt.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(append(os.Environ(), EnvKind+"="+kind, "GORACE="+gorace), c.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	w := &Worker{
		kind:         kind,
		cmd:          cmd,
		closeTimeout: c.CloseTimeout,
		pending:      make(map[uint64]chan Response),
		exited:       make(chan struct{}),
		stderr:       &tail{limit: StderrLimit},
		done:         make(chan struct{}),
	}
	cmd.Stderr = w.stderr
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go w.read(stdout)
	return w, nil
}

// read dispatches response lines until the worker's stdout closes, then reaps
// the process.
func (w *Worker) read(stdout io.Reader) {
	defer close(w.done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var protoErr error
	for sc.Scan() {
		var r Response
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			protoErr = fmt.Errorf("workerproc: worker %s wrote %q, not a response (does its TestMain call workerproc.Serve?)", w.kind, sc.Text())
			_ = w.cmd.Process.Kill()
			break
		}
		w.mu.Lock()
		ch := w.pending[r.ID]
		delete(w.pending, r.ID)
		w.mu.Unlock()
		if ch != nil {
			ch <- r // buffered; nobody waits for a late reply
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	err := w.cmd.Wait()
	if protoErr != nil {
		err = protoErr
	}
	w.exitErr = err
	close(w.exited)
}

// Kind is the worker's kind.
func (w *Worker) Kind() string { return w.kind }

// PID is the worker's process id.
func (w *Worker) PID() int { return w.cmd.Process.Pid }

// Pending is a call in flight, returned by [Worker.Go].
type Pending struct {
	w  *Worker
	op string
	id uint64
	ch chan Response
	// err is set when the request could not be sent.
	err error
}

// Go sends a command without waiting for its response.
func (w *Worker) Go(op string, args any) *Pending {
	p := &Pending{w: w, op: op, ch: make(chan Response, 1)}
	raw, err := json.Marshal(args)
	if err != nil {
		p.err = fmt.Errorf("workerproc: encode %s args: %w", op, err)
		return p
	}
	select {
	case <-w.exited:
		p.err = w.exitError()
		return p
	default:
	}
	w.mu.Lock()
	w.nextID++
	p.id = w.nextID
	w.pending[p.id] = p.ch
	w.mu.Unlock()
	line, _ := json.Marshal(Request{ID: p.id, Op: op, Args: raw})
	w.writeMu.Lock()
	_, err = w.stdin.Write(append(line, '\n'))
	w.writeMu.Unlock()
	if err != nil {
		w.forget(p.id)
		p.err = fmt.Errorf("%w (%s: %v)", w.exitError(), op, err)
	}
	return p
}

func (w *Worker) forget(id uint64) {
	w.mu.Lock()
	delete(w.pending, id)
	w.mu.Unlock()
}

// Wait waits for the response and decodes its result into result (which may
// be nil). It returns ctx's error if ctx ends first, a [*RemoteError] if the
// handler failed, and an error wrapping [ErrExited] if the worker ended.
func (p *Pending) Wait(ctx context.Context, result any) error {
	if p.err != nil {
		return p.err
	}
	var r Response
	select {
	case r = <-p.ch:
	case <-ctx.Done():
		p.w.forget(p.id)
		return ctx.Err()
	case <-p.w.exited:
		select {
		case r = <-p.ch: // answered just before it exited
		default:
			return fmt.Errorf("%w (during %s)", p.w.exitError(), p.op)
		}
	}
	if r.Error != "" {
		return &RemoteError{Kind: p.w.kind, Op: p.op, Message: r.Error, Code: r.Code}
	}
	if result != nil && len(r.Result) > 0 {
		if err := json.Unmarshal(r.Result, result); err != nil {
			return fmt.Errorf("workerproc: decode %s result: %w", p.op, err)
		}
	}
	return nil
}

// Call sends a command and waits for its response: [Worker.Go] then
// [Pending.Wait].
func (w *Worker) Call(ctx context.Context, op string, args, result any) error {
	return w.Go(op, args).Wait(ctx, result)
}

func (w *Worker) signal(sig syscall.Signal) error {
	select {
	case <-w.exited:
		return w.exitError()
	default:
	}
	if err := w.cmd.Process.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return w.exitError()
		}
		return fmt.Errorf("workerproc: %v to worker %s: %w", sig, w.kind, err)
	}
	return nil
}

// Stop pauses the worker with SIGSTOP: it runs no code, sends nothing and
// answers nothing until [Worker.Cont]; its sockets stay open.
func (w *Worker) Stop() error { return w.signal(syscall.SIGSTOP) }

// Cont resumes a stopped worker with SIGCONT.
func (w *Worker) Cont() error { return w.signal(syscall.SIGCONT) }

// Kill ends the worker with SIGKILL (stopped or not) and waits until it is
// reaped. Killing an exited worker does nothing.
func (w *Worker) Kill() error {
	if err := w.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("workerproc: kill worker %s: %w", w.kind, err)
	}
	<-w.exited
	return nil
}

// Close asks the worker to exit by closing its stdin (the handlers' context
// ends) and waits for it; a worker that is still running after the
// [Config.CloseTimeout] is killed. It returns the process's exit error.
func (w *Worker) Close() error {
	w.writeMu.Lock()
	_ = w.stdin.Close()
	w.writeMu.Unlock()
	_ = w.signal(syscall.SIGCONT) // a stopped worker cannot exit
	timer := time.NewTimer(w.closeTimeout)
	defer timer.Stop()
	select {
	case <-w.exited:
	case <-timer.C:
		_ = w.Kill()
	}
	return w.Wait()
}

// Wait waits for the worker process to end and returns its exit error (nil
// for exit status 0; an [*exec.ExitError] for a signal or another status).
func (w *Worker) Wait() error {
	<-w.exited
	return w.exitErr
}

// Exited is closed when the worker process has ended and been reaped.
func (w *Worker) Exited() <-chan struct{} { return w.exited }

// Signaled returns the signal that ended the worker, or 0 if it exited by
// itself or is still running.
func (w *Worker) Signaled() syscall.Signal {
	select {
	case <-w.exited:
	default:
		return 0
	}
	if ws, ok := w.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	return 0
}

// Stderr returns the last [StderrLimit] bytes the worker wrote to stderr (and
// stdout, which Serve redirects there).
func (w *Worker) Stderr() string { return w.stderr.String() }

func (w *Worker) exitError() error {
	select {
	case <-w.exited:
		if w.exitErr != nil {
			return fmt.Errorf("%w: %s: %v", ErrExited, w.kind, w.exitErr)
		}
	default:
	}
	return fmt.Errorf("%w: %s", ErrExited, w.kind)
}

// tail keeps the last limit bytes written to it.
type tail struct {
	mu    sync.Mutex
	limit int
	buf   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.limit; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
