// Command report shows report generation where a stale generator cannot
// replace a newer file with an older one.
//
// Generators render the "daily-sales" report under the lease
// "report/daily-sales" and store it in a file table whose rows carry the token
// of the write that produced them: a versioned row. The store compares tokens
// atomically: one UPDATE … WHERE fence <= token replaces the file only if it
// is not newer than the writer's grant, and a write it refuses changes no row.
// gen-1 renders first and freezes for longer than its lease; meanwhile new
// sales arrive and gen-2 and gen-3 render newer versions; when gen-1 wakes up,
// its older file is rejected.
//
// Run it:
//
//	go run ./examples/report                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/report
//
// It exits non-zero unless the stored file is the one written with the highest
// accepted token and covers every sale.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	report    = "daily-sales"
	pausedTTL = 300 * time.Millisecond
	ttl       = time.Second
)

// The file store: one row per file, fence = the token of its last write.
const (
	// sqlPublish replaces file $1 with token $2 unless the stored version's
	// token is newer: the comparison and the replacement are one statement,
	// so two writers cannot both pass the check.
	sqlPublish = `UPDATE example_report_files SET fence = $2, writer = $3, content = $4
		WHERE name = $1 AND (fence IS NULL OR fence <= $2)`
	// sqlStored reads the token of file $1.
	sqlStored = `SELECT fence FROM example_report_files WHERE name = $1`
)

// staleError is a write the file store refused: the file carries a newer
// token.
type staleError struct{ Presented, Stored int64 }

func (e *staleError) Error() string {
	return fmt.Sprintf("the file carries token %d, newer than %d", e.Stored, e.Presented)
}

func main() {
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("report", func(ctx context.Context, db *pgfencetest.Database) error {
		_, err := run(ctx, db.Pool, os.Stdout)
		return err
	})
}

// result is the business outcome, checked by main_test.go.
type result struct {
	Content        string // the stored file
	Writer         string // who wrote it
	Token          int64  // its token
	HighestWritten int64  // the highest token of an accepted write
	Sales          int    // sales in the database at the end
	StaleRejected  bool
}

func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (result, error) {
	var res result
	var mu sync.Mutex // serialises output and res
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "  "+format+"\n", args...)
	}

	_, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS example_report_files, example_sales;
		CREATE TABLE example_sales (id int PRIMARY KEY, amount int NOT NULL);
		CREATE TABLE example_report_files (name text PRIMARY KEY, fence bigint, writer text, content text);
		INSERT INTO example_sales VALUES (1, 100), (2, 250), (3, 40);
		INSERT INTO example_report_files (name) VALUES ('daily-sales');`)
	if err != nil {
		return res, err
	}
	client, err := leases.New(pool, nil)
	if err != nil {
		return res, err
	}
	defer client.Close()
	fmt.Fprintf(out, "report: generators render %q from the sales table under one lease\n", report)

	render := func(ctx context.Context) (string, error) {
		var n, total int
		err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0) FROM example_sales`).Scan(&n, &total)
		return fmt.Sprintf("daily sales: %d orders, total %d", n, total), err
	}
	// publish replaces the file if the stored version's token is not newer
	// (sqlPublish); an older token changes no row and gets a *staleError.
	publish := func(ctx context.Context, writer string, token int64, content string) error {
		tag, err := pool.Exec(ctx, sqlPublish, report, token, writer, content)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			var stored int64
			if err := pool.QueryRow(ctx, sqlStored, report).Scan(&stored); err != nil {
				return err
			}
			return &staleError{Presented: token, Stored: stored}
		}
		mu.Lock()
		res.HighestWritten = max(res.HighestWritten, token)
		mu.Unlock()
		return nil
	}

	// gen-1 renders the current sales, then freezes past its lease (nothing
	// renews it while it is frozen).
	frozen, err := client.Acquire(ctx, "report/"+report, pausedTTL, &leases.AcquireOptions{HolderInfo: "gen-1", NoKeepAlive: true})
	if err != nil {
		return res, err
	}
	stale, err := render(ctx)
	if err != nil {
		return res, err
	}
	say("gen-1 got the lease (token %d), rendered %q and froze", frozen.Token(), stale)

	// New sales arrive while gen-1 is frozen.
	if _, err := pool.Exec(ctx, `INSERT INTO example_sales VALUES (4, 75), (5, 310)`); err != nil {
		return res, err
	}
	say("two more sales arrived")

	// gen-2 and gen-3 take the lease in turn (the first after gen-1's expired).
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, writer := range []string{"gen-2", "gen-3"} {
		wg.Go(func() {
			err := client.Do(ctx, "report/"+report, ttl, nil, func(ctx context.Context, l *leases.Lease) error {
				content, err := render(ctx)
				if err != nil {
					return err
				}
				if err := publish(ctx, writer, l.Token(), content); err != nil {
					return err
				}
				say("%s (token %d) published %q", writer, l.Token(), content)
				return nil
			})
			if err != nil {
				errs <- fmt.Errorf("%s: %w", writer, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return res, err
	}

	// gen-1 wakes up and publishes the file it rendered before the pause.
	err = publish(ctx, "gen-1", frozen.Token(), stale)
	var staleErr *staleError
	switch {
	case errors.As(err, &staleErr):
		res.StaleRejected = true
		say("gen-1 woke up and published its older file with token %d: REJECTED (the file carries token %d)", staleErr.Presented, staleErr.Stored)
	case err == nil:
		say("gen-1 woke up and published its older file with token %d: ACCEPTED (the newer file was replaced!)", frozen.Token())
	default:
		return res, err
	}
	_ = frozen.Release(ctx) // ErrLeaseLost: it expired while gen-1 was frozen

	// Check the business state: the file is the newest version.
	if err := pool.QueryRow(ctx, `SELECT content, writer, fence, (SELECT count(*) FROM example_sales) FROM example_report_files WHERE name = $1`, report).
		Scan(&res.Content, &res.Writer, &res.Token, &res.Sales); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "result: %q holds %q, written by %s with token %d\n", report, res.Content, res.Writer, res.Token)
	want := fmt.Sprintf("daily sales: %d orders", res.Sales)
	switch {
	case !res.StaleRejected:
		return res, errors.New("a stale generator replaced a newer file")
	case res.Token != res.HighestWritten:
		return res, fmt.Errorf("the file carries token %d, the highest accepted write was %d", res.Token, res.HighestWritten)
	case !strings.HasPrefix(res.Content, want):
		return res, fmt.Errorf("the file does not cover all %d sales", res.Sales)
	}
	fmt.Fprintln(out, "OK: the stored file is the newest version")
	return res, nil
}
