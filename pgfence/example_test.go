package pgfence_test

import (
	"context"
	"errors"
	"fmt"
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
	// Not kept alive: the old holder is about to pause.
	old, _ := client.TryAcquire(ctx, "report:daily", 100*time.Millisecond, &leases.AcquireOptions{NoKeepAlive: true})
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
// presented with the resource it was issued for, the key of the lease that
// issued it, as a Lease with no holder: a bare token. A token that lease never
// issued is refused.
func ExampleLeaseOf() {
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
		_, err := pgfence.Exec(ctx, db.Pool, pgfence.LeaseOf("invoice:7", "", token), `SELECT 'the business write'`)
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

// A rejected write is recorded in pgfence.fence_rejections, with the token
// that beat it; Rejections lists a resource's newest ones.
func ExampleRejections() {
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

	_, _ = pgfence.Exec(ctx, db.Pool, second, `SELECT 'the business write'`)
	_, err = pgfence.Exec(ctx, db.Pool, first, `SELECT 'a late write'`)
	fmt.Println("the first holder's late write is stale:", errors.Is(err, pgfence.ErrStaleToken))

	rejections, _ := pgfence.Rejections(ctx, db.Pool, "invoice:7", 10)
	for _, r := range rejections {
		fmt.Printf("recorded: %s by %s, the first holder's token presented: %v, the second's accepted: %v\n",
			r.Reason, r.Operation, r.PresentedToken == first.Token(), r.AcceptedToken == second.Token())
	}
	// Output:
	// the first holder's late write is stale: true
	// recorded: stale_token by exec, the first holder's token presented: true, the second's accepted: true
}
