package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/console"
)

// uiJSON is what `ui --json` prints once it listens, before it serves.
type uiJSON struct {
	URL     string `json:"url"`
	Actions bool   `json:"actions"`
}

// uiAddrDefault is where `pgfence ui` listens: this host only.
const uiAddrDefault = "127.0.0.1:8089"

func ui(fs *flag.FlagSet) runFunc {
	addr := fs.String("addr", uiAddrDefault, "host:port to listen on; any address other than loopback needs an access token")
	token := fs.String("access-token", "", "token every request must present (default: $"+console.TokenEnv+")")
	actions := fs.Bool("allow-actions", false, "enable the operator actions: pause and resume grants, force release, fail abandoned idempotency keys")
	refresh := fs.Duration("refresh", console.RefreshDefault, "how often the overview reloads its data (at least 1s)")
	return func(ctx context.Context, in *input) error {
		if *token == "" {
			*token = in.getenv(console.TokenEnv)
		}
		if err := console.CheckAddr(*addr, *token); err != nil {
			return &cliError{msg: err.Error(), hint: "bind 127.0.0.1 (the default) and tunnel to it, or set an access token", code: exitUsage}
		}
		if *refresh < time.Second {
			return usageError("--refresh must be at least 1s, got %s", *refresh)
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		srv, err := console.New(ctx, &console.Config{Pool: pool, AllowActions: *actions, AccessToken: *token, Refresh: *refresh,
			Doctor: func(ctx context.Context) []console.Finding { return findings(ctx, pool) }})
		if err != nil {
			return dbError(err)
		}
		defer srv.Close()
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			return &cliError{msg: fmt.Sprintf("cannot listen on %s: %v", *addr, err), hint: "pick another --addr", code: exitFailure, err: err}
		}
		url := "http://" + ln.Addr().String() + "/"
		if err := in.print(uiJSON{URL: url, Actions: *actions}, func(w io.Writer) {
			mode := "read-only"
			if *actions {
				mode = "operator actions enabled"
			}
			fmt.Fprintf(w, "pgfence ui: serving %s (%s); Ctrl-C stops it\n", url, mode)
		}); err != nil {
			return err
		}
		hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
		done := make(chan error, 1)
		go func() { done <- hs.Serve(ln) }()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return nil
	}
}

// findings runs the doctor for the console's overview.
func findings(ctx context.Context, pool *pgxpool.Pool) []console.Finding {
	var out []console.Finding
	for _, c := range diagnose(ctx, pool) {
		out = append(out, console.Finding{Name: c.Name, Status: c.Status, Detail: c.Detail})
	}
	return out
}
