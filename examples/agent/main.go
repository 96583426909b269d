// Command agent shows an AI agent's multi-step tool call that survives a crash
// without doing any external effect twice.
//
// The task "refund order 42" has two external steps: refund the payment, then
// e-mail the customer. The task is a leased idempotency key: one agent owns it
// at a time, records a recovery point after the refund, and hands each tool a
// key derived from the task key (Attempt.DerivedKey), which the tools use to
// deduplicate. agent-a refunds, records the point, sends the e-mail and crashes
// before completing the task. agent-b and agent-c both retry the task:
// once agent-a's lease has expired one of them takes it over, skips the refund
// (the recovery point says it is done), sends the e-mail again with the same
// derived key, which the mail tool recognises, and completes the task; the
// other gets the stored result.
//
// Run it:
//
//	go run ./examples/agent                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/agent
//
// It exits non-zero unless the customer was refunded once and e-mailed once,
// and agent-b and agent-c end with the same result.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const lease = time.Second // how long a crashed agent blocks the task

func main() {
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("agent", func(ctx context.Context, db *pgfencetest.Database) error {
		_, err := run(ctx, db.Pool, os.Stdout)
		return err
	})
}

// tool simulates an external API that deduplicates by an idempotency key, as
// payment providers do: a repeated key returns the first answer and does
// nothing. Effects counts what really happened.
type tool struct {
	name    string
	mu      sync.Mutex
	seen    map[string]string
	Calls   int
	Effects int
}

func (t *tool) call(key string) (id string, duplicate bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.Calls++
	if id, ok := t.seen[key]; ok {
		return id, true
	}
	t.Effects++
	id = fmt.Sprintf("%s_%d", t.name, t.Effects)
	t.seen[key] = id
	return id, false
}

// result is the business outcome, checked by main_test.go.
type result struct {
	Refunds, Mails *tool
	Results        map[string]string // agent → the task result it ended with
	TakenOver      bool
	ZombieRefused  bool // agent-a's attempt could no longer complete the task
}

var errCrash = errors.New("crashed")

func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (result, error) {
	res := result{
		Refunds: &tool{name: "re", seen: map[string]string{}},
		Mails:   &tool{name: "mail", seen: map[string]string{}},
		Results: map[string]string{},
	}
	var mu sync.Mutex // serialises output and res
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "  "+format+"\n", args...)
	}

	store, err := idempotency.NewStore(&idempotency.Config{Lease: lease})
	if err != nil {
		return res, err
	}
	// The scope names the operation; a run id keeps reruns on the same
	// database apart. The key names the business intent, not the attempt.
	runID := make([]byte, 4)
	rand.Read(runID)
	req := idempotency.Request{
		Scope:   "agent.refund/run-" + hex.EncodeToString(runID),
		Key:     "refund-order-42",
		Payload: []byte(`{"amount":30,"order":42}`),
	}
	fmt.Fprintf(out, "agent: task %q = refund 30 to the customer, then e-mail them; 3 agents, agent-a crashes mid-way\n", req.Key)

	var crashed *idempotency.Attempt // agent-a's attempt, for the zombie check
	// work runs the task's steps from the attempt's recovery point on.
	work := func(name string, a *idempotency.Attempt) (string, error) {
		refund := string(a.RecoveryData())
		if a.RecoveryPoint() == "" {
			// Step 1: the refund. The tool gets a key derived from the task,
			// the same for every agent, so a repeat would be deduplicated.
			id, dup := res.Refunds.call(a.DerivedKey("payment"))
			say("%s: refund tool called with key %q → %s (duplicate: %t)", name, a.DerivedKey("payment"), id, dup)
			if err := a.Advance(ctx, "refunded", []byte(id)); err != nil {
				return "", err
			}
			refund = id
		} else {
			say("%s: resumes at recovery point %q (refund %s): skips the refund", name, a.RecoveryPoint(), refund)
		}
		// Step 2: the e-mail.
		id, dup := res.Mails.call(a.DerivedKey("email"))
		say("%s: mail tool called with key %q → %s (duplicate: %t)", name, a.DerivedKey("email"), id, dup)
		if name == "agent-a" {
			// The crash: after the e-mail went out, before the recovery point
			// was recorded. No release, no heartbeat: the lease runs out.
			say("%s: CRASHED before recording that the e-mail was sent", name)
			crashed = a
			return "", errCrash
		}
		result := "refunded " + refund + ", notified by " + id
		if _, err := a.Complete(ctx, []byte(result)); err != nil {
			return "", err
		}
		say("%s: completed the task", name)
		return result, nil
	}

	// agent runs the task until it completes or is found completed, retrying
	// while another agent holds it.
	agent := func(name string) error {
		for {
			o, err := store.Claim(ctx, pool, req)
			var busy *idempotency.InProgressError
			switch {
			case errors.As(err, &busy):
				select { // a bounded wait: the hint is the rest of the owner's lease
				case <-time.After(min(busy.RetryAfter, 100*time.Millisecond) + 10*time.Millisecond):
					continue
				case <-ctx.Done():
					return ctx.Err()
				}
			case err != nil:
				return err
			case o.Replayed:
				mu.Lock()
				res.Results[name] = string(o.Result)
				mu.Unlock()
				say("%s: task already done, stored result %q", name, o.Result)
				return nil
			}
			if o.Attempt.Epoch() > 1 {
				say("%s: took the task over (epoch %d)", name, o.Attempt.Epoch())
			}
			r, err := work(name, o.Attempt)
			if err != nil {
				return err
			}
			mu.Lock()
			res.Results[name], res.TakenOver = r, o.Attempt.Epoch() > 1
			mu.Unlock()
			return nil
		}
	}

	// agent-a starts alone and crashes; then agent-b and agent-c compete.
	if err := agent("agent-a"); !errors.Is(err, errCrash) {
		return res, fmt.Errorf("agent-a: %v, want the injected crash", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, name := range []string{"agent-b", "agent-c"} {
		wg.Go(func() {
			if err := agent(name); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return res, err
	}

	// Had agent-a only frozen instead of crashing, its attempt would wake up
	// replaced: the key refuses its writes.
	_, err = crashed.Complete(ctx, []byte("refunded by agent-a"))
	res.ZombieRefused = errors.Is(err, idempotency.ErrLeaseLost)
	if res.ZombieRefused {
		say("agent-a's old attempt, woken up late, tries to complete the task: REFUSED (not the current owner)")
	} else {
		say("agent-a's old attempt, woken up late, tries to complete the task: %v", err)
	}

	// Check the external effects, not the key.
	fmt.Fprintf(out, "result: refunds made %d (tool calls %d), e-mails sent %d (tool calls %d); result %q\n",
		res.Refunds.Effects, res.Refunds.Calls, res.Mails.Effects, res.Mails.Calls, res.Results["agent-b"])
	if res.Refunds.Effects != 1 || res.Mails.Effects != 1 {
		return res, errors.New("an external effect happened more than once")
	}
	if res.Results["agent-b"] == "" || res.Results["agent-b"] != res.Results["agent-c"] || !res.TakenOver || !res.ZombieRefused {
		return res, fmt.Errorf("agents ended with different results: %q", res.Results)
	}
	fmt.Fprintln(out, "OK: refunded once, e-mailed once, one result for everyone")
	return res, nil
}
