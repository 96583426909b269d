// Package workerproc runs test workers as separate OS processes, so a fault
// test can pause (SIGSTOP), resume (SIGCONT) and kill (SIGKILL) a lease holder
// the way a GC pause, a frozen container or the OOM killer would, which no
// goroutine can simulate.
//
// A worker is the current test binary started again with an environment
// variable ([EnvKind]) naming the kind of worker. The test package's TestMain
// hands control to [Serve] before anything else:
//
//	func TestMain(m *testing.M) {
//		workerproc.Serve(map[string]workerproc.Handler{"holder": holder})
//		pgfencetest.Main(m)
//	}
//
// [Serve] returns at once in the test process itself; in a worker it serves
// commands and exits. The parent talks to the worker with line-delimited JSON
// over the worker's stdin and stdout: one [Request] per line in, one
// [Response] per line out, matched by id, so several calls may be in flight.
// Anything the worker writes to os.Stdout goes to its stderr instead, which the
// parent keeps (the last [StderrLimit] bytes, see [Worker.Stderr]) and logs if
// the test fails.
//
// # Guarantees
//
//   - [Start] registers a cleanup that kills the worker (SIGKILL, which also
//     ends a stopped process) and waits for it and for every goroutine the
//     parent side started; a worker also gets SIGKILL when the parent dies
//     (Linux parent-death signal), so none outlives the test binary.
//   - [Worker.Call] returns by its context's deadline whatever the worker does
//     (stopped, killed, hung); a reply that arrives later is discarded.
//   - When the worker process ends, every call in flight and every later call
//     fails with an error wrapping [ErrExited].
//
// # Failure handling
//
// A handler's error reaches the parent as a [*RemoteError] carrying its text
// and an optional code (a handler returns a [*CodedError] to set it), so tests
// can tell expected outcomes (a stale token) from failures without matching
// strings. A call whose context ends first returns the context's error: its
// effect in the worker is unknown, exactly as with a database call.
package workerproc
