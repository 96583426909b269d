// Command sqlc deducts stock with sqlc-style database/sql code over lib/pq,
// the deduction fenced by a lease token inside the caller's own *sql.Tx:
// the order row, the fence and the stock update commit together or not at
// all.
//
// The queries below have the shape sqlc generates in its database/sql mode
// (a Queries type over a DBTX interface, WithTx for a transaction); they are
// written out here so that the example needs no code generation. Generated
// code is used the same way: pass the *sql.Tx to pgfence.WriteSQL and to
// Queries.WithTx.
//
// Holder A takes the lease on a SKU and freezes past its expiry; holder B
// takes it over and deducts; A wakes up and deducts with its old token:
// PostgreSQL refuses it, A's transaction rolls back, and nothing of A's
// remains.
//
// Run it from examples/orm:
//
//	go run ./sqlc                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./sqlc
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	_ "github.com/lib/pq" // the "postgres" database/sql driver

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	sku          = "sku-1"
	initialStock = 10
	quantity     = 2
	leaseTTL     = 300 * time.Millisecond
)

// DBTX, Queries and WithTx are what sqlc generates.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Queries runs the team's queries on a pool or a transaction.
type Queries struct{ db DBTX }

// New returns Queries on db.
func New(db DBTX) *Queries { return &Queries{db: db} }

// WithTx returns Queries on tx.
func (q *Queries) WithTx(tx *sql.Tx) *Queries { return &Queries{db: tx} }

const createOrder = `INSERT INTO example_sqlc_orders (sku, quantity, holder) VALUES ($1, $2, $3)`

// CreateOrder records one order.
func (q *Queries) CreateOrder(ctx context.Context, sku string, quantity int, holder string) error {
	_, err := q.db.ExecContext(ctx, createOrder, sku, quantity, holder)
	return err
}

const deductStock = `UPDATE example_sqlc_items SET stock = stock - $2 WHERE sku = $1 AND stock >= $2`

// DeductStock takes quantity off sku's stock, if there is enough.
func (q *Queries) DeductStock(ctx context.Context, sku string, quantity int) (int64, error) {
	r, err := q.db.ExecContext(ctx, deductStock, sku, quantity)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

func main() {
	pgfencetest.Run("sqlc", func(ctx context.Context, db *pgfencetest.Database) error {
		res, err := run(ctx, db.URL, os.Stdout)
		if err == nil && !res.ok() {
			err = fmt.Errorf("invariant broken: %+v", res)
		}
		return err
	})
}

// result is the business outcome, checked by main_test.go.
type result struct {
	FinalStock    int
	Orders        int // rows in the orders table
	StaleRejected bool
}

func (r result) ok() bool {
	return r.StaleRejected && r.FinalStock == initialStock-quantity && r.Orders == 1
}

func run(ctx context.Context, url string, out io.Writer) (result, error) {
	var res result
	db, err := sql.Open("postgres", url)
	if err != nil {
		return res, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `
		DROP TABLE IF EXISTS example_sqlc_orders, example_sqlc_items;
		CREATE TABLE example_sqlc_items (sku text PRIMARY KEY, stock int NOT NULL);
		CREATE TABLE example_sqlc_orders (id serial PRIMARY KEY, sku text NOT NULL, quantity int NOT NULL, holder text NOT NULL);
		INSERT INTO example_sqlc_items VALUES ('sku-1', 10)`); err != nil {
		return res, err
	}
	queries := New(db)

	a, err := acquire(ctx, db, "stock:"+sku)
	if err != nil {
		return res, err
	}
	fmt.Fprintf(out, "  A holds the lease (token %d) and freezes\n", a.Token())
	time.Sleep(leaseTTL + 200*time.Millisecond)

	b, err := acquire(ctx, db, "stock:"+sku)
	if err != nil {
		return res, err
	}
	if err := deduct(ctx, db, queries, b, "B"); err != nil {
		return res, fmt.Errorf("deduction of B: %w", err)
	}
	fmt.Fprintf(out, "  B took over (token %d) and deducted %d\n", b.Token(), quantity)

	err = deduct(ctx, db, queries, a, "A")
	switch {
	case errors.Is(err, pgfence.ErrStaleToken):
		res.StaleRejected = true
		fmt.Fprintf(out, "  A woke up: %v; its transaction rolled back\n", err)
	case err != nil:
		return res, fmt.Errorf("deduction of A: %w", err)
	default:
		fmt.Fprintln(out, "  A woke up and deducted: the stale write got through")
	}

	if err := db.QueryRowContext(ctx, `SELECT stock FROM example_sqlc_items WHERE sku = $1`, sku).Scan(&res.FinalStock); err != nil {
		return res, err
	}
	if err := db.QueryRowContext(ctx, `SELECT pg_catalog.count(*) FROM example_sqlc_orders`).Scan(&res.Orders); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "  stock %d (from %d), %d order(s)\n", res.FinalStock, initialStock, res.Orders)
	return res, nil
}

// deduct records the order and deducts the stock in the caller's
// transaction, the deduction fenced by lease: all of it commits, or none.
func deduct(ctx context.Context, db *sql.DB, queries *Queries, lease pgfence.Lease, holder string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit: sql.ErrTxDone
	qtx := queries.WithTx(tx)
	if err := qtx.CreateOrder(ctx, sku, quantity, holder); err != nil {
		return err
	}
	if _, err := pgfence.WriteSQL(ctx, tx, lease, func(ctx context.Context, tx *sql.Tx) error {
		n, err := qtx.DeductStock(ctx, sku, quantity)
		if err == nil && n != 1 {
			err = errors.New("out of stock")
		}
		return err
	}); err != nil {
		return err
	}
	return tx.Commit()
}

// acquire grants the lease on key through SQL (autocommit) and wraps the
// grant for pgfence.WriteSQL.
func acquire(ctx context.Context, db *sql.DB, key string) (pgfence.Lease, error) {
	var ok bool
	var holder sql.NullString
	var token sql.NullInt64
	err := db.QueryRowContext(ctx, `SELECT acquired, holder::pg_catalog.text, token FROM pgfence.try_acquire($1, $2::pg_catalog.interval)`,
		key, leaseTTL.String()).Scan(&ok, &holder, &token)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("lease %s is held", key)
	}
	return pgfence.LeaseOf(key, holder.String, token.Int64), nil
}
