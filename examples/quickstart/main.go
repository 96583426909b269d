// Command quickstart is the README's quickstart, runnable: a stock row that
// only the current holder of its lease can change, and an order placed once
// however often it is sent. The README quotes the body of quickstart
// verbatim (a test keeps them equal), so what a reader copies compiles and
// runs.
//
//	go run ./examples/quickstart                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func main() {
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("quickstart", func(ctx context.Context, db *pgfencetest.Database) error {
		return quickstart(ctx, db.URL, os.Stdout)
	})
}

func quickstart(ctx context.Context, url string, out io.Writer) (err error) {
	// quickstart:begin
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool); err != nil { // the pgfence schema
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS stock (sku text PRIMARY KEY, qty int NOT NULL);
		INSERT INTO stock VALUES ('sku-42', 10) ON CONFLICT DO NOTHING`); err != nil {
		return err
	}
	// Close the other doors: every write to stock must present the current
	// token of the row's lease, "stock:" || sku, whatever client sends it.
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"stock"}, "sku", "stock:"); err != nil {
		return err
	}

	client, err := leases.New(pool, nil) // one per process
	if err != nil {
		return err
	}
	defer client.Close()

	// Wait for the lease on the row (the database clock decides), up to 10 s.
	lease, err := client.Acquire(ctx, "stock:sku-42", 30*time.Second, &leases.AcquireOptions{MaxWait: 10 * time.Second})
	if err != nil {
		return err
	}
	// The lease is kept alive until released. Release reports a lease lost
	// meanwhile (a pause past its TTL, the database out of reach): the
	// fence below refused any stale write, and the caller hears of it.
	defer func() { err = errors.Join(err, lease.Release(context.WithoutCancel(ctx))) }()

	// The fenced write: the database accepts it only if no newer holder of
	// the lease has written, in the same transaction as the business write.
	_, err = pgfence.Write(ctx, pool, lease, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE stock SET qty = qty - 1 WHERE sku = 'sku-42' AND qty > 0`)
		return err
	})
	switch {
	case errors.Is(err, pgfence.ErrStaleToken):
		return fmt.Errorf("this process lost its lease while paused, and a newer holder wrote: %w", err)
	case err != nil:
		return err
	}

	// Once per business intent: the same order sent twice is placed once,
	// and the duplicate gets the stored result.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, sku text NOT NULL)`); err != nil {
		return err
	}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		return err
	}
	order := idempotency.Request{Scope: "shop/orders", Key: "order-1001", Payload: []byte(`{"sku":"sku-42"}`)}
	for range 2 {
		o, err := store.Do(ctx, pool, order, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			// The key is kept for a day (its retention); after that a resend
			// is a new intent, and the order row, already there, stays one.
			_, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('order-1001', 'sku-42') ON CONFLICT (id) DO NOTHING`)
			return []byte(`{"order":"order-1001"}`), err
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "order %s: replayed %t, %s\n", order.Key, o.Replayed, o.Result)
	}
	// quickstart:end
	return nil
}
