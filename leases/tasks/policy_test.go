package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// failing applies tasks like ledgerApply, and fails the ones whose payload
// says {"fail": true}.
func failing(ctx context.Context, tx pgx.Tx, batch []tasks.Task) ([]json.RawMessage, error) {
	results := make([]json.RawMessage, 0, len(batch))
	for _, t := range batch {
		var p struct{ Fail bool }
		_ = json.Unmarshal(t.Payload, &p)
		if p.Fail {
			return results, errors.New("out of stock")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, task, seq, by) VALUES ($1, $2, $3, 'c')`, t.Key, t.ID, t.Seq); err != nil {
			return results, err
		}
		results = append(results, nil)
	}
	return results, nil
}

func until(t *testing.T, ctx context.Context, pool *pgxpool.Pool, what, query string, args ...any) {
	t.Helper()
	for {
		var ok bool
		if err := pool.QueryRow(ctx, query, args...).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A task that keeps failing ends failed after MaxAttempts with its error. In
// strict order it blocks its key (the task after it waits) until an operator
// skips it; unordered, the task after it goes on at once.
func TestFailedTaskPolicy(t *testing.T) {
	for _, unordered := range []bool{false, true} {
		t.Run(fmt.Sprint("unordered=", unordered), func(t *testing.T) {
			pool := pgfencetest.NewPool(t)
			ctx := ctxTimeout(t, time.Minute)
			if _, err := pool.Exec(ctx, ledgerDDL); err != nil {
				t.Fatal(err)
			}
			var ids []int64
			for _, p := range []string{`{}`, `{"fail":true}`, `{}`} {
				task, err := tasks.Enqueue(ctx, pool, "k", []byte(p), nil)
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, task.ID)
			}
			c, err := tasks.NewConsumer(newClient(t, pool, nil), failing, &tasks.Config{
				MaxAttempts: 3, Backoff: time.Millisecond, Unordered: unordered, PollInterval: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			cctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(cctx) }()
			defer func() { stop(); <-done }()

			until(t, ctx, pool, "the failing task ends failed",
				`SELECT state = 'failed' AND attempts = 3 AND error = 'out of stock' FROM pgfence.tasks WHERE id = $1`, ids[1])
			if unordered {
				until(t, ctx, pool, "the task after it is applied", `SELECT state = 'done' FROM pgfence.tasks WHERE id = $1`, ids[2])
			} else {
				var state string
				var blocked int64
				if err := pool.QueryRow(ctx, `SELECT t.state, k.blocked_by FROM pgfence.tasks t, pgfence.task_keys k WHERE t.id = $1 AND k.key = 'k'`, ids[2]).
					Scan(&state, &blocked); err != nil {
					t.Fatal(err)
				}
				if state != tasks.StatePending || blocked != ids[1] {
					t.Fatalf("the task after the failed one is %s and the key blocked by %d; want pending, blocked by %d", state, blocked, ids[1])
				}
				var pgErr *pgconn.PgError
				if _, err := pool.Exec(ctx, `SELECT pgfence.task_skip($1, '')`, ids[1]); !errors.As(err, &pgErr) || pgErr.Code != "PF008" {
					t.Fatalf("a skip without a reason: %v, want PF008", err)
				}
				if _, err := pool.Exec(ctx, `SELECT pgfence.task_skip($1, 'refunded by hand')`, ids[1]); err != nil {
					t.Fatal(err)
				}
				// The skip is recorded on the task: what, by whom, when, why.
				var op struct{ Action, By, Reason string }
				var at time.Time
				if err := pool.QueryRow(ctx, `SELECT operator->>'action', operator->>'by', operator->>'reason', (operator->>'at')::timestamptz
					FROM pgfence.tasks WHERE id = $1`, ids[1]).Scan(&op.Action, &op.By, &op.Reason, &at); err != nil {
					t.Fatal(err)
				}
				if op.Action != "skip" || op.By == "" || op.Reason != "refunded by hand" || at.IsZero() {
					t.Fatalf("the skipped task records %+v at %v; want the skip, its role and reason", op, at)
				}
				until(t, ctx, pool, "the task after the skipped one is applied", `SELECT state = 'done' FROM pgfence.tasks WHERE id = $1`, ids[2])
			}
			var order string
			if err := pool.QueryRow(ctx, `SELECT string_agg(task::text, ',' ORDER BY n) FROM ledger`).Scan(&order); err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("%d,%d", ids[0], ids[2]); order != want {
				t.Fatalf("applied %s, want %s", order, want)
			}
		})
	}
}
