package pgfencetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/migrations"
)

// StartOptions configures [Start]. A nil *StartOptions and zero fields use the
// defaults.
type StartOptions struct {
	// URL is the database to use (a postgres:// URL or key=value string); the
	// pgfence schema is installed or upgraded there, and nothing else is
	// changed. Empty: start a throwaway local cluster.
	URL string
	// Progress receives human-readable lines while a throwaway cluster starts.
	// Default: discard.
	Progress io.Writer
	// MaxConns bounds the pool. Default: 20.
	MaxConns int32
	// Settings are server settings for a throwaway cluster
	// (postgresql.conf names and values); ignored with a URL.
	Settings map[string]string
}

// Start opens a database for a program, such as a demo, an example or a
// local tool: the database at opts.URL, or else a throwaway local PostgreSQL
// cluster started from the server binaries on this machine (on PATH or under
// /usr/lib/postgresql/*/bin; as an unprivileged user when running as root),
// listening on 127.0.0.1 and a free port. It installs or upgrades the pgfence
// schema there and returns the database with a pool on it. Close closes the
// pool and, for a throwaway cluster, stops it and removes its files; call it
// on every path, Ctrl-C included (signal.NotifyContext gives a context that
// Ctrl-C ends). A database given by URL is never dropped.
//
// Unlike [NewDatabase], Start needs no *testing.T and starts nothing it does
// not stop: every Start is one database, and one cluster when it has no URL.
func Start(ctx context.Context, opts *StartOptions) (*Database, error) {
	if opts == nil {
		opts = &StartOptions{}
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	maxConns := opts.MaxConns
	if maxConns <= 0 {
		maxConns = 20
	}
	d := &Database{URL: opts.URL}
	if d.URL == "" {
		fmt.Fprintln(progress, "no database URL given: starting a throwaway local PostgreSQL (removed on exit)")
		start := time.Now()
		c, err := pgcluster.Start(ctx, &pgcluster.Config{
			Settings: opts.Settings,
			Progress: func(msg string) { fmt.Fprintln(progress, "  "+msg) },
		})
		if err != nil {
			if errors.Is(err, pgcluster.ErrNoBinaries) {
				return nil, fmt.Errorf("%w\n(or give the URL of an existing server)", err)
			}
			return nil, err
		}
		// The pristine initdb copy is only needed to start more clusters.
		pgcluster.CleanupPristine()
		d.cluster = c
		d.URL = c.ConnString("postgres")
		d.Name = "postgres"
		fmt.Fprintf(progress, "  PostgreSQL ready on %s in %s\n", c.Addr(), time.Since(start).Round(time.Millisecond))
	}
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("invalid database URL: %w", err)
	}
	if d.Name == "" {
		d.Name = cfg.ConnConfig.Database
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	d.Pool = pool
	if err := migrations.Up(ctx, pool); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("install the pgfence schema: %w", err)
	}
	return d, nil
}

// Throwaway reports whether d is a throwaway local cluster started by
// [Start], removed by Close.
func (d *Database) Throwaway() bool { return d.cluster != nil }

// Run is the main function of a program that needs a database, such as an
// example or a local tool: it opens the database of the environment
// variable DATABASE_URL, or else a throwaway local cluster ([Start], with
// progress on standard error), runs fn with a context that Ctrl-C ends,
// closes the database (removing a throwaway cluster), and exits with status
// 1, printing "name: error", if anything failed.
func Run(name string, fn func(ctx context.Context, db *Database) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	db, err := Start(ctx, &StartOptions{URL: os.Getenv("DATABASE_URL"), Progress: os.Stderr})
	if err == nil {
		err = fn(ctx, db)
		if cerr := db.Close(); err == nil {
			err = cerr
		}
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
