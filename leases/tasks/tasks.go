package tasks

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/pgfence"
)

// Limits, checked before any round trip ([pgfence.ErrInvalid] names the
// argument); the SQL functions enforce the same for other clients (PF008).
const (
	// MaxKeyBytes is the longest task key: its consumer's lease key,
	// "pgfence.task:" and the key, is at most [pgfence.MaxResourceLen].
	MaxKeyBytes = 480
	// MaxPayloadBytes is the longest payload, result or error text, as
	// JSON text.
	MaxPayloadBytes   = 65536
	maxBacklogDefault = 10000
	maxIdemKeyBytes   = 256
	maxBacklog        = 1000000
	maxErrorBytes     = 4096
)

// The states of a task.
const (
	StatePending = "pending" // enqueued, not (yet) being applied
	StateRunning = "running" // claimed by its key's consumer, being applied
	StateDone    = "done"    // applied; its result is stored
	StateFailed  = "failed"  // attempts exhausted; its error is stored
	StateSkipped = "skipped" // failed, then skipped by an operator
)

// Task is a task record: what [Enqueue] and [Status] return, and what a
// [Consumer] applies.
type Task struct {
	ID       int64
	Key      string
	State    string
	Seq      int64 // the task's number in its key, from 1, gapless; 0 until numbered
	Attempts int   // failed or interrupted attempts so far
	Payload  json.RawMessage
	Result   json.RawMessage // done: the consumer's result (nil for none)
	Error    string          // the last failed attempt's error
	IdemKey  string          // [EnqueueOptions.IdempotencyKey]
	// Operator is the last operator action on the task (pgfence.task_retry
	// or task_skip), as JSON: {"action", "by", "at", "reason"}; nil for none.
	Operator json.RawMessage

	EnqueuedAt time.Time
	NumberedAt time.Time // zero until numbered
	StartedAt  time.Time // the last claim; zero before
	FinishedAt time.Time // done, failed: when

	// Duplicate is set by [Enqueue] when the idempotency key had a task
	// already: this is that task, and nothing was enqueued.
	Duplicate bool
}

// EffectKey is the idempotency key for an effect of the task outside this
// database (a payment provider, an e-mail): the same for every attempt, so
// that the downstream service applies it once although a consumer may apply
// a task more than once when it dies after the effect and before its commit.
func (t Task) EffectKey() string { return "pgfence.task:" + strconv.FormatInt(t.ID, 10) }

// EnqueueOptions are the options of [Enqueue]. A nil *EnqueueOptions and
// zero fields use the defaults.
type EnqueueOptions struct {
	// IdempotencyKey (1 to 256 bytes), when set, makes a repeated enqueue
	// of the key return the first task ([Task.Duplicate]) instead of adding
	// one; with another payload it is refused ([github.com/pgfence/pgfence/idempotency.ErrMismatch]).
	// The key is remembered as long as its task (see pgfence.prune_tasks).
	IdempotencyKey string
	// MaxBacklog bounds the key's open (pending and running) tasks: past
	// it, Enqueue fails with [pgfence.ErrBacklogFull] and writes nothing.
	// Concurrent producers may each pass the check, so the backlog
	// overshoots by at most their number. Default 10,000, at most
	// 1,000,000.
	MaxBacklog int
}

func checkKey(key string) error {
	if key == "" || len(key) > MaxKeyBytes || !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0 {
		return fmt.Errorf("%w: key: must be 1 to %d bytes of UTF-8 without NUL, got %d bytes", pgfence.ErrInvalid, MaxKeyBytes, len(key))
	}
	return nil
}

func checkJSON(field string, v []byte) error {
	if len(v) > MaxPayloadBytes || !json.Valid(v) {
		return fmt.Errorf("%w: %s: must be JSON of at most %d bytes, got %d bytes", pgfence.ErrInvalid, field, MaxPayloadBytes, len(v))
	}
	return nil
}

const (
	sqlEnqueue = `SELECT id, created, state, coalesce(seq, 0), enqueued_at FROM pgfence.task_enqueue($1, $2::jsonb, $3, $4)`
	sqlStatus  = `SELECT id, key, state, coalesce(seq, 0), attempts, payload, result, coalesce(error, ''), coalesce(idem_key, ''),
       enqueued_at, numbered_at, started_at, finished_at, operator FROM pgfence.task_status($1)`
)

// Enqueue adds a task with payload (JSON, at most [MaxPayloadBytes]) to key
// (1 to [MaxKeyBytes] bytes; members of pgfence_app need a granted prefix of
// it) and returns it, pending and not numbered yet. It takes no lock and waits
// for no other producer. On a [pgx.Tx] it joins the caller's transaction: the
// task exists if and only if that transaction commits (an error aborts it,
// as any failing statement does); on a pool or a connection it commits on
// its own, in one round trip.
//
// Errors: [pgfence.ErrInvalid] for bad arguments, [pgfence.ErrBacklogFull]
// when the key's backlog is full, [github.com/pgfence/pgfence/idempotency.ErrMismatch] for an idempotency
// key used with another payload, [github.com/pgfence/pgfence/idempotency.ErrInProgress] when
// another transaction is enqueueing the same idempotency key and did not end
// within 5 s (or the session's lock_timeout when lower),
// [pgfence.ErrNotGranted]; nothing was enqueued. On its own transaction, a connection lost after the statement
// was sent is [pgfence.ErrOutcomeUnknown]: enqueue again with an
// idempotency key to learn the task.
func Enqueue(ctx context.Context, db pgfence.DB, key string, payload []byte, opts *EnqueueOptions) (Task, error) {
	h, err := driver.Pgx(db)
	if err != nil {
		return Task{}, err
	}
	return enqueue(ctx, h, key, payload, opts)
}

// EnqueueSQL is [Enqueue] on database/sql: on a *sql.Tx the task joins the
// caller's transaction.
func EnqueueSQL(ctx context.Context, db pgfence.SQLDB, key string, payload []byte, opts *EnqueueOptions) (Task, error) {
	h, err := driver.SQL(db)
	if err != nil {
		return Task{}, err
	}
	return enqueue(ctx, h, key, payload, opts)
}

func enqueue[T any](ctx context.Context, h driver.Handle[T], key string, payload []byte, opts *EnqueueOptions) (Task, error) {
	var o EnqueueOptions
	if opts != nil {
		o = *opts
	}
	if o.MaxBacklog == 0 {
		o.MaxBacklog = maxBacklogDefault
	}
	switch {
	case o.MaxBacklog < 0 || o.MaxBacklog > maxBacklog:
		return Task{}, fmt.Errorf("%w: EnqueueOptions.MaxBacklog: must be 1 to %d, got %d", pgfence.ErrInvalid, maxBacklog, o.MaxBacklog)
	case len(o.IdempotencyKey) > maxIdemKeyBytes || !utf8.ValidString(o.IdempotencyKey) || strings.IndexByte(o.IdempotencyKey, 0) >= 0:
		return Task{}, fmt.Errorf("%w: EnqueueOptions.IdempotencyKey: must be at most %d bytes of UTF-8 without NUL", pgfence.ErrInvalid, maxIdemKeyBytes)
	}
	if err := checkKey(key); err != nil {
		return Task{}, err
	}
	if err := checkJSON("payload", payload); err != nil {
		return Task{}, err
	}
	var idem *string
	if o.IdempotencyKey != "" {
		idem = &o.IdempotencyKey
	}
	ctx, done := recorder().Start(ctx, "enqueue", attribute.String("pgfence.task.key", key))
	t := Task{Key: key, Payload: payload, IdemKey: o.IdempotencyKey}
	var created bool
	err := h.QueryRow(ctx, sqlEnqueue, key, string(payload), idem, o.MaxBacklog).Scan(&t.ID, &created, &t.State, &t.Seq, &t.EnqueuedAt)
	if err != nil {
		err = fmt.Errorf("tasks: enqueue to %q: %w", key, pgfence.MapError(err))
		done(outcome(err, ""), err)
		return Task{}, err
	}
	t.Duplicate = !created
	if t.Duplicate {
		done("duplicate", nil)
	} else {
		done("enqueued", nil)
	}
	return t, nil
}

// Status returns task id to the role that enqueued it, to the key's
// consumers (a grant of its lease key) and to operators:
// its state, number, attempts, timestamps, and its result or error.
// [pgfence.ErrNotFound] when there is no such task, or the role may not see it,
// or it was pruned.
func Status(ctx context.Context, db pgfence.DB, id int64) (Task, error) {
	h, err := driver.Pgx(db)
	if err != nil {
		return Task{}, err
	}
	return status(ctx, h, id)
}

// StatusSQL is [Status] on database/sql.
func StatusSQL(ctx context.Context, db pgfence.SQLDB, id int64) (Task, error) {
	h, err := driver.SQL(db)
	if err != nil {
		return Task{}, err
	}
	return status(ctx, h, id)
}

func status[T any](ctx context.Context, h driver.Handle[T], id int64) (Task, error) {
	var (
		t                           Task
		payload, result, operator   []byte
		numbered, started, finished sql.NullTime
	)
	err := h.Read(ctx, sqlStatus, id).Scan(&t.ID, &t.Key, &t.State, &t.Seq, &t.Attempts, &payload, &result, &t.Error, &t.IdemKey,
		&t.EnqueuedAt, &numbered, &started, &finished, &operator)
	if driver.NoRows(err) {
		return Task{}, fmt.Errorf("tasks: task %d: %w", id, pgfence.ErrNotFound)
	}
	if err != nil {
		return Task{}, fmt.Errorf("tasks: status of task %d: %w", id, pgfence.MapError(err))
	}
	t.Payload, t.Result, t.Operator = payload, result, operator
	t.NumberedAt, t.StartedAt, t.FinishedAt = numbered.Time, started.Time, finished.Time
	return t, nil
}

var _ pgfence.DB = pgx.Tx(nil)
