package workerproc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/internal/testkit/workerproc"
)

func TestMain(m *testing.M) {
	workerproc.Serve(map[string]workerproc.Handler{"trivial": trivial})
	goleak.VerifyTestMain(m)
}

// trivial is the worker under test.
func trivial(ctx context.Context, op string, args json.RawMessage) (any, error) {
	switch op {
	case "echo":
		var s string
		err := json.Unmarshal(args, &s)
		return s, err
	case "pid":
		return os.Getpid(), nil
	case "print":
		fmt.Println("a stray line on stdout") // must not corrupt the protocol
		return "printed", nil
	case "fail":
		return nil, &workerproc.CodedError{Code: "PF001", Err: errors.New("stale token")}
	case "panic":
		panic("boom")
	case "block":
		<-ctx.Done() // until the parent closes stdin
		return "unblocked", nil
	case "exit":
		os.Exit(3)
	}
	return nil, fmt.Errorf("unknown op %q", op)
}

func call[T any](t *testing.T, w *workerproc.Worker, op string, args any) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out T
	if err := w.Call(ctx, op, args, &out); err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	return out
}

func TestCallRoundTrip(t *testing.T) {
	w := workerproc.Start(t, "trivial", nil)
	if pid := call[int](t, w, "pid", nil); pid != w.PID() || pid == os.Getpid() {
		t.Fatalf("worker pid = %d, PID() = %d, test pid = %d", pid, w.PID(), os.Getpid())
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := fmt.Sprint("msg-", i)
			var got string
			if err := w.Call(context.Background(), "echo", want, &got); err != nil || got != want {
				t.Errorf("echo %q = %q, %v", want, got, err)
			}
		}()
	}
	wg.Wait()
	if got := call[string](t, w, "print", nil); got != "printed" {
		t.Fatalf("print = %q", got)
	}
	// stderr is copied asynchronously: wait for it, boundedly.
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(w.Stderr(), "a stray line on stdout") {
		if time.Now().After(deadline) {
			t.Fatalf("stderr = %q, want the stray stdout line", w.Stderr())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRemoteErrors(t *testing.T) {
	w := workerproc.Start(t, "trivial", nil)
	err := w.Call(context.Background(), "fail", nil, nil)
	var re *workerproc.RemoteError
	if !errors.As(err, &re) || re.Code != "PF001" || re.Op != "fail" {
		t.Fatalf("fail: %v, want a RemoteError with code PF001", err)
	}
	if err := w.Call(context.Background(), "panic", nil, nil); !errors.As(err, &re) || !strings.Contains(re.Message, "boom") {
		t.Fatalf("panic: %v", err)
	}
	// A panicking handler does not take the worker down.
	if got := call[string](t, w, "echo", "still here"); got != "still here" {
		t.Fatal(got)
	}
}

// processState reads the state letter of pid from /proc (R, S, T for stopped...).
func processState(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	return s[strings.LastIndexByte(s, ')')+2]
}

func TestStopCont(t *testing.T) {
	w := workerproc.Start(t, "trivial", nil)
	call[string](t, w, "echo", "warm up")
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for processState(t, w.PID()) != 'T' {
		if time.Now().After(deadline) {
			t.Fatalf("worker state %c, want T (stopped)", processState(t, w.PID()))
		}
		time.Sleep(time.Millisecond)
	}
	// A call to a stopped worker returns by its deadline, unanswered.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	late := w.Go("echo", "late")
	if err := late.Wait(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call to a stopped worker: %v, want deadline exceeded", err)
	}
	if err := w.Cont(); err != nil {
		t.Fatal(err)
	}
	// It resumes and serves again; the late request was still executed.
	if got := call[string](t, w, "echo", "resumed"); got != "resumed" {
		t.Fatal(got)
	}
}

func TestKill(t *testing.T) {
	w := workerproc.Start(t, "trivial", nil)
	call[string](t, w, "echo", "x")
	if err := w.Stop(); err != nil { // SIGKILL ends a stopped process too
		t.Fatal(err)
	}
	inFlight := w.Go("block", nil)
	if err := w.Kill(); err != nil {
		t.Fatal(err)
	}
	if sig := w.Signaled(); sig != syscall.SIGKILL {
		t.Fatalf("worker ended by %v, want SIGKILL", sig)
	}
	if err := inFlight.Wait(context.Background(), nil); !errors.Is(err, workerproc.ErrExited) {
		t.Fatalf("call in flight at kill: %v, want ErrExited", err)
	}
	if err := w.Call(context.Background(), "echo", "y", nil); !errors.Is(err, workerproc.ErrExited) {
		t.Fatalf("call after kill: %v, want ErrExited", err)
	}
	if err := w.Stop(); !errors.Is(err, workerproc.ErrExited) {
		t.Fatalf("Stop after kill: %v", err)
	}
	if err := w.Kill(); err != nil {
		t.Fatalf("second Kill: %v", err)
	}
}

func TestExitOnItsOwn(t *testing.T) {
	w := workerproc.Start(t, "trivial", nil)
	err := w.Call(context.Background(), "exit", nil, nil)
	if !errors.Is(err, workerproc.ErrExited) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("exit: %v", err)
	}
}

func TestCloseIsGraceful(t *testing.T) {
	w := workerproc.Start(t, "trivial", nil)
	blocked := w.Go("block", nil)
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	// Close resumes a stopped worker, ends the handlers' context and waits.
	if err := w.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	var got string
	if err := blocked.Wait(context.Background(), &got); err != nil || got != "unblocked" {
		t.Fatalf("blocked call = %q, %v; want its handler to see the context end", got, err)
	}
	if w.Signaled() != 0 {
		t.Fatalf("worker was signaled: %v", w.Signaled())
	}
}

func TestUnknownKind(t *testing.T) {
	w := workerproc.Start(t, "no-such-kind", nil)
	if err := w.Wait(); err == nil {
		t.Fatal("a worker of an unknown kind exited 0")
	}
	if !strings.Contains(w.Stderr(), `no handler for worker kind "no-such-kind"`) {
		t.Fatalf("stderr = %q", w.Stderr())
	}
}
