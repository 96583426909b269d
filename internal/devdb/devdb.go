// Package devdb opens the database for the CLI's demo and bench commands and for
// the runnable examples: the URL the user gave, or else a throwaway local
// PostgreSQL cluster (the same machinery as the test harness) that is removed
// when the program exits, Ctrl-C included.
package devdb

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

// DB is an open, migrated database.
type DB struct {
	// Pool is a pool on the database.
	Pool *pgxpool.Pool
	// URL connects to it (for worker processes and psql).
	URL string
	// Embedded reports whether the database is a throwaway local cluster.
	Embedded bool

	cluster *pgcluster.Cluster
}

// Options configures [Open]. A nil *Options uses the defaults.
type Options struct {
	// Progress receives human-readable startup lines (default: discarded).
	Progress io.Writer
	// MaxConns bounds the pool (default 20).
	MaxConns int32
	// Settings are extra server settings for an embedded cluster.
	Settings map[string]string
}

// Open connects to url and installs or upgrades the pgfence schema there; with
// an empty url it starts a throwaway local cluster instead. Close removes it.
func Open(ctx context.Context, url string, opts *Options) (*DB, error) {
	if opts == nil {
		opts = &Options{}
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	maxConns := opts.MaxConns
	if maxConns <= 0 {
		maxConns = 20
	}
	db := &DB{URL: url}
	if url == "" {
		fmt.Fprintln(progress, "no --database-url or DATABASE_URL: starting a throwaway local PostgreSQL (removed on exit)")
		start := time.Now()
		c, err := pgcluster.Start(ctx, &pgcluster.Config{
			Settings: opts.Settings,
			Progress: func(msg string) { fmt.Fprintln(progress, "  "+msg) },
		})
		if err != nil {
			if errors.Is(err, pgcluster.ErrNoBinaries) {
				return nil, fmt.Errorf("%w\n(or pass --database-url / DATABASE_URL to use an existing server)", err)
			}
			return nil, err
		}
		// The pristine initdb copy is only needed to start more clusters.
		pgcluster.CleanupPristine()
		db.cluster, db.Embedded = c, true
		db.URL = c.ConnString("postgres")
		fmt.Fprintf(progress, "  PostgreSQL ready on %s in %s\n", c.Addr(), time.Since(start).Round(time.Millisecond))
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("invalid database URL: %w", err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		db.Close()
		return nil, err
	}
	db.Pool = pool
	m, err := migrations.New(pool, nil)
	if err != nil {
		db.Close()
		return nil, err
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("install the pgfence schema: %w", err)
	}
	return db, nil
}

// Cluster returns the embedded cluster, or nil for a user-supplied database.
func (db *DB) Cluster() *pgcluster.Cluster { return db.cluster }

// Close closes the pool and stops and removes an embedded cluster.
func (db *DB) Close() {
	if db.Pool != nil {
		db.Pool.Close()
	}
	if db.cluster != nil {
		_ = db.cluster.Close()
	}
}

// Main is the main function of a runnable example: it opens the database from
// DATABASE_URL (or a throwaway local cluster), runs run with a context that
// Ctrl-C cancels, removes the throwaway cluster, and exits 1 with the error
// prefixed by name if anything failed.
func Main(name string, run func(ctx context.Context, pool *pgxpool.Pool) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	db, err := Open(ctx, os.Getenv("DATABASE_URL"), &Options{Progress: os.Stderr})
	if err == nil {
		err = run(ctx, db.Pool)
		db.Close()
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
