// Command gorm deducts stock with GORM, the deduction fenced by a lease
// token inside GORM's own transaction: the order row GORM inserts, the fence
// and the stock update commit together or not at all.
//
// Two holders take turns on the lease of one SKU. Holder A takes the lease
// and freezes (a simulated GC pause) past its expiry; holder B takes the
// lease over and deducts; when A wakes up and deducts, PostgreSQL refuses its
// token, GORM rolls back A's whole transaction, and no order row, no stock
// change of A's remains.
//
// The lease is granted through SQL on GORM's *sql.DB and wrapped with
// pgfence.LeaseOf: a service with only a database/sql handle needs nothing
// else. (A service that also has a pgx pool can use the leases package and
// pass its *leases.Lease instead.)
//
// Run it from examples/orm:
//
//	go run ./gorm                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./gorm
//
// It exits non-zero if the stale holder's write got through.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	sku          = "sku-1"
	initialStock = 10
	quantity     = 2
	leaseTTL     = 300 * time.Millisecond
)

// Item and Order are the team's GORM models.
type Item struct {
	SKU   string `gorm:"primaryKey;column:sku"`
	Stock int    `gorm:"not null"`
}

// Order is one accepted deduction.
type Order struct {
	ID       uint   `gorm:"primaryKey"`
	SKU      string `gorm:"column:sku;not null"`
	Quantity int    `gorm:"not null"`
	Holder   string `gorm:"not null"`
}

func (Item) TableName() string  { return "example_gorm_items" }
func (Order) TableName() string { return "example_gorm_orders" }

func main() {
	pgfencetest.Run("gorm", func(ctx context.Context, db *pgfencetest.Database) error {
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
	Orders        []string // holders whose orders were stored
	StaleRejected bool     // A's late deduction was refused
}

func (r result) ok() bool {
	return r.StaleRejected && r.FinalStock == initialStock-quantity && len(r.Orders) == 1 && r.Orders[0] == "B"
}

func run(ctx context.Context, url string, out io.Writer) (result, error) {
	var res result
	gdb, err := gorm.Open(postgres.Open(url), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return res, err
	}
	sqlDB, err := gdb.DB()
	if err != nil {
		return res, err
	}
	defer sqlDB.Close()
	if err := gdb.Migrator().DropTable(&Order{}, &Item{}); err != nil {
		return res, err
	}
	if err := gdb.AutoMigrate(&Item{}, &Order{}); err != nil {
		return res, err
	}
	if err := gdb.Create(&Item{SKU: sku, Stock: initialStock}).Error; err != nil {
		return res, err
	}

	// A takes the lease, then freezes past its expiry.
	a, err := acquire(ctx, sqlDB, "stock:"+sku)
	if err != nil {
		return res, err
	}
	fmt.Fprintf(out, "  A holds the lease (token %d) and freezes\n", a.Token())
	time.Sleep(leaseTTL + 200*time.Millisecond)

	// B takes it over and deducts.
	b, err := acquire(ctx, sqlDB, "stock:"+sku)
	if err != nil {
		return res, err
	}
	if err := deduct(ctx, gdb, b, "B"); err != nil {
		return res, fmt.Errorf("deduction of B: %w", err)
	}
	fmt.Fprintf(out, "  B took over (token %d) and deducted %d\n", b.Token(), quantity)

	// A wakes up and deducts with its old token: refused, rolled back.
	err = deduct(ctx, gdb, a, "A")
	var stale *pgfence.StaleTokenError
	switch {
	case errors.As(err, &stale):
		res.StaleRejected = true
		fmt.Fprintf(out, "  A woke up: refused (token %d, %d accepted): its order row rolled back with it\n", stale.Presented, stale.Accepted)
	case err != nil:
		return res, fmt.Errorf("deduction of A: %w", err)
	default:
		fmt.Fprintln(out, "  A woke up and deducted: the stale write got through")
	}

	var item Item
	if err := gdb.First(&item, "sku = ?", sku).Error; err != nil {
		return res, err
	}
	res.FinalStock = item.Stock
	if err := gdb.Model(&Order{}).Order("id").Pluck("holder", &res.Orders).Error; err != nil {
		return res, err
	}
	fmt.Fprintf(out, "  stock %d (from %d), orders by %v\n", res.FinalStock, initialStock, res.Orders)
	return res, nil
}

// deduct records an order and deducts stock in one GORM transaction; the
// deduction is fenced by the lease's token. pgfence.WriteSQL runs the fence in a
// savepoint of GORM's *sql.Tx and fn keeps using GORM's tx: everything is
// one transaction, which GORM commits, or rolls back when an error returns.
func deduct(ctx context.Context, gdb *gorm.DB, lease pgfence.Lease, holder string) error {
	return gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{SKU: sku, Quantity: quantity, Holder: holder}).Error; err != nil {
			return err
		}
		sqlTx, ok := tx.Statement.ConnPool.(*sql.Tx)
		if !ok {
			return fmt.Errorf("GORM's transaction is a %T, not a *sql.Tx (PrepareStmt mode?)", tx.Statement.ConnPool)
		}
		_, err := pgfence.WriteSQL(ctx, sqlTx, lease, func(ctx context.Context, _ *sql.Tx) error {
			r := tx.Model(&Item{}).Where("sku = ? AND stock >= ?", sku, quantity).
				Update("stock", gorm.Expr("stock - ?", quantity))
			if r.Error == nil && r.RowsAffected != 1 {
				return errors.New("out of stock")
			}
			return r.Error
		})
		return err
	})
}

// acquire grants the lease on key through SQL (autocommit), as a service
// without the leases package does, and wraps the grant for pgfence.WriteSQL.
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
