// Command hotsku shows a hot SKU that many orders decrement, two ways: every
// order takes the SKU's lease and writes under it (the lock way), or every
// order hands its intent over as an ordered task and one consumer at a time
// applies the SKU's tasks in batches (the ordered-task way).
//
// The lock way holds a request (and a connection) per waiting order while
// the lease passes from one to the next, one business transaction per
// grant. The ordered-task way answers each order at once with a task id (an
// HTTP API would answer 202 Accepted and let the client poll the status);
// a consumer numbers the SKU's tasks gaplessly in the order they were
// enqueued and applies them in that order, many per transaction, each
// decrement committed with its task's result.
//
// Both ways must sell exactly the stock and never more; the ordered-task way
// also sells it to the first orders in sequence order.
//
// Run it:
//
//	go run ./examples/hotsku                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/hotsku
//
// It exits non-zero if either way oversold, lost an order or (tasks) sold
// out of sequence order.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	stock   = 150 // units of the SKU, per way
	orders  = 200 // orders of one unit, per way
	callers = 32  // concurrent request handlers
)

func main() {
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("hotsku", func(ctx context.Context, db *pgfencetest.Database) error {
		_, err := run(ctx, db.Pool, os.Stdout)
		return err
	})
}

// outcome is one way's business outcome, checked by main_test.go.
type outcome struct {
	Sold, Refused, Left int
	InSeqOrder          bool // tasks: the sold orders are the first in sequence order
	Elapsed             time.Duration
}

type result struct{ Lock, Tasks outcome }

func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (result, error) {
	var res result
	// A run id keeps a rerun on the same database from meeting the previous
	// run's lease and task keys.
	runID := time.Now().UnixNano()
	if _, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS example_hot_stock, example_hot_orders;
		CREATE TABLE example_hot_stock (way text PRIMARY KEY, qty int NOT NULL CHECK (qty >= 0));
		CREATE TABLE example_hot_orders (way text, id int, sold boolean NOT NULL, seq bigint, PRIMARY KEY (way, id));`); err != nil {
		return res, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO example_hot_stock VALUES ('lock', $1), ('tasks', $1)`, stock); err != nil {
		return res, err
	}
	client, err := leases.New(pool, nil)
	if err != nil {
		return res, err
	}
	defer client.Close()
	fmt.Fprintf(out, "hotsku: %d orders of one unit for %d units, from %d concurrent callers, two ways\n", orders, stock, callers)

	// The lock way: each order waits for the SKU's lease, then decrements
	// with a fenced write.
	lockKey := fmt.Sprintf("hotsku/%d/lock", runID)
	start := time.Now()
	err = forEachOrder(func(id int) error {
		return client.Do(ctx, lockKey, 5*time.Second, nil, func(ctx context.Context, l *leases.Lease) error {
			_, err := pgfence.Write(ctx, pool, l, func(ctx context.Context, tx pgx.Tx) error {
				return sell(ctx, tx, "lock", id, 0)
			})
			return err
		})
	})
	if err != nil {
		return res, fmt.Errorf("lock way: %w", err)
	}
	res.Lock.Elapsed = time.Since(start)

	// The ordered-task way: each order enqueues and returns; one consumer
	// at a time applies the SKU's tasks, in order, in batches.
	taskKey := fmt.Sprintf("hotsku/%d/tasks", runID)
	consumer, err := tasks.NewConsumer(client, func(ctx context.Context, tx pgx.Tx, batch []tasks.Task) ([]json.RawMessage, error) {
		results := make([]json.RawMessage, 0, len(batch))
		for _, t := range batch {
			var order struct{ ID int }
			if err := json.Unmarshal(t.Payload, &order); err != nil {
				return results, err
			}
			if err := sell(ctx, tx, "tasks", order.ID, t.Seq); err != nil {
				return results, err
			}
			results = append(results, nil)
		}
		return results, nil
	}, &tasks.Config{Prefix: taskKey, PollInterval: 10 * time.Millisecond})
	if err != nil {
		return res, err
	}
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	consumed := make(chan error, 2)
	for range 2 { // a second consumer stands by: one key has one consumer at a time
		go func() { consumed <- consumer.Run(cctx) }()
	}
	start = time.Now()
	ids := make([]int64, orders+1)
	err = forEachOrder(func(id int) error {
		t, err := tasks.Enqueue(ctx, pool, taskKey, fmt.Appendf(nil, `{"id":%d}`, id), nil)
		ids[id] = t.ID // the caller answers "processing" with it
		return err
	})
	if err != nil {
		return res, fmt.Errorf("tasks way: %w", err)
	}
	enqueued := time.Since(start)
	for id := 1; id <= orders; id++ { // the callers poll their orders' status
		for {
			st, err := tasks.Status(ctx, pool, ids[id])
			if err != nil {
				return res, err
			}
			if st.State == tasks.StateDone {
				break
			}
			if st.State != tasks.StatePending && st.State != tasks.StateRunning {
				return res, fmt.Errorf("order %d: task %s: %s", id, st.State, st.Error)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	res.Tasks.Elapsed = time.Since(start)
	stop()
	for range 2 {
		if err := <-consumed; err != nil {
			return res, err
		}
	}

	for _, w := range []struct {
		way string
		o   *outcome
	}{{"lock", &res.Lock}, {"tasks", &res.Tasks}} {
		if err := pool.QueryRow(ctx, `SELECT (SELECT qty FROM example_hot_stock WHERE way = $1),
		        count(*) FILTER (WHERE sold), count(*) FILTER (WHERE NOT sold),
		        coalesce(bool_and(sold = (seq <= $2)), false)
		   FROM example_hot_orders WHERE way = $1`, w.way, stock).Scan(&w.o.Left, &w.o.Sold, &w.o.Refused, &w.o.InSeqOrder); err != nil {
			return res, err
		}
	}
	fmt.Fprintf(out, "  lock way:  sold %d, refused %d, %d left; %s until the last order was answered\n",
		res.Lock.Sold, res.Lock.Refused, res.Lock.Left, res.Lock.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(out, "  tasks way: sold %d, refused %d, %d left, sold to the first %d in sequence order: %t;\n"+
		"             every order answered \"processing\" within %s, the last applied after %s\n",
		res.Tasks.Sold, res.Tasks.Refused, res.Tasks.Left, stock, res.Tasks.InSeqOrder,
		enqueued.Round(time.Millisecond), res.Tasks.Elapsed.Round(time.Millisecond))
	for _, o := range []outcome{res.Lock, res.Tasks} {
		if o.Sold != stock || o.Refused != orders-stock || o.Left != 0 {
			return res, errors.New("hotsku: an order was oversold or lost")
		}
	}
	if !res.Tasks.InSeqOrder {
		return res, errors.New("hotsku: the ordered tasks were not sold in sequence order")
	}
	return res, nil
}

// sell records order id of way, sold if a unit was left (and taken).
func sell(ctx context.Context, tx pgx.Tx, way string, id int, seq int64) error {
	tag, err := tx.Exec(ctx, `UPDATE example_hot_stock SET qty = qty - 1 WHERE way = $1 AND qty > 0`, way)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO example_hot_orders VALUES ($1, $2, $3, nullif($4, 0))`, way, id, tag.RowsAffected() == 1, seq)
	return err
}

// forEachOrder runs order(1..orders) on callers goroutines and returns the
// first error.
func forEachOrder(order func(id int) error) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, callers)
	)
	for range callers {
		wg.Go(func() {
			for id := int(next.Add(1)); id <= orders; id = int(next.Add(1)) {
				if err := order(id); err != nil {
					errs <- fmt.Errorf("order %d: %w", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
