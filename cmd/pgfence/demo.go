package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/demo"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func runDemo(fs *flag.FlagSet) runFunc {
	ttl := fs.Duration("ttl", time.Second, "the lease TTL; worker A is frozen for longer than this")
	keep := fs.Bool("keep", false, "keep the pgfence_demo schema afterwards (a database of yours only)")
	return func(ctx context.Context, in *input) error {
		if *ttl < demo.MinTTL || *ttl > demo.MaxTTL {
			return usageError("--ttl must be between %s and %s, got %s", demo.MinTTL, demo.MaxTTL, *ttl)
		}
		url := in.db.url
		if url == "" {
			url = in.getenv("DATABASE_URL")
		}
		if url != "" {
			// Every command's check first: a bad or unreachable URL is
			// explained as everywhere else, within --connect-timeout.
			pool, err := in.connect(ctx)
			if err != nil {
				return err
			}
			pool.Close()
			// The demo's pools and its worker process connect with this
			// URL: as every command, they send statements in a mode a
			// transaction-mode pooler accepts.
			url = withExecMode(url)
		}
		d, err := pgfencetest.Start(ctx, &pgfencetest.StartOptions{URL: url, Progress: in.stderr})
		if err != nil {
			if errors.Is(err, pgerr.ErrUnavailable) || pgerr.IsConnectionError(err) {
				return &cliError{msg: "cannot reach the database: " + redact(err.Error()), hint: "check --database-url / DATABASE_URL, or omit both to use a throwaway local PostgreSQL", code: exitUnavailable, err: err}
			}
			return &cliError{msg: redact(err.Error()), hint: "omit --database-url and unset DATABASE_URL to use a throwaway local PostgreSQL (needs the server binaries), or pass a reachable URL", code: exitUnavailable, err: err}
		}
		defer d.Close()
		rep, err := demo.Run(ctx, d, demo.Options{TTL: *ttl, Keep: *keep, Progress: in.stderr})
		if err != nil {
			return err
		}
		if err := in.print(rep, func(w io.Writer) { rep.WriteText(w) }); err != nil {
			return err
		}
		if !rep.OK {
			return &cliError{msg: "demo: a guarantee did not hold (see the checks above)", hint: "this is a bug: please report it with the output of `pgfence demo --json`", code: exitFailure}
		}
		return nil
	}
}
