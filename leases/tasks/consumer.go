package tasks

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// The defaults of [Config].
const (
	batchDefault        = 100
	maxAttemptsDefault  = 5
	backoffDefault      = time.Second
	backoffMaxDefault   = time.Minute
	ttlDefault          = 30 * time.Second
	pollIntervalDefault = time.Second
)

// ApplyFunc applies batch, a key's next tasks in sequence order, in tx, the
// transaction in which the consumer records them done: its writes and the
// tasks' completion commit together or not at all. It returns one result
// per task (JSON, at most [MaxPayloadBytes]; nil for none). An error rolls tx
// back: the task at index len(results) is charged with a failed attempt,
// with the error's text, and the batch is claimed again (from that task, in
// order) after its backoff. ctx ends when the consumer's lease on the key is
// lost; fn must not commit or roll back tx.
type ApplyFunc func(ctx context.Context, tx pgx.Tx, batch []Task) (results []json.RawMessage, err error)

// Config configures a [Consumer]. A nil *Config and zero fields use the
// defaults.
type Config struct {
	// Prefix restricts the consumer to the task keys that start with it.
	// Default "": every key whose lease key ("pgfence.task:" + key) the
	// role may use.
	Prefix string
	// Batch is the most tasks applied in one transaction. Default 100.
	Batch int
	// MaxAttempts is how many failed (or interrupted) attempts a task gets
	// before it ends failed. Default 5, at most 100.
	MaxAttempts int
	// Backoff is the delay before a task's second attempt, doubled for
	// each attempt after it up to BackoffMax, with jitter (half to all of
	// it). Defaults 1 s and 1 min.
	Backoff, BackoffMax time.Duration
	// Unordered lets a key's later tasks go on while a task waits for its
	// retry, and after it failed. By default a key is applied in strict
	// order: a task waiting for its retry holds the key's later tasks back,
	// and a failed one blocks the key until an operator retries or skips it
	// (pgfence.task_retry, pgfence.task_skip).
	Unordered bool
	// TTL is the consumer's lease on a key: a consumer that dies is taken
	// over this long after its last renewal. Default 30 s.
	TTL time.Duration
	// PollInterval is how long an idle consumer waits before it looks for
	// keys with tasks again, unless it hears of a key's first task sooner
	// (LISTEN through the client's connection for it, see
	// [leases.Client.WakeOnTasks]; none with
	// [leases.Config.DisableWakeups], as behind PgBouncer in transaction
	// mode). Default 1 s.
	PollInterval time.Duration
	// Logger receives a warning per failed batch. Default: discard.
	Logger *slog.Logger
}

// Consumer applies the tasks of the keys it claims. Create it with
// [NewConsumer] and call [Consumer.Run], from as many goroutines and
// processes as you like: each key is applied by one of them at a time.
type Consumer struct {
	client *leases.Client
	fn     ApplyFunc
	cfg    Config
}

// NewConsumer returns a consumer that claims keys with client's leases and
// applies their tasks with fn, in client's database.
func NewConsumer(client *leases.Client, fn ApplyFunc, cfg *Config) (*Consumer, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: client: must not be nil", pgfence.ErrInvalid)
	case fn == nil:
		return nil, fmt.Errorf("%w: fn: must not be nil", pgfence.ErrInvalid)
	case len(c.Prefix) > MaxKeyBytes:
		return nil, fmt.Errorf("%w: Config.Prefix: at most %d bytes", pgfence.ErrInvalid, MaxKeyBytes)
	case c.Batch < 0 || c.Batch > 10000:
		return nil, fmt.Errorf("%w: Config.Batch: must be 0 to 10000, got %d", pgfence.ErrInvalid, c.Batch)
	case c.MaxAttempts < 0 || c.MaxAttempts > 100:
		return nil, fmt.Errorf("%w: Config.MaxAttempts: must be 0 to 100, got %d", pgfence.ErrInvalid, c.MaxAttempts)
	case c.Backoff < 0 || c.BackoffMax < 0 || c.TTL < 0 || c.PollInterval < 0:
		return nil, fmt.Errorf("%w: Config: durations must not be negative", pgfence.ErrInvalid)
	}
	c.Batch = cmp.Or(c.Batch, batchDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, maxAttemptsDefault)
	c.Backoff = cmp.Or(c.Backoff, backoffDefault)
	c.BackoffMax = max(cmp.Or(c.BackoffMax, backoffMaxDefault), c.Backoff)
	if c.BackoffMax > 24*time.Hour {
		return nil, fmt.Errorf("%w: Config.BackoffMax: at most 24h", pgfence.ErrInvalid)
	}
	c.TTL = cmp.Or(c.TTL, ttlDefault)
	c.PollInterval = cmp.Or(c.PollInterval, pollIntervalDefault)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	if err := client.Check(LeaseKey(c.Prefix+"x"), c.TTL, nil); err != nil {
		return nil, fmt.Errorf("tasks: Config.TTL %s: %w", c.TTL, err)
	}
	return &Consumer{client: client, fn: fn, cfg: c}, nil
}

// LeaseKey is the key of the lease the consumer of task key holds: grant a
// consumer's role its prefix ("pgfence.task:orders/"); a role granted only
// the producers' prefix ("orders/") cannot take it.
func LeaseKey(key string) string { return "pgfence.task:" + key }

const (
	sqlReadyKeys = `SELECT pgfence.task_ready_keys($1, $2, $3)`
	readyKeys    = 100
	sqlClaim     = `SELECT id, seq, payload, attempts, coalesce(idem_key, ''), enqueued_at
  FROM pgfence.task_claim($1, $2::uuid, $3, $4, $5, $6) ORDER BY seq`
	sqlComplete = `SELECT pgfence.task_complete($1, $2::uuid, $3, $4, $5::jsonb[])`
	sqlFail     = `SELECT pgfence.task_fail($1, $2::uuid, $3, $4, $5, $6)`
)

// Run claims keys with tasks and applies them until ctx ends, and returns
// nil then. It returns early only when the consumer may not work at all
// ([pgfence.ErrNotGranted], [pgfence.ErrInvalid]); other failures (the
// database unreachable, a lease lost) are logged and retried after
// [Config.PollInterval].
func (c *Consumer) Run(ctx context.Context) error {
	wake, stop := c.client.WakeOnTasks(c.cfg.Prefix)
	defer stop()
	after := "" // the next round's list of keys starts after this one
	for ctx.Err() == nil {
		var (
			worked bool
			err    error
		)
		worked, after, err = c.round(ctx, after)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, pgfence.ErrNotGranted) || errors.Is(err, pgfence.ErrInvalid):
			return err
		case err != nil:
			c.cfg.Logger.Warn("pgfence tasks: consumer round failed", "err", err)
		}
		if !worked || err != nil {
			t := time.NewTimer(c.cfg.PollInterval)
			select {
			case <-ctx.Done():
			case <-t.C:
			case <-wake:
			}
			t.Stop()
		}
	}
	return nil
}

// round works once through up to readyKeys keys that have tasks, from the
// first after after, in random order; it reports whether it applied or
// failed any task, and where the next round starts (after this list's last
// key, or from the first key again after a short list).
func (c *Consumer) round(ctx context.Context, after string) (worked bool, next string, err error) {
	rows, _ := c.client.Pool().Query(ctx, sqlReadyKeys, c.cfg.Prefix, readyKeys, after) // an error shows in CollectRows
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return false, after, fmt.Errorf("tasks: list keys with tasks: %w", pgfence.MapError(err))
	}
	if len(keys) == readyKeys {
		next = keys[len(keys)-1]
	}
	rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	var errs []error
	for _, key := range keys {
		if ctx.Err() != nil {
			break
		}
		n := 0
		err := c.client.Do(ctx, LeaseKey(key), c.cfg.TTL, &leases.AcquireOptions{TryOnce: true}, func(ctx context.Context, l *leases.Lease) error {
			var err error
			n, err = c.drain(ctx, l, key)
			return err
		})
		worked = worked || n > 0
		if err != nil && !errors.Is(err, pgfence.ErrLeaseHeld) {
			errs = append(errs, fmt.Errorf("tasks: key %q: %w", key, err))
		}
	}
	return worked, next, errors.Join(errs...)
}

// drainBatches bounds the batches a consumer applies to one key before it
// turns to the round's other keys (it comes back in the next round), so that
// a key that never empties does not starve them.
const drainBatches = 64

// drain applies key's tasks under l until the key has none that can be
// claimed, or drainBatches batches, and returns how many batches it applied
// or failed.
func (c *Consumer) drain(ctx context.Context, l *leases.Lease, key string) (int, error) {
	n, empty := 0, 0
	for empty < 2 && n < drainBatches && ctx.Err() == nil {
		batch, err := c.claim(ctx, l, key)
		if err != nil {
			return n, err
		}
		if len(batch) == 0 {
			// Claim once more before letting the key go: an enqueue that
			// saw it held sent no NOTIFY, and one that committed since the
			// first empty claim is found now, not at the next poll.
			empty++
			continue
		}
		empty = 0
		n++
		if err := c.apply(ctx, l, key, batch); err != nil {
			return n, err
		}
	}
	return n, nil
}

// claim numbers and claims key's next tasks, in a transaction of its own
// whose first statement it is (so that it can take a numbering mark).
func (c *Consumer) claim(ctx context.Context, l *leases.Lease, key string) ([]Task, error) {
	rows, _ := c.client.Pool().Query(ctx, sqlClaim, key, l.Holder(), l.Token(), c.cfg.Batch, c.cfg.MaxAttempts, !c.cfg.Unordered)
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Task, error) {
		t := Task{Key: key, State: StateRunning}
		err := row.Scan(&t.ID, &t.Seq, &t.Payload, &t.Attempts, &t.IdemKey, &t.EnqueuedAt)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim: %w", pgfence.MapError(err))
	}
	return batch, nil
}

// apply runs fn on batch and records the tasks done in its transaction; when
// fn fails, it rolls back and records the failed attempt of the task fn
// names.
func (c *Consumer) apply(ctx context.Context, l *leases.Lease, key string, batch []Task) (err error) {
	ctx, done := recorder().Start(ctx, "apply", attribute.String("pgfence.task.key", key), attribute.Int("pgfence.task.batch", len(batch)))
	failed := false
	defer func() {
		switch {
		case err == nil && failed:
			recorder().Count(ctx, "apply", "task_failed", 1)
		case err == nil:
			recorder().Count(ctx, "apply", "task_done", int64(len(batch)))
			for _, t := range batch {
				recorder().Record(ctx, "lag", "applied", time.Since(t.EnqueuedAt))
			}
		}
		if failed {
			done("failed", nil)
		} else {
			done(outcome(err, "applied"), err)
		}
	}()
	var results []json.RawMessage
	var ferr error
	err = pgx.BeginTxFunc(ctx, c.client.Pool(), pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		results, ferr = c.fn(ctx, tx, batch)
		if ferr != nil {
			return ferr
		}
		if len(results) != len(batch) {
			ferr = fmt.Errorf("%w: fn returned %d results for %d tasks", pgfence.ErrInvalid, len(results), len(batch))
			return ferr
		}
		ids := make([]int64, len(batch))
		res := make([]*string, len(batch))
		for i, t := range batch {
			ids[i] = t.ID
			if results[i] != nil {
				if err := checkJSON("result", results[i]); err != nil {
					ferr = err
					return err
				}
				s := string(results[i])
				res[i] = &s
			}
		}
		_, err := tx.Exec(ctx, sqlComplete, key, l.Holder(), l.Token(), ids, res)
		return err
	})
	if ferr == nil {
		if err != nil {
			return fmt.Errorf("apply: %w", pgfence.MapError(err))
		}
		return nil
	}
	if ctx.Err() != nil {
		// The lease ended (or the consumer stops): the next claim of the
		// key counts the interrupted attempt.
		return fmt.Errorf("apply: %w", context.Cause(ctx))
	}
	t := batch[min(len(results), len(batch)-1)]
	msg := ferr.Error()
	if len(msg) > maxErrorBytes {
		msg = msg[:maxErrorBytes]
	}
	for !utf8.ValidString(msg) {
		msg = msg[:len(msg)-1]
	}
	var state string
	if err := c.client.Pool().QueryRow(ctx, sqlFail, key, l.Holder(), l.Token(), t.ID, msg, c.backoff(t.Attempts)).Scan(&state); err != nil {
		return fmt.Errorf("record the failure of task %d: %w", t.ID, pgfence.MapError(err))
	}
	c.cfg.Logger.Warn("pgfence tasks: task failed", "key", key, "id", t.ID, "seq", t.Seq, "attempt", t.Attempts+1, "state", state, "err", ferr)
	failed = true
	return nil
}

// backoff is the delay before the attempt after attempts failed ones.
func (c *Consumer) backoff(attempts int) time.Duration {
	d := c.cfg.Backoff
	for ; attempts > 0 && d < c.cfg.BackoffMax; attempts-- {
		d *= 2
	}
	d = min(d, c.cfg.BackoffMax)
	return d/2 + rand.N(d/2+1)
}
