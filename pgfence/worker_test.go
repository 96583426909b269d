package pgfence_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/pgfence"
)

// Worker processes: the test binary re-executed with workerEnv set runs
// workerMain instead of the tests. It reads one command per line on stdin and
// answers one line on stdout, so a test can freeze it (SIGSTOP) between two
// commands exactly as a GC pause or a frozen container would.
const (
	workerEnv    = "PGFENCE_FENCE_WORKER"
	workerURLEnv = "PGFENCE_FENCE_WORKER_URL"
)

// workerMain serves commands:
//
//	grant KEY             -> "token N": take lease KEY (30 s) with a fresh holder id
//	write RES TOKEN BODY  -> fenced write of doc RES through pgfence.Write
//	lwrite BODY           -> lease-checked write of doc KEY with the lease held
//	raw RES BODY          -> plain UPDATE, no token at all
//	spoof RES TOKEN BODY  -> plain UPDATE after setting look-alike session settings
//	exit
//
// Write results: "ok", "stale PRESENTED ACCEPTED", "lease REASON",
// "unfenced", "err MESSAGE".
func workerMain() int {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv(workerURLEnv))
	if err != nil {
		fmt.Println("err connect:", err)
		return 1
	}
	defer conn.Close(ctx)
	var lease leaseRow
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.SplitN(in.Text(), " ", 4)
		var err error
		switch f[0] {
		case "exit":
			return 0
		case "grant":
			lease = leaseRow{Key: f[1], Holder: newHolder()}
			err = conn.QueryRow(ctx, grantSQL, lease.Key, lease.Holder, "30 seconds").Scan(&lease.Token)
			if err == nil {
				fmt.Println("token", lease.Token)
				continue
			}
		case "write":
			token, _ := strconv.ParseInt(f[2], 10, 64)
			_, err = pgfence.Write(ctx, conn, pgfence.LeaseOf(f[1], "", token), func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE doc SET body = $2, token = $3 WHERE resource = $1`, f[1], f[3], token)
				return err
			})
		case "lwrite":
			_, err = pgfence.Exec(ctx, conn, pgfence.Checked(lease.lease()), `UPDATE doc SET body = $2 WHERE resource = $1`, lease.Key, f[1])
		case "raw":
			_, err = conn.Exec(ctx, `UPDATE doc SET body = $2 WHERE resource = $1`, f[1], f[2])
			err = pgfence.MapError(err)
		case "spoof":
			// A client that imitates what it guesses the protocol to be: a
			// session "token" setting and a stale token; no pgfence.fence call.
			_, err = pgfence.Write(ctx, conn, pgfence.LeaseOf("unrelated", "", 1), func(ctx context.Context, tx pgx.Tx) error {
				for _, q := range []string{
					`SELECT set_config('pgfence.token', $1, true), $2::text`,
					`SELECT set_config('pgfence.token_' || md5($2), $1, true)`,
				} {
					if _, err := tx.Exec(ctx, q, f[2], f[1]); err != nil {
						return err
					}
				}
				_, err := tx.Exec(ctx, `UPDATE doc SET body = $2 WHERE resource = $1`, f[1], f[3])
				return err
			})
		default:
			err = fmt.Errorf("unknown command %q", f[0])
		}
		var stale *pgfence.StaleTokenError
		var lost *pgfence.LeaseLostError
		switch {
		case err == nil:
			fmt.Println("ok")
		case errors.As(err, &stale):
			fmt.Println("stale", stale.Presented, stale.Accepted)
		case errors.As(err, &lost):
			fmt.Println("lease", lost.Reason)
		case errors.Is(err, pgfence.ErrUnfencedWrite):
			fmt.Println("unfenced")
		default:
			fmt.Println("err", strings.ReplaceAll(err.Error(), "\n", " "))
		}
	}
	return 0
}

// worker is a running worker process.
type worker struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	name string
}

func startWorker(t *testing.T, name, url string) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"=1", workerURLEnv+"="+url)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out), name: name}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(sigCont)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return w
}

// send writes one command without waiting for the answer.
func (w *worker) send(cmd string) {
	w.t.Helper()
	if _, err := fmt.Fprintln(w.in, cmd); err != nil {
		w.t.Fatalf("worker %s: %v", w.name, err)
	}
}

// recv waits (bounded) for one answer line.
func (w *worker) recv() string {
	w.t.Helper()
	line := make(chan string, 1)
	go func() {
		if w.out.Scan() {
			line <- w.out.Text()
		}
		close(line)
	}()
	select {
	case l, ok := <-line:
		if !ok {
			w.t.Fatalf("worker %s exited", w.name)
		}
		return l
	case <-time.After(30 * time.Second):
		w.t.Fatalf("worker %s: no answer within 30s", w.name)
		return ""
	}
}

func (w *worker) do(cmd string) string {
	w.t.Helper()
	w.send(cmd)
	return w.recv()
}

// processState returns the state letter of pid from /proc (T = stopped).
func processState(pid int) string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "?"
	}
	s := string(raw)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return "?"
}
