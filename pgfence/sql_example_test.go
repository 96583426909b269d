package pgfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A service that writes through database/sql (here lib/pq) deducts stock in
// its own transaction, fenced by its lease; when the lease expires and
// another holder takes over and writes, the first holder's late write is
// refused by the database, and nothing of its transaction commits.
func ExampleWriteSQL() {
	ctx := context.Background()
	db, err := pgfencetest.Open()
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer db.Close()
	_, _ = db.Pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL);
		CREATE TABLE orders (id int PRIMARY KEY, sku text NOT NULL);
		INSERT INTO stock VALUES ('sku-42', 10)`)
	// Every write of a stock row must come from a transaction whose token for
	// "stock:<sku>" was accepted.
	_ = pgfence.Protect(ctx, db.Pool, pgx.Identifier{"stock"}, "sku", "stock:")

	sdb, err := sql.Open("postgres", db.URL) // lib/pq
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sdb.Close()
	// Leases come from the leases package, on a pgx pool of the same database.
	client, err := leases.New(db.Pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	// order is the service's transaction: an order row and the deduction,
	// fenced by the lease, committed together.
	order := func(l pgfence.Lease, id int) error {
		tx, err := sdb.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ($1, 'sku-42')`, id); err != nil {
			return err
		}
		_, err = pgfence.WriteSQL(ctx, tx, l, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE stock SET qty = qty - 1 WHERE sku = 'sku-42'`)
			return err
		})
		if err != nil {
			return err
		}
		return tx.Commit()
	}

	// Not kept alive: the old holder is about to pause.
	old, _ := client.TryAcquire(ctx, "stock:sku-42", 100*time.Millisecond, &leases.AcquireOptions{NoKeepAlive: true})
	fmt.Println("old holder's order:", order(old, 1))
	// The old holder pauses past its lease; the new holder's Acquire waits
	// until the database says the lease expired.
	current, _ := client.Acquire(ctx, "stock:sku-42", time.Minute, nil)
	defer current.Release(ctx)
	fmt.Println("new holder's order:", order(current, 2))

	err = order(old, 3)
	var stale *pgfence.StaleTokenError
	fmt.Println("old holder's late order is stale:", errors.As(err, &stale) && stale.Accepted == current.Token())

	var qty, orders int
	_ = sdb.QueryRowContext(ctx, `SELECT (SELECT qty FROM stock), (SELECT count(*) FROM orders)`).Scan(&qty, &orders)
	fmt.Println("stock:", qty, "orders:", orders)
	// Output:
	// old holder's order: <nil>
	// new holder's order: <nil>
	// old holder's late order is stale: true
	// stock: 8 orders: 2
}

// A write whose COMMIT was sent but whose answer was lost is resolved by its
// operation id: NotApplied is final, Applied means it committed. Here the
// answer arrives, so the example prints the write's result; the branch that
// resolves is what a caller writes for the lost answer (the fault tests
// exercise it).
func ExampleResolveSQL() {
	ctx := context.Background()
	db, err := pgfencetest.Open()
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer db.Close()
	sdb, err := sql.Open("pgx", db.URL) // pgx's stdlib driver
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sdb.Close()
	_, _ = sdb.ExecContext(ctx, `CREATE TABLE kv (k text PRIMARY KEY, v text)`)
	var holder string
	var token int64
	_ = sdb.QueryRowContext(ctx, `SELECT holder::text, token FROM pgfence.try_acquire('kv:a', interval '1 minute')`).Scan(&holder, &token)
	lease := pgfence.LeaseOf("kv:a", holder, token)

	n, err := pgfence.ExecSQL(ctx, sdb, lease, `INSERT INTO kv VALUES ('a', 'written')`)
	var unknown *pgfence.OutcomeUnknownError
	if errors.As(err, &unknown) {
		// The connection broke around COMMIT: ask the database, never retry blindly.
		o, err := pgfence.ResolveSQL(ctx, sdb, unknown)
		fmt.Println("resolved:", o, err)
		return
	}
	fmt.Println("rows:", n, "error:", err)
	// Output:
	// rows: 1 error: <nil>
}
