// Command pgfence installs and operates pgfence: schema migrations,
// inspection of leases, fences, protected tables, the token floor and
// idempotency keys, a live demo of the guarantees, health checks, and a
// benchmark lab.
//
// Usage:
//
//	pgfence <noun> <verb> [arguments] [flags]
//	pgfence doctor | demo [flags]
//
// Every command takes --json and then prints one JSON object; every command
// that uses a database takes --database-url (default $DATABASE_URL) and
// --connect-timeout. README.md next to this file is the reference: the
// commands, the exit codes and the JSON contract. Run `pgfence help` for the
// list of commands.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/demo"
)

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
	switch args[0] {
	case "help", "-h", "--help":
		usage(e.stdout)
		return exitOK
	case demo.WorkerCommand: // the demo's worker A, a child process
		return report(e.stderr, demo.Worker(ctx, args[1:], os.Stdin, e.stdout, e.getenv))
	}
	c, rest, err := lookup(e, args)
	if err != nil {
		return report(e.stderr, err)
	}
	return report(e.stderr, runCommand(ctx, e, c, rest))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "pgfence: leases, fencing tokens and idempotency keys in PostgreSQL")
	fmt.Fprintln(w, "\nUsage: pgfence <noun> <verb> [arguments] [flags]   (pgfence <noun> <verb> -h for its flags)")
	fmt.Fprintln(w, "\nCommands:")
	all := commands()
	width := 0
	for _, n := range nouns() {
		width = max(width, len(n.name))
	}
	for _, n := range nouns() {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n.name, n.summary)
		for _, c := range all {
			if c.noun == n.name && c.verb != "" {
				fmt.Fprintf(w, "    %s\n", c.usageLine())
			}
		}
	}
	fmt.Fprintln(w, "\nEvery command takes --json: it then prints one JSON object (README.md describes each);")
	fmt.Fprintln(w, "leases watch prints one object per event, one per line.")
	fmt.Fprintln(w, "The database comes from --database-url or DATABASE_URL (a postgres:// URL or key=value string);")
	fmt.Fprintln(w, "--connect-timeout bounds the wait for it (default 10s).")
	fmt.Fprintln(w, "\nExit codes:")
	fmt.Fprintln(w, "  0  success")
	fmt.Fprintln(w, "  1  the command failed (demo, doctor: a check did not hold; bench contention: the business table did not reconcile, or an operation failed)")
	fmt.Fprintln(w, "  2  bad flags or arguments")
	fmt.Fprintln(w, "  3  the database could not be reached")
	fmt.Fprintln(w, "  4  the pgfence schema is missing, outdated, or newer than this binary")
}
