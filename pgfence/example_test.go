package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A holder writes under its lease; when its lease expires and another holder
// takes over and writes, the first holder's late write is rejected by the
// database, whatever path it writes through.
func Example() {
	ctx := context.Background()
	db, err := pgfencetest.Open()
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer db.Close()
	pool := db.Pool
	_, _ = pool.Exec(ctx, `CREATE TABLE report (id text PRIMARY KEY, body text)`)
	_ = pgfence.Protect(ctx, pool, pgx.Identifier{"report"}, "id", "report:")
	client, err := leases.New(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	write := func(l *leases.Lease, body string) error {
		// The lease's key names the fenced resource: report:daily, the row
		// report/daily as the guard of the protected table names it.
		_, err := pgfence.Exec(ctx, pool, l,
			`INSERT INTO report VALUES ('daily', $1) ON CONFLICT (id) DO UPDATE SET body = excluded.body`, body)
		return err
	}
	old, _ := client.TryAcquire(ctx, "report:daily", 100*time.Millisecond, nil)
	fmt.Println("old holder writes:", write(old, "by the old holder"))
	// The old holder pauses past its lease; the new holder's Acquire waits
	// until the database says the lease expired.
	current, _ := client.Acquire(ctx, "report:daily", time.Minute, nil)
	defer current.Release(ctx)
	fmt.Println("new holder writes:", write(current, "by the new holder"))

	err = write(old, "late write of the old holder")
	var stale *pgfence.StaleTokenError
	fmt.Println("old holder's late write is stale:", errors.As(err, &stale) && stale.Accepted == current.Token())

	_, err = pool.Exec(ctx, `UPDATE report SET body = 'through a side door'`)
	fmt.Println("unfenced UPDATE rejected:", errors.Is(pgfence.MapError(err), pgfence.ErrUnfencedWrite))

	var body string
	_ = pool.QueryRow(ctx, `SELECT body FROM report WHERE id = 'daily'`).Scan(&body)
	fmt.Println("row:", body)
	// Output:
	// old holder writes: <nil>
	// new holder writes: <nil>
	// old holder's late write is stale: true
	// unfenced UPDATE rejected: true
	// row: by the new holder
}

// A token that came without its lease (from another process, or from SQL) is
// presented with the resource it was issued for: the key of the lease that
// issued it. A token that lease never issued is refused.
func ExampleExecToken() {
	ctx := context.Background()
	db, err := pgfencetest.Open()
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer db.Close()
	client, err := leases.New(db.Pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	// Two holders in turn: the first has released the lease, the second holds it.
	first, err := client.TryAcquire(ctx, "invoice:7", time.Minute, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = first.Release(ctx)
	second, err := client.TryAcquire(ctx, "invoice:7", time.Minute, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer second.Release(ctx)

	write := func(token int64) error {
		_, err := pgfence.ExecToken(ctx, db.Pool, "invoice:7", token, `SELECT 'the business write'`)
		return err
	}
	fmt.Println("the second holder's token:", write(second.Token()))
	fmt.Println("the first holder's token is stale:", errors.Is(write(first.Token()), pgfence.ErrStaleToken))
	fmt.Println("a made-up token is not issued:", errors.Is(write(second.Token()+1), pgfence.ErrTokenNotIssued))
	// Output:
	// the second holder's token: <nil>
	// the first holder's token is stale: true
	// a made-up token is not issued: true
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

// A Fencer with a logger reports one event per fenced write; a rejected write
// is also recorded in pgfence.fence_rejections, listed by Rejections.
func ExampleNew() {
	db, err := pgfencetest.Open()
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer db.Close()
	ctx := context.Background()
	client, err := leases.New(db.Pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	first, err := client.TryAcquire(ctx, "invoice:7", time.Minute, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = first.Release(ctx)
	second, err := client.TryAcquire(ctx, "invoice:7", time.Minute, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer second.Release(ctx)

	// A text log without the time, the operation id and the tokens (their
	// values depend on the server), for a stable output.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey, "pgfence.fence.op", "pgfence.fence.token", "pgfence.fence.accepted_token":
				return slog.Attr{}
			}
			return a
		},
	}))
	fencer := pgfence.New(&pgfence.Config{Logger: logger})

	_, _ = fencer.ExecToken(ctx, db.Pool, "invoice:7", second.Token(), `SELECT 'the business write'`) // accepted: debug, not shown
	_, _ = fencer.ExecToken(ctx, db.Pool, "invoice:7", first.Token(), `SELECT 'a late write'`)

	rejections, _ := pgfence.Rejections(ctx, db.Pool, "invoice:7", 10)
	for _, r := range rejections {
		fmt.Printf("recorded: %s, the first holder's token presented: %v, the second's accepted: %v\n",
			r.Reason, r.PresentedToken == first.Token(), r.AcceptedToken == second.Token())
	}
	// Output:
	// level=INFO msg="pgfence: write rejected" pgfence.operation=exec pgfence.fence.resource=invoice:7 pgfence.outcome=stale_token
	// recorded: stale_token, the first holder's token presented: true, the second's accepted: true
}
