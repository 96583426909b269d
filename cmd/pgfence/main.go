// Command pgfence installs and operates pgfence: migrations, inspection of
// leases, fences and idempotency keys, a live demo of the guarantees, and
// health checks.
//
// Usage:
//
//	pgfence <command> [flags]
//
// Run `pgfence help` for the list of commands and exit codes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/demo"
)

// Exit codes, documented in `pgfence help`.
const (
	exitOK          = 0 // success
	exitFailure     = 1 // the command ran and failed (or a guarantee did not hold)
	exitUsage       = 2 // bad flags or arguments
	exitUnavailable = 3 // the database could not be reached
	exitSchema      = 4 // the pgfence schema is missing, outdated or newer than this binary
)

// env is what a command sees of the outside world; tests replace it.
type env struct {
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
}

// command is one top-level subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e *env, args []string) error
}

// commands lists every subcommand; each lives in a file named after it.
func commands() []command {
	return []command{
		{name: "migrate", summary: "install or upgrade the pgfence schema: up, down, status, sql", run: runMigrate},
		{name: "leases", summary: "inspect leases and their grant history; force-release a stuck grant", run: runLeases},
		{name: "fences", summary: "show fenced resources, their accepted tokens, protected tables and the token floor", run: runFences},
		{name: "protect", summary: "guard a table with a trigger: every write must present a current token", run: runProtect},
		{name: "unprotect", summary: "remove the guard trigger from a table", run: runUnprotect},
		{name: "floor", summary: "show or raise the token floor (after a restore or schema rebuild)", run: runFloor},
		{name: "keys", summary: "idempotency keys: gc deletes expired results in batches, show inspects keys", run: runKeys},
		{name: "demo", summary: "watch the database reject a paused lock holder's late write (embedded database by default)", run: runDemo},
		{name: "bench", summary: "measure leases, fenced writes and idempotency against raw SQL, advisory locks and Redis; cost curves", run: runBench},
		{name: "doctor", summary: "check a database: schema, durability, timeouts, pooler, expired leases, unprotected tables", run: runDoctor},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv})
	stop()
	os.Exit(code)
}

// run executes one command line and returns the process exit code.
func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		// A usage error: the help goes where errors go, not into a pipe.
		usage(e.stderr)
		return exitUsage
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(e.stdout)
		return exitOK
	}
	if args[0] == demo.WorkerCommand { // the demo's worker A, a child process
		return report(e.stderr, demo.Worker(ctx, args[1:], os.Stdin, e.stdout, e.getenv))
	}
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(ctx, e, args[1:])
			return report(e.stderr, err)
		}
	}
	fmt.Fprintf(e.stderr, "pgfence: unknown command %q\nhint: run `pgfence help` for the list of commands\n", args[0])
	return exitUsage
}

func usage(w io.Writer) {
	cs := commands()
	sort.Slice(cs, func(i, j int) bool { return cs[i].name < cs[j].name })
	fmt.Fprintln(w, "pgfence: leases, fencing tokens and idempotency keys in PostgreSQL")
	fmt.Fprintln(w, "\nUsage: pgfence <command> [flags]   (pgfence <command> -h for its flags)")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range cs {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nThe database comes from --database-url or DATABASE_URL (a postgres:// URL or key=value string).")
	fmt.Fprintln(w, "\nExit codes:")
	fmt.Fprintln(w, "  0  success")
	fmt.Fprintln(w, "  1  the command failed (for demo and doctor: a check did not hold)")
	fmt.Fprintln(w, "  2  bad flags or arguments")
	fmt.Fprintln(w, "  3  the database could not be reached")
	fmt.Fprintln(w, "  4  the pgfence schema is missing, outdated, or newer than this binary")
}

// cliError is an error with a hint and an exit code, printed as two lines.
type cliError struct {
	msg  string
	hint string
	code int
	err  error
}

func (e *cliError) Error() string { return e.msg }
func (e *cliError) Unwrap() error { return e.err }

func usageError(format string, args ...any) error {
	return &cliError{msg: fmt.Sprintf(format, args...), hint: "run the command with -h for its flags", code: exitUsage}
}

// report prints err (if any) as one line plus a hint and returns the exit code.
func report(w io.Writer, err error) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var ce *cliError
	if !errors.As(err, &ce) {
		ce = &cliError{msg: err.Error(), code: exitFailure}
	}
	// The library's errors start with their package's name; "pgfence:
	// pgfence: ..." says nothing twice.
	msg := strings.TrimPrefix(oneLine(redact(ce.msg)), "pgfence: ") // redact: the last line of defence for a connection string
	fmt.Fprintf(w, "pgfence: %s\n", msg)
	if ce.hint != "" {
		fmt.Fprintf(w, "hint: %s\n", ce.hint)
	}
	return ce.code
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// newFlags returns a flag set that reports errors instead of exiting. It
// prints its usage for -h only: a parse error is reported by [parse], in one
// line with a hint, like every other error.
func newFlags(e *env, name, usageLine string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package writes a parse error's message to the output and then
	// calls Usage; for -h it calls Usage alone.
	failed := &wroteTo{}
	fs.SetOutput(failed)
	fs.Usage = func() {
		if failed.wrote {
			failed.wrote = false
			return
		}
		fmt.Fprintf(e.stderr, "Usage: pgfence %s\n\nFlags:\n", usageLine)
		fs.SetOutput(e.stderr)
		fs.PrintDefaults()
		fs.SetOutput(failed)
	}
	return fs
}

// wroteTo discards what is written to it and remembers that it was.
type wroteTo struct{ wrote bool }

func (w *wroteTo) Write(p []byte) (int, error) {
	w.wrote = true
	return len(p), nil
}

// parse parses args, turning flag errors into usage errors.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &cliError{msg: err.Error(), hint: "run the command with -h for its flags", code: exitUsage}
	}
	return nil
}

// interspersed reorders args so that flags given after positional arguments
// are parsed too: `leases show KEY --json` works like `leases show --json KEY`.
func interspersed(fs *flag.FlagSet, args []string) []string {
	var flags, positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // reported by Parse
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 == len(args) {
			// The flag's value is missing. Give Parse the flag last, so that
			// it reports "flag needs an argument" instead of taking the "--"
			// that would follow as the value.
			return flags
		}
		flags = append(flags, args[i+1])
		i++
	}
	return append(append(flags, "--"), positional...)
}

// cell returns s for a table cell: as it is when every character prints,
// quoted otherwise, so that a tab or newline in a key, reason or holder
// description cannot shift columns or forge a row.
func cell(s string) string {
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
