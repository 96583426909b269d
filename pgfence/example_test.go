package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A holder writes with its fencing token; a holder with an older token, woken
// up late, is rejected by the database, whatever path it writes through.
func Example() {
	ctx := context.Background()
	db, err := pgfencetest.Open()
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer db.Close()
	pool := db.Pool
	_, _ = pool.Exec(ctx, `CREATE TABLE report (id text PRIMARY KEY, body text, token bigint)`)
	_ = pgfence.Protect(ctx, pool, pgx.Identifier{"report"}, "id", "report:")

	write := func(token int64, body string) error {
		_, err := pgfence.Exec(ctx, pool, "report:daily", token,
			`INSERT INTO report VALUES ('daily', $1, $2) ON CONFLICT (id) DO UPDATE SET body = excluded.body, token = excluded.token`,
			body, token)
		return err
	}
	fmt.Println("token 41:", write(41, "by the old holder"))
	fmt.Println("token 42:", write(42, "by the new holder"))

	err = write(41, "late write of the old holder")
	var stale *pgfence.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Printf("token 41 again: stale, %d was accepted\n", stale.Accepted)
	}

	_, err = pool.Exec(ctx, `UPDATE report SET body = 'through a side door'`)
	fmt.Println("unfenced UPDATE rejected:", errors.Is(pgfence.MapError(err), pgfence.ErrUnfencedWrite))

	var body string
	_ = pool.QueryRow(ctx, `SELECT body FROM report WHERE id = 'daily'`).Scan(&body)
	fmt.Println("row:", body)
	// Output:
	// token 41: <nil>
	// token 42: <nil>
	// token 41 again: stale, 42 was accepted
	// unfenced UPDATE rejected: true
	// row: by the new holder
}

// Versioned rows: the application's table keeps the token of each row's last
// write; a stale update is told apart from a missing row.
func ExampleUpdateRow() {
	ctx := context.Background()
	db, err := pgfencetest.Open()
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer db.Close()
	_, _ = db.Pool.Exec(ctx, `CREATE TABLE job (id int PRIMARY KEY, state text, fence bigint)`)
	_, _ = db.Pool.Exec(ctx, `INSERT INTO job VALUES (1, 'queued', NULL)`)
	jobs := pgfence.Table{Name: pgx.Identifier{"job"}, Key: "id", Fence: "fence"}

	fmt.Println(pgfence.UpdateRow(ctx, db.Pool, jobs, 1, 7, map[string]any{"state": "running"}))
	err = pgfence.UpdateRow(ctx, db.Pool, jobs, 1, 6, map[string]any{"state": "done"})
	fmt.Println(errors.Is(err, pgfence.ErrStaleToken))
	err = pgfence.UpdateRow(ctx, db.Pool, jobs, 2, 7, map[string]any{"state": "done"})
	fmt.Println(errors.Is(err, pgfence.ErrNotFound))
	// Output:
	// <nil>
	// true
	// true
}

// A logger in the context gets one event per fenced write; a rejected write
// is also recorded in pgfence.fence_rejections, listed by Rejections.
func ExampleContextWithLogger() {
	db, err := pgfencetest.Open()
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer db.Close()
	// A text log without the time, for a stable output.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "pgfence.fence.op" {
				return slog.Attr{}
			}
			return a
		},
	}))
	ctx := pgfence.ContextWithLogger(context.Background(), logger)

	_, _ = pgfence.Exec(ctx, db.Pool, "invoice:7", 42, `SELECT 'the business write'`) // accepted: debug, not shown
	_, _ = pgfence.Exec(ctx, db.Pool, "invoice:7", 41, `SELECT 'a late write'`)

	rejections, _ := pgfence.Rejections(ctx, db.Pool, "invoice:7", 10)
	for _, r := range rejections {
		fmt.Printf("recorded: %s, token %d, %d was accepted\n", r.Reason, r.PresentedToken, r.AcceptedToken)
	}
	// Output:
	// level=INFO msg="pgfence: write rejected" pgfence.operation=exec pgfence.fence.resource=invoice:7 pgfence.fence.token=41 pgfence.outcome=stale_token pgfence.fence.accepted_token=42
	// recorded: stale_token, token 41, 42 was accepted
}
