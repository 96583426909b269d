package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// What every command shares: the exit codes, errors with a hint, the flag
// set and its common flags, and the text and JSON output.

// Exit codes, documented in `pgfence help` and README.md.
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

// input is one command's invocation: its positional arguments, the flags
// every command shares, and where its output goes.
type input struct {
	*env
	args []string // exactly the command's declared arguments
	json bool     // --json
	db   dbFlags  // --database-url, --connect-timeout (commands with a database)
}

// connect opens a pool on the command's database (see [dbFlags.connect]).
func (in *input) connect(ctx context.Context) (*pgxpool.Pool, error) {
	return in.db.connect(ctx, in.env)
}

// print writes v as JSON with --json, and calls text otherwise.
func (in *input) print(v any, text func(w io.Writer)) error {
	if in.json {
		return writeJSON(in.stdout, v)
	}
	text(in.stdout)
	return nil
}

// writeJSON writes v, indented, as one JSON document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newFlags returns a flag set that reports errors instead of exiting. It
// prints its usage for -h only: a parse error is reported by [parse], in one
// line with a hint, like every other error.
func newFlags(e *env, name, usageLine, summary string) *flag.FlagSet {
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
		fmt.Fprintf(e.stderr, "Usage: pgfence %s\n\n", usageLine)
		if summary != "" {
			fmt.Fprintf(e.stderr, "%s\n\n", summary)
		}
		fmt.Fprintln(e.stderr, "Flags:")
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

// dash is s, or "-" for a table cell with nothing in it.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stamp formats a database time for a table cell, in UTC.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// optionalTime is t in UTC for JSON, or nil (the key left out) for a time the
// database never recorded.
func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}
