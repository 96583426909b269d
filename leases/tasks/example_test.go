package tasks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Orders of one hot SKU are enqueued without a lock, and a consumer applies
// them in order, each decrement with its task's completion; a client polls
// the status of its order.
func Example() {
	db, err := pgfencetest.Open() // a fresh migrated database; use your own pool
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL CHECK (qty >= 0));
		INSERT INTO stock VALUES ('sku-42', 2)`); err != nil {
		fmt.Println(err)
		return
	}

	// Producers: one statement each, no lock, no wait.
	var ids []int64
	for order := 1; order <= 3; order++ {
		task, err := tasks.Enqueue(ctx, db.Pool, "stock/sku-42", []byte(fmt.Sprintf(`{"order":%d}`, order)), nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		ids = append(ids, task.ID) // answer "processing", with the task id
	}

	// The consumer: each batch's decrements and results commit together.
	client, err := leases.New(db.Pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	consumer, err := tasks.NewConsumer(client, func(ctx context.Context, tx pgx.Tx, batch []tasks.Task) ([]json.RawMessage, error) {
		results := make([]json.RawMessage, 0, len(batch))
		for range batch {
			tag, err := tx.Exec(ctx, `UPDATE stock SET qty = qty - 1 WHERE sku = 'sku-42' AND qty > 0`)
			if err != nil {
				return results, err
			}
			results = append(results, json.RawMessage(fmt.Sprintf(`{"reserved": %t}`, tag.RowsAffected() == 1)))
		}
		return results, nil
	}, &tasks.Config{PollInterval: 10 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx) }()
	defer func() { stop(); <-done }()

	// The client polls its orders' status.
	for _, id := range ids {
		for {
			st, err := tasks.Status(ctx, db.Pool, id)
			if err != nil {
				fmt.Println(err)
				return
			}
			if st.State == tasks.StateDone {
				fmt.Println("seq", st.Seq, st.State, string(st.Result))
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// Output:
	// seq 1 done {"reserved": true}
	// seq 2 done {"reserved": true}
	// seq 3 done {"reserved": false}
}
