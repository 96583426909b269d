package workerproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// EnvKind names the environment variable that makes the test binary a worker:
// its value is the kind of worker, a key of the map given to [Serve].
const EnvKind = "PGFENCE_WORKERPROC_KIND"

// Request is one command, one JSON line on the worker's stdin.
type Request struct {
	ID   uint64          `json:"id"`
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
}

// Response answers one [Request], one JSON line on the worker's stdout.
type Response struct {
	ID     uint64          `json:"id"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	Code   string          `json:"code,omitempty"`
}

// Handler serves one command in a worker. ctx ends when the parent closes the
// worker's stdin (or dies). The result is encoded as JSON.
type Handler func(ctx context.Context, op string, args json.RawMessage) (any, error)

// CodedError is an error with a machine-readable code, which reaches the
// parent as [RemoteError.Code].
type CodedError struct {
	Code string
	Err  error
}

func (e *CodedError) Error() string { return e.Code + ": " + e.Err.Error() }
func (e *CodedError) Unwrap() error { return e.Err }

// Serve makes this process a worker if it was started by [Start]: it runs the
// handler registered for the worker's kind on every request read from stdin,
// each in its own goroutine, writes the responses to stdout and exits when
// stdin closes. In any other process it returns at once. Call it first thing in
// TestMain.
func Serve(kinds map[string]Handler) {
	kind, ok := os.LookupEnv(EnvKind)
	if !ok {
		return
	}
	h := kinds[kind]
	if h == nil {
		fmt.Fprintf(os.Stderr, "workerproc: no handler for worker kind %q\n", kind)
		os.Exit(2)
	}
	out := os.Stdout
	os.Stdout = os.Stderr // stray prints must not corrupt the protocol
	if err := serve(h, os.Stdin, out); err != nil {
		fmt.Fprintf(os.Stderr, "workerproc: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serve(h Handler, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu sync.Mutex // serializes response lines
		wg sync.WaitGroup
	)
	enc := json.NewEncoder(out)
	reply := func(r Response) {
		mu.Lock()
		defer mu.Unlock()
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(os.Stderr, "workerproc: write response: %v\n", err)
		}
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var req Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			return fmt.Errorf("bad request line %q: %w", sc.Text(), err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			reply(handle(ctx, h, req))
		}()
	}
	cancel() // the parent is gone or done: stop the handlers
	wg.Wait()
	return sc.Err()
}

func handle(ctx context.Context, h Handler, req Request) (resp Response) {
	resp.ID = req.ID
	defer func() {
		if p := recover(); p != nil {
			resp.Result, resp.Error = nil, fmt.Sprintf("panic: %v", p)
		}
	}()
	result, err := h(ctx, req.Op, req.Args)
	if err != nil {
		resp.Error = err.Error()
		var coded *CodedError
		if errors.As(err, &coded) {
			resp.Code = coded.Code
		}
		return resp
	}
	b, err := json.Marshal(result)
	if err != nil {
		resp.Error = fmt.Sprintf("encode result of %s: %v", req.Op, err)
		return resp
	}
	resp.Result = b
	return resp
}
