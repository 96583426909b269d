// Command inventory shows stock deduction that can neither oversell nor lose
// an update, even when a worker freezes past its lease and wakes up to write.
//
// Eight orders race for one SKU. Each order takes the lease on the SKU and
// deducts inside a fenced write: the database accepts the write only if no
// newer lease token was accepted for the SKU. Order 1 takes the lease first and
// freezes (a simulated GC pause) for longer than its lease; the others take
// over one by one; when order 1 wakes up, its write is rejected by PostgreSQL.
// Finally an "old binary" that writes the table directly, without a token, is
// rejected by the protection trigger.
//
// Run it:
//
//	go run ./examples/inventory                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/inventory
//
// It exits non-zero if the final stock differs from the initial stock minus
// the accepted deductions, or if a stale or unfenced write got through.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	sku          = "sku-1"
	initialStock = 10
	orders       = 8
	quantity     = 2
	pausedTTL    = 300 * time.Millisecond // the frozen worker's lease
	workerTTL    = time.Second
)

func main() {
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("inventory", func(ctx context.Context, db *pgfencetest.Database) error {
		_, err := run(ctx, db.Pool, os.Stdout)
		return err
	})
}

// result is the business outcome, checked by main_test.go.
type result struct {
	FinalStock, Deducted   int
	Accepted, OutOfStock   int
	StaleRejected          bool // the frozen worker's late write was refused
	UnfencedRejected       bool // the direct UPDATE was refused
	OrdersInTable, Initial int
}

var errOutOfStock = errors.New("out of stock")

func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (result, error) {
	res := result{Initial: initialStock}
	var mu sync.Mutex // serialises output and res
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "  "+format+"\n", args...)
	}

	_, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS example_orders, example_inventory;
		CREATE TABLE example_inventory (sku text PRIMARY KEY, stock int NOT NULL);
		CREATE TABLE example_orders (id int PRIMARY KEY, sku text NOT NULL, quantity int NOT NULL, token bigint NOT NULL);
		INSERT INTO example_inventory VALUES ('sku-1', 10);`)
	if err != nil {
		return res, err
	}
	// No unchecked door: from now on every write to a row of example_inventory
	// must come from a transaction whose token for "inventory/<sku>" was
	// accepted by pgfence.fence().
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"example_inventory"}, "sku", "inventory/"); err != nil {
		return res, err
	}
	client, err := leases.New(pool, nil)
	if err != nil {
		return res, err
	}
	defer client.Close()

	resource := "inventory/" + sku // the lease key and the fenced resource
	fmt.Fprintf(out, "inventory: %s starts with %d units; %d orders of %d units race for it\n", sku, initialStock, orders, quantity)

	// deduct is the whole business write. pgfence.Write first presents the
	// token (the fence row stays locked until COMMIT, and an older token is
	// refused with PF001), then reads and writes in the same transaction, so
	// what it read cannot change before it commits.
	deduct := func(order int, lease *leases.Lease) (left int, err error) {
		token := lease.Token()
		_, err = pgfence.Write(ctx, pool, lease, func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT stock FROM example_inventory WHERE sku = $1`, sku).Scan(&left); err != nil {
				return err
			}
			if left < quantity {
				return errOutOfStock
			}
			left -= quantity
			if _, err := tx.Exec(ctx, `UPDATE example_inventory SET stock = $2 WHERE sku = $1`, sku, left); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO example_orders VALUES ($1, $2, $3, $4)`, order, sku, quantity, token)
			return err
		})
		return left, err
	}
	record := func(order int, token int64, left int, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			res.Accepted++
			res.Deducted += quantity
			fmt.Fprintf(out, "  order-%d token %d: deducted %d, %d left\n", order, token, quantity, left)
		case errors.Is(err, errOutOfStock):
			res.OutOfStock++
			fmt.Fprintf(out, "  order-%d token %d: out of stock (%d left)\n", order, token, left)
		}
	}

	// Order 1 takes the lease first with a short TTL, then freezes (nothing
	// renews its lease while it is frozen).
	frozen, err := client.Acquire(ctx, resource, pausedTTL, &leases.AcquireOptions{NoKeepAlive: true})
	if err != nil {
		return res, err
	}
	say("order-1 got the lease (token %d) and froze for longer than its %s lease", frozen.Token(), pausedTTL)

	// The other orders wait for the lease; the first of them gets it when
	// order 1's lease expires by the database clock.
	var wg sync.WaitGroup
	errs := make(chan error, orders)
	for order := 2; order <= orders; order++ {
		wg.Go(func() {
			err := client.Do(ctx, resource, workerTTL, nil, func(ctx context.Context, l *leases.Lease) error {
				left, err := deduct(order, l)
				record(order, l.Token(), left, err)
				if errors.Is(err, errOutOfStock) {
					return nil
				}
				return err
			})
			if err != nil {
				errs <- fmt.Errorf("order-%d: %w", order, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return res, err
	}

	// Order 1 wakes up, unaware that its lease is gone, and writes anyway.
	_, err = deduct(1, frozen)
	var stale *pgfence.StaleTokenError
	switch {
	case errors.As(err, &stale):
		res.StaleRejected = true
		say("order-1 woke up and wrote with token %d: REJECTED by the database (token %d was accepted since)", stale.Presented, stale.Accepted)
	case err == nil:
		res.Accepted++
		res.Deducted += quantity
		say("order-1 woke up and wrote with token %d: ACCEPTED (the fence did not hold!)", frozen.Token())
	default:
		return res, fmt.Errorf("order-1: %w", err)
	}
	if err := frozen.Release(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		return res, fmt.Errorf("order-1 release: want ErrLeaseLost, got %v", err)
	}

	// An old binary that knows nothing about tokens writes the table directly.
	_, err = pool.Exec(ctx, `UPDATE example_inventory SET stock = stock - 1 WHERE sku = $1`, sku)
	// A raw pgx call is not mapped to Go sentinels: match the SQLSTATE, as any
	// client in any language would.
	var pgErr *pgconn.PgError
	res.UnfencedRejected = errors.As(err, &pgErr) && pgErr.Code == "PF006"
	if res.UnfencedRejected {
		say("an old binary ran UPDATE … SET stock = stock - 1 without a token: REJECTED (SQLSTATE PF006, unfenced write)")
	} else {
		say("an old binary ran UPDATE … SET stock = stock - 1 without a token: %v", err)
	}

	// Check the business state, not the lock.
	if err := pool.QueryRow(ctx, `SELECT (SELECT stock FROM example_inventory WHERE sku = $1), (SELECT count(*) FROM example_orders)`, sku).
		Scan(&res.FinalStock, &res.OrdersInTable); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "result: stock %d = %d − %d deducted by %d accepted orders; %d out of stock; late write rejected: %t; unfenced write rejected: %t\n",
		res.FinalStock, initialStock, res.Deducted, res.Accepted, res.OutOfStock, res.StaleRejected, res.UnfencedRejected)
	switch {
	case res.FinalStock != initialStock-res.Deducted || res.FinalStock < 0:
		return res, fmt.Errorf("lost update or oversell: stock %d, want %d", res.FinalStock, initialStock-res.Deducted)
	case res.OrdersInTable != res.Accepted:
		return res, fmt.Errorf("%d orders stored, %d accepted", res.OrdersInTable, res.Accepted)
	case !res.StaleRejected || !res.UnfencedRejected:
		return res, errors.New("a stale or unfenced write got through")
	}
	fmt.Fprintln(out, "OK: no oversell, no lost update")
	return res, nil
}
