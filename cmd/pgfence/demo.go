package main

import (
	"context"
	"errors"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/demo"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func runDemo(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "demo", "demo [--database-url URL] [--json] [--ttl 1s] [--keep]")
	var db dbFlags
	db.register(fs)
	asJSON := fs.Bool("json", false, "print the timeline, final state and checks as JSON")
	ttl := fs.Duration("ttl", time.Second, "the lease TTL; worker A is frozen for longer than this")
	keep := fs.Bool("keep", false, "keep the pgfence_demo schema afterwards (a user-supplied database only)")
	if err := parse(fs, interspersed(fs, args)); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("demo takes no arguments, got %q", fs.Args())
	}
	if *ttl < demo.MinTTL || *ttl > demo.MaxTTL {
		return usageError("--ttl must be between %s and %s, got %s", demo.MinTTL, demo.MaxTTL, *ttl)
	}
	url := db.url
	if url == "" {
		url = e.getenv("DATABASE_URL")
	}
	if url != "" {
		// Every command's check first: a bad or unreachable URL is explained
		// as everywhere else, within --connect-timeout.
		pool, err := db.connect(ctx, e)
		if err != nil {
			return err
		}
		pool.Close()
	}
	progress := e.stderr
	d, err := pgfencetest.Start(ctx, &pgfencetest.StartOptions{URL: url, Progress: progress})
	if err != nil {
		if errors.Is(err, pgerr.ErrUnavailable) || pgerr.IsConnectionError(err) {
			return &cliError{msg: "cannot reach the database: " + redact(err.Error()), hint: "check --database-url / DATABASE_URL, or omit both to use a throwaway local PostgreSQL", code: exitUnavailable, err: err}
		}
		return &cliError{msg: redact(err.Error()), hint: "omit --database-url to use a throwaway local PostgreSQL (needs the server binaries), or pass a reachable URL", code: exitUnavailable, err: err}
	}
	defer d.Close()

	rep, err := demo.Run(ctx, d, demo.Options{TTL: *ttl, Keep: *keep, Progress: progress})
	if err != nil {
		return err
	}
	if *asJSON {
		if err := writeJSON(e, rep); err != nil {
			return err
		}
	} else {
		rep.WriteText(e.stdout)
	}
	if !rep.OK {
		return &cliError{msg: "demo: a guarantee did not hold (see the checks above)", hint: "this is a bug: please report it with the output of `pgfence demo --json`", code: exitFailure}
	}
	return nil
}
