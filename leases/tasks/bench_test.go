package tasks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// benchPool is a pool with room for every goroutine of b.RunParallel.
func benchPool(b *testing.B, parallelism int) *pgxpool.Pool {
	b.Helper()
	db := pgfencetest.NewDatabase(b)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(parallelism * 2)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// Enqueues from many producers: on one hot key with no consumer (the
// backlog grows), on keys spread over 100,000 (none held by a consumer: each
// enqueue notifies), on one hot key while a consumer applies it; against the
// floor of any queue in this database, a bare INSERT of the same rows; and
// one consumer applying a hot key's tasks. Run:
//
//	go test ./leases/tasks -run '^$' -bench 'HotKey' -benchtime 3s -cpu 2
func BenchmarkHotKey(b *testing.B) {
	const producers = 16 // goroutines per GOMAXPROCS
	b.Run("enqueue", func(b *testing.B) {
		pool := benchPool(b, producers*2)
		b.SetParallelism(producers)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := tasks.Enqueue(context.Background(), pool, "hot", []byte(`{"qty":1}`), &tasks.EnqueueOptions{MaxBacklog: 1000000}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("enqueue-spread", func(b *testing.B) {
		pool := benchPool(b, producers*2)
		b.SetParallelism(producers)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := tasks.Enqueue(context.Background(), pool, fmt.Sprint("k", rand.IntN(100000)), []byte(`{"qty":1}`), nil); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("enqueue-consumed", func(b *testing.B) {
		pool := benchPool(b, producers*2)
		c, err := tasks.NewConsumer(newClient(b, pool, nil), func(ctx context.Context, tx pgx.Tx, batch []tasks.Task) ([]json.RawMessage, error) {
			return make([]json.RawMessage, len(batch)), nil
		}, &tasks.Config{PollInterval: time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		cctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(cctx) }()
		b.SetParallelism(producers)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := tasks.Enqueue(context.Background(), pool, "hot", []byte(`{"qty":1}`), &tasks.EnqueueOptions{MaxBacklog: 1000000}); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.StopTimer()
		stop()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	})
	b.Run("bare-insert", func(b *testing.B) {
		pool := benchPool(b, producers*2)
		if _, err := pool.Exec(context.Background(), `CREATE TABLE bare (id bigserial PRIMARY KEY, key text NOT NULL, payload jsonb NOT NULL, enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
			b.Fatal(err)
		}
		b.SetParallelism(producers)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := pool.Exec(context.Background(), `INSERT INTO bare (key, payload) VALUES ($1, $2)`, "hot", `{"qty":1}`); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	// One consumer applying b.N tasks of the hot key, 100 per transaction,
	// each an UPDATE of one stock row.
	b.Run("apply", func(b *testing.B) {
		pool := benchPool(b, 2)
		ctx := context.Background()
		if _, err := pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, qty bigint NOT NULL)`); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO stock VALUES ('hot', 0)`); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO pgfence.tasks (id, key, xid, payload, enqueued_by, enqueued_at)
			SELECT nextval('pgfence.task_ids'), 'hot', pg_current_xact_id(), '{"qty":1}', current_user, clock_timestamp() FROM generate_series(1, $1)`, b.N); err != nil {
			b.Fatal(err)
		}
		c, err := tasks.NewConsumer(newClient(b, pool, nil), func(ctx context.Context, tx pgx.Tx, batch []tasks.Task) ([]json.RawMessage, error) {
			if _, err := tx.Exec(ctx, `UPDATE stock SET qty = qty + $1 WHERE sku = 'hot'`, len(batch)); err != nil {
				return nil, err
			}
			return make([]json.RawMessage, len(batch)), nil
		}, &tasks.Config{PollInterval: time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(cctx) }()
		for {
			var n int
			if err := pool.QueryRow(ctx, `SELECT qty FROM stock`).Scan(&n); err != nil {
				b.Fatal(err)
			}
			if n >= b.N {
				break
			}
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		stop()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	})
}
