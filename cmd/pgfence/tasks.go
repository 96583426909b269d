package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence"
)

// taskJSON is one ordered task: its state, never its payload or result
// (`tasks show` adds those).
type taskJSON struct {
	ID         int64      `json:"id"`
	Key        string     `json:"key"`
	State      string     `json:"state"`         // pending, running, done, failed or skipped
	Seq        int64      `json:"seq,omitempty"` // absent until numbered
	Attempts   int        `json:"attempts"`
	IdemKey    string     `json:"idem_key,omitempty"`
	Error      string     `json:"error,omitempty"` // the last failed attempt's
	EnqueuedAt time.Time  `json:"enqueued_at"`
	NumberedAt *time.Time `json:"numbered_at,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// Operator is the last retry or skip: {"action", "by", "at", "reason"}
	// (tasks show only).
	Operator json.RawMessage `json:"operator,omitempty"`
}

func newTaskJSON(t tasks.Task) taskJSON {
	return taskJSON{ID: t.ID, Key: t.Key, State: t.State, Seq: t.Seq, Attempts: t.Attempts, IdemKey: t.IdemKey, Error: t.Error,
		EnqueuedAt: t.EnqueuedAt.UTC(), NumberedAt: optionalTime(t.NumberedAt), StartedAt: optionalTime(t.StartedAt), FinishedAt: optionalTime(t.FinishedAt),
		Operator: t.Operator}
}

// tasksListJSON is what `tasks list --json` prints.
type tasksListJSON struct {
	Tasks []taskJSON `json:"tasks"` // by id: enqueue order
	// Truncated is true when more tasks match than --limit shows; NextAfter
	// is then the --after that lists the next ones.
	Truncated bool  `json:"truncated"`
	NextAfter int64 `json:"next_after,omitempty"`
}

// taskShowJSON is what `tasks show --json` prints.
type taskShowJSON struct {
	Task    taskJSON        `json:"task"`
	Payload json.RawMessage `json:"payload"`
	Result  json.RawMessage `json:"result,omitempty"` // done: the consumer's result, if any
}

// taskActionJSON is what `tasks retry --json` and `tasks skip --json` print.
type taskActionJSON struct {
	ID       int64  `json:"id"`
	Key      string `json:"key"`
	Action   string `json:"action"`    // retried or skipped
	State    string `json:"state"`     // after the action: pending or skipped
	WasState string `json:"was_state"` // before it: failed
	Reason   string `json:"reason"`
}

// sqlTasks lists the tasks the role may see (row-level security decides:
// its own and those of the keys it consumes; operators every one) after id
// $1, by id, optionally of one key ($2), of keys starting with $3, in one
// state ($4).
const sqlTasks = `SELECT t.id, t.key::pg_catalog.text, t.state, coalesce(t.seq, 0), t.attempts, coalesce(t.idem_key, ''),
       coalesce(t.error, ''), t.enqueued_at, t.numbered_at, t.started_at, t.finished_at
  FROM pgfence.tasks t
 WHERE t.id OPERATOR(pg_catalog.>) $1
   AND ($2::pg_catalog.text IS NULL OR t.key::pg_catalog.text OPERATOR(pg_catalog.=) $2)
   AND pg_catalog.starts_with(t.key, $3)
   AND ($4::pg_catalog.text IS NULL OR t.state OPERATOR(pg_catalog.=) $4)
 ORDER BY t.id
 LIMIT $5`

// taskStates are the states a task can be in, in their order.
var taskStates = []string{tasks.StatePending, tasks.StateRunning, tasks.StateDone, tasks.StateFailed, tasks.StateSkipped}

// checkTaskKey refuses a key or prefix no task key could have or start with,
// before connecting.
func checkTaskKey(flagName, s string, empty bool) error {
	if (s == "" && !empty) || len(s) > tasks.MaxKeyBytes || !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return &cliError{msg: fmt.Sprintf("%s %q: a task key is 1 to %d bytes of UTF-8 without NUL", flagName, s, tasks.MaxKeyBytes),
			hint: "run the command with -h for its flags", code: exitUsage}
	}
	return nil
}

// taskID parses a task id argument.
func taskID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usageError("task id %q is not a positive integer", s)
	}
	return id, nil
}

func tasksList(fs *flag.FlagSet) runFunc {
	const maxLimit = 9_999 // one more is asked for
	key := fs.String("key", "", "only the tasks of this key")
	prefix := fs.String("prefix", "", "only the tasks of keys starting with this")
	state := fs.String("state", "", "only the tasks in this state: "+strings.Join(taskStates, ", "))
	limit := fs.Int("limit", 50, fmt.Sprintf("most tasks listed (1 to %d)", maxLimit))
	after := fs.Int64("after", 0, "list the tasks after this id (the next_after of the previous page)")
	return func(ctx context.Context, in *input) error {
		switch {
		case *limit < 1 || *limit > maxLimit:
			return usageError("--limit must be 1 to %d, got %d", maxLimit, *limit)
		case *after < 0:
			return usageError("--after must be >= 0, got %d", *after)
		case *state != "" && !slices.Contains(taskStates, *state):
			return usageError("--state %q is not a task state (want %s)", *state, strings.Join(taskStates, ", "))
		case *key != "" && *prefix != "":
			return usageError("--key and --prefix select the same thing: pass one")
		}
		if err := checkTaskKey("--prefix", *prefix, true); err != nil {
			return err
		}
		var byKey, byState *string
		if *key != "" || flagSet(fs, "key") {
			if err := checkTaskKey("--key", *key, false); err != nil {
				return err
			}
			byKey = key
		}
		if *state != "" {
			byState = state
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		list, err := listTasks(ctx, pool, *after, byKey, *prefix, byState, *limit+1) // one more: are there others?
		if err != nil {
			return dbError(err)
		}
		out := tasksListJSON{Tasks: make([]taskJSON, 0, len(list)), Truncated: len(list) > *limit}
		list = list[:min(len(list), *limit)]
		for _, t := range list {
			out.Tasks = append(out.Tasks, newTaskJSON(t))
		}
		if out.Truncated {
			out.NextAfter = list[len(list)-1].ID
		}
		return in.print(out, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tKEY\tSTATE\tSEQ\tATTEMPTS\tENQUEUED AT\tFINISHED AT\tERROR")
			for _, t := range list {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", t.ID, cell(t.Key), t.State, seqText(t.Seq), t.Attempts,
					stamp(t.EnqueuedAt), stamp(t.FinishedAt), cell(dash(t.Error)))
			}
			tw.Flush()
			switch {
			case len(list) == 0:
				fmt.Fprintln(w, "(no tasks this role may see)")
			case out.Truncated:
				fmt.Fprintf(w, "(the first %d; --after %d lists the next ones)\n", len(list), out.NextAfter)
			}
		})
	}
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func listTasks(ctx context.Context, pool *pgxpool.Pool, after int64, key *string, prefix string, state *string, limit int) ([]tasks.Task, error) {
	rows, err := pool.Query(ctx, sqlTasks, after, key, prefix, state, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []tasks.Task
	for rows.Next() {
		var t tasks.Task
		var numbered, started, finished sql.NullTime
		if err := rows.Scan(&t.ID, &t.Key, &t.State, &t.Seq, &t.Attempts, &t.IdemKey, &t.Error, &t.EnqueuedAt, &numbered, &started, &finished); err != nil {
			return nil, err
		}
		t.NumberedAt, t.StartedAt, t.FinishedAt = numbered.Time, started.Time, finished.Time
		out = append(out, t)
	}
	return out, rows.Err()
}

func seqText(seq int64) string {
	if seq == 0 {
		return "-"
	}
	return strconv.FormatInt(seq, 10)
}

// lookupTask returns task id as the role may see it, or a clear error.
func lookupTask(ctx context.Context, pool *pgxpool.Pool, id int64) (tasks.Task, error) {
	t, err := tasks.Status(ctx, pool, id)
	if errors.Is(err, pgfence.ErrNotFound) {
		return t, &cliError{msg: fmt.Sprintf("no task %d: it does not exist, was pruned, or this role may not see it", id),
			hint: "`pgfence tasks list` lists the tasks this role may see", code: exitFailure, err: err}
	}
	if err != nil {
		return t, dbError(err)
	}
	return t, nil
}

func tasksShow(*flag.FlagSet) runFunc {
	return func(ctx context.Context, in *input) error {
		id, err := taskID(in.args[0])
		if err != nil {
			return err
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		t, err := lookupTask(ctx, pool, id)
		if err != nil {
			return err
		}
		out := taskShowJSON{Task: newTaskJSON(t), Payload: t.Payload, Result: t.Result}
		return in.print(out, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "id\t%d\n", t.ID)
			fmt.Fprintf(tw, "key\t%s\n", cell(t.Key))
			fmt.Fprintf(tw, "state\t%s\n", t.State)
			fmt.Fprintf(tw, "seq\t%s\n", seqText(t.Seq))
			fmt.Fprintf(tw, "attempts\t%d\n", t.Attempts)
			fmt.Fprintf(tw, "idempotency key\t%s\n", cell(dash(t.IdemKey)))
			fmt.Fprintf(tw, "enqueued at\t%s\n", stamp(t.EnqueuedAt))
			fmt.Fprintf(tw, "numbered at\t%s\n", stamp(t.NumberedAt))
			fmt.Fprintf(tw, "started at\t%s\n", stamp(t.StartedAt))
			fmt.Fprintf(tw, "finished at\t%s\n", stamp(t.FinishedAt))
			fmt.Fprintf(tw, "payload\t%s\n", cell(string(t.Payload)))
			fmt.Fprintf(tw, "result\t%s\n", cell(dash(string(t.Result))))
			fmt.Fprintf(tw, "operator\t%s\n", cell(dash(string(t.Operator))))
			fmt.Fprintf(tw, "error\t%s\n", cell(dash(t.Error)))
			tw.Flush()
		})
	}
}

// taskAction is `tasks retry` (pgfence.task_retry) or `tasks skip`
// (pgfence.task_skip): operator actions on a failed task, which unblock its
// key.
func taskAction(action, function, after string) func(fs *flag.FlagSet) runFunc {
	return func(fs *flag.FlagSet) runFunc {
		reason := fs.String("reason", "", "why (required, 1 to 1000 characters); recorded on the task with the action, the role and the time")
		return func(ctx context.Context, in *input) error {
			id, err := taskID(in.args[0])
			if err != nil {
				return err
			}
			if n := utf8.RuneCountInString(strings.TrimSpace(*reason)); n == 0 || n > 1000 || !utf8.ValidString(*reason) {
				return usageError("tasks %s needs --reason TEXT of 1 to 1000 characters", strings.TrimSuffix(action, "ed"))
			}
			pool, err := in.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			t, err := lookupTask(ctx, pool, id)
			if err != nil {
				return err
			}
			notFailed := func(state string) error {
				return &cliError{msg: fmt.Sprintf("task %d is %s, not failed: only a failed task can be retried or skipped; nothing changed", id, state),
					hint: fmt.Sprintf("`pgfence tasks list --key %s --state failed` lists the key's failed tasks", shellQuote(t.Key)), code: exitFailure}
			}
			if t.State != tasks.StateFailed {
				return notFailed(t.State)
			}
			var changed bool
			if err := pool.QueryRow(ctx, "SELECT pgfence."+function+"($1, $2)", id, *reason).Scan(&changed); err != nil {
				return dbError(err)
			}
			if !changed { // retried or skipped by someone else in between
				if t, err = lookupTask(ctx, pool, id); err != nil {
					return err
				}
				return notFailed(t.State)
			}
			out := taskActionJSON{ID: id, Key: t.Key, Action: action, State: after, WasState: tasks.StateFailed, Reason: *reason}
			return in.print(out, func(w io.Writer) {
				fmt.Fprintf(w, "task %d of key %q %s (was failed after %d attempt(s): %s); its key is no longer blocked by it\n",
					id, t.Key, action, t.Attempts, dash(t.Error))
			})
		}
	}
}
