package tasks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/tasks"
)

// The business of the tests: each task appends a row to ledger (its key,
// id and number), in the consumer's transaction. A task whose payload has
// "hold": true waits, once per process, inside that transaction until the
// process is released, stopped or killed.
const ledgerDDL = `CREATE TABLE ledger (n bigserial PRIMARY KEY, key text NOT NULL, task bigint NOT NULL, seq bigint NOT NULL, by text NOT NULL)`

type payload struct {
	Hold bool `json:"hold,omitempty"`
	I    int  `json:"i"`
}

// ledgerApply is the ApplyFunc of the tests: it records each task in the
// ledger; a task to hold signals held and waits for release (or ctx).
func ledgerApply(by string, held func(tasks.Task), release <-chan struct{}) tasks.ApplyFunc {
	var once sync.Once
	return func(ctx context.Context, tx pgx.Tx, batch []tasks.Task) ([]json.RawMessage, error) {
		results := make([]json.RawMessage, 0, len(batch))
		for _, t := range batch {
			var p payload
			if err := json.Unmarshal(t.Payload, &p); err != nil {
				return results, err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, task, seq, by) VALUES ($1, $2, $3, $4)`, t.Key, t.ID, t.Seq, by); err != nil {
				return results, err
			}
			if p.Hold && held != nil {
				hold := false
				once.Do(func() { hold = true })
				if hold {
					held(t)
					select {
					case <-release:
					case <-ctx.Done():
						return results, ctx.Err()
					}
				}
			}
			results = append(results, json.RawMessage(fmt.Sprintf(`{"seq":%d}`, t.Seq)))
		}
		return results, nil
	}
}

// A consumer worker runs a Consumer (with ledgerApply) until its stdin
// closes; "status" reports the task it holds and the warnings it logged.

type consumerArgs struct {
	URL string        `json:"url"`
	TTL time.Duration `json:"ttl"`
}

type consumerStatus struct {
	Held     int64    `json:"held"`
	Warnings []string `json:"warnings"`
}

var worker struct {
	mu      sync.Mutex
	status  consumerStatus
	release chan struct{}
}

type recorder struct{ slog.Handler }

func (recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r recorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	worker.mu.Lock()
	worker.status.Warnings = append(worker.status.Warnings, b.String())
	worker.mu.Unlock()
	return nil
}

func serveConsumer(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	switch op {
	case "open":
		var a consumerArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, err
		}
		pool, err := pgxpool.New(context.Background(), a.URL)
		if err != nil {
			return nil, err
		}
		client, err := leases.New(pool, nil)
		if err != nil {
			return nil, err
		}
		worker.release = make(chan struct{})
		held := func(t tasks.Task) {
			worker.mu.Lock()
			worker.status.Held = t.ID
			worker.mu.Unlock()
		}
		c, err := tasks.NewConsumer(client, ledgerApply("worker", held, worker.release),
			&tasks.Config{TTL: a.TTL, PollInterval: 20 * time.Millisecond, Logger: slog.New(recorder{slog.DiscardHandler})})
		if err != nil {
			return nil, err
		}
		go func() { _ = c.Run(context.Background()) }() // until the process ends
		return "ok", nil
	case "status":
		worker.mu.Lock()
		defer worker.mu.Unlock()
		return worker.status, nil
	case "release":
		close(worker.release)
		return "ok", nil
	}
	return nil, fmt.Errorf("unknown op %q", op)
}
