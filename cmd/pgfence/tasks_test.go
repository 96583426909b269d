package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// taskConsumer drives a key's consumer protocol over SQL, one task at a
// time, so that a test puts tasks in the states it wants.
type taskConsumer struct {
	t      *testing.T
	pool   *pgxpool.Pool
	key    string
	holder string
	token  int64
}

func newTaskConsumer(t *testing.T, ctx context.Context, pool *pgxpool.Pool, key string) *taskConsumer {
	t.Helper()
	c := &taskConsumer{t: t, pool: pool, key: key}
	if err := pool.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.try_acquire(pgfence.task_lease_key($1), interval '1 hour')`, key).
		Scan(&c.holder, &c.token); err != nil {
		t.Fatal(err)
	}
	return c
}

// claim returns the id of the key's next task, claimed; numbering waits for
// every transaction open in the cluster, so it claims until one comes.
func (c *taskConsumer) claim(ctx context.Context) int64 {
	c.t.Helper()
	for {
		var id int64
		err := c.pool.QueryRow(ctx, `SELECT id FROM pgfence.task_claim($1, $2::uuid, $3, 1)`, c.key, c.holder, c.token).Scan(&id)
		if err == nil {
			return id
		}
		if err != pgx.ErrNoRows {
			c.t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("no task of %q to claim: %v", c.key, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (c *taskConsumer) complete(ctx context.Context, id int64, result string) {
	c.t.Helper()
	if _, err := c.pool.Exec(ctx, `SELECT pgfence.task_complete($1, $2::uuid, $3, ARRAY[$4::bigint], ARRAY[$5::jsonb])`,
		c.key, c.holder, c.token, id, result); err != nil {
		c.t.Fatal(err)
	}
}

// fail records a failed attempt without a retry: the task ends failed and
// blocks its key (the strict policy, task_claim's default).
func (c *taskConsumer) fail(ctx context.Context, id int64, msg string) {
	c.t.Helper()
	if _, err := c.pool.Exec(ctx, `SELECT pgfence.task_fail($1, $2::uuid, $3, $4, $5)`, c.key, c.holder, c.token, id, msg); err != nil {
		c.t.Fatal(err)
	}
}

func enqueueTask(t *testing.T, ctx context.Context, pool *pgxpool.Pool, key, payload, idem string) int64 {
	t.Helper()
	task, err := tasks.Enqueue(ctx, pool, key, []byte(payload), &tasks.EnqueueOptions{IdempotencyKey: idem})
	if err != nil {
		t.Fatal(err)
	}
	return task.ID
}

// goldenTasks: in a fresh database, key sku/42 with task 1 done (with an
// idempotency key and a result), task 2 failed and blocking the key, task 3
// pending and numbered; key sku/7 with task 4 pending, not numbered.
func goldenTasks(t *testing.T, ctx context.Context, db *pgfencetest.Database) {
	t.Helper()
	setupTasks(t, ctx, db)
}

// setupTasks is goldenTasks; it returns the consumer of sku/42.
func setupTasks(t *testing.T, ctx context.Context, db *pgfencetest.Database) *taskConsumer {
	t.Helper()
	enqueueTask(t, ctx, db.Pool, "sku/42", `{"order": 1001, "qty": 1}`, "order-1001")
	enqueueTask(t, ctx, db.Pool, "sku/42", `{"order": 1002, "qty": 5}`, "")
	enqueueTask(t, ctx, db.Pool, "sku/42", `{"order": 1003, "qty": 1}`, "")
	enqueueTask(t, ctx, db.Pool, "sku/7", `{"order": 1004, "qty": 2}`, "")
	c := newTaskConsumer(t, ctx, db.Pool, "sku/42")
	c.complete(ctx, c.claim(ctx), `{"left": 9}`)
	c.fail(ctx, c.claim(ctx), "out of stock")
	return c
}

func taskState(t *testing.T, ctx context.Context, pool *pgxpool.Pool, id int64) (state string, attempts int, blockedBy int64) {
	t.Helper()
	if err := pool.QueryRow(ctx, `SELECT t.state, t.attempts, coalesce(k.blocked_by, 0) FROM pgfence.tasks t
		LEFT JOIN pgfence.task_keys k ON k.key = t.key WHERE t.id = $1`, id).Scan(&state, &attempts, &blockedBy); err != nil {
		t.Fatal(err)
	}
	return state, attempts, blockedBy
}

func TestTasksCommands(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	c := setupTasks(t, ctx, db)

	list := func(args ...string) tasksListJSON {
		t.Helper()
		code, out, errOut := cli(t, environ, append([]string{"tasks", "list", "--json"}, args...)...)
		var res tasksListJSON
		if code != exitOK || json.Unmarshal([]byte(out), &res) != nil {
			t.Fatalf("tasks list %q: code %d\n%s%s", args, code, out, errOut)
		}
		return res
	}
	ids := func(res tasksListJSON) string {
		var s []string
		for _, t := range res.Tasks {
			s = append(s, fmt.Sprintf("%d:%s", t.ID, t.State))
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "1:done,2:failed,3:pending,4:pending"},
		{[]string{"--key", "sku/42"}, "1:done,2:failed,3:pending"},
		{[]string{"--key", "sku/4"}, ""},
		{[]string{"--prefix", "sku/4"}, "1:done,2:failed,3:pending"},
		{[]string{"--state", "pending"}, "3:pending,4:pending"},
		{[]string{"--prefix", "sku/", "--state", "failed"}, "2:failed"},
	} {
		if got := ids(list(tc.args...)); got != tc.want {
			t.Errorf("tasks list %q: %s, want %s", tc.args, got, tc.want)
		}
	}
	// Keyset pages: --after the previous page's next_after.
	page := list("--limit", "3")
	if ids(page) != "1:done,2:failed,3:pending" || !page.Truncated || page.NextAfter != 3 {
		t.Fatalf("first page: %+v", page)
	}
	if page = list("--limit", "3", "--after", "3"); ids(page) != "4:pending" || page.Truncated || page.NextAfter != 0 {
		t.Fatalf("second page: %+v", page)
	}
	if code, out, _ := cli(t, environ, "tasks", "list", "--limit", "1"); code != exitOK || !strings.Contains(out, "--after 1 lists the next ones") {
		t.Errorf("tasks list text, truncated: code %d\n%s", code, out)
	}

	code, out, errOut := cli(t, environ, "tasks", "show", "1", "--json")
	var shown taskShowJSON
	if code != exitOK || json.Unmarshal([]byte(out), &shown) != nil {
		t.Fatalf("tasks show 1: code %d\n%s%s", code, out, errOut)
	}
	if shown.Task.State != tasks.StateDone || shown.Task.Seq != 1 || !strings.Contains(string(shown.Result), `"left": 9`) || shown.Task.IdemKey != "order-1001" ||
		shown.Task.FinishedAt == nil || shown.Task.NumberedAt == nil {
		t.Fatalf("tasks show 1: %s", out)
	}
	if code, out, _ = cli(t, environ, "tasks", "show", "2"); code != exitOK || !strings.Contains(out, "out of stock") || !strings.Contains(out, "failed") {
		t.Fatalf("tasks show 2: code %d\n%s", code, out)
	}

	// Bad input: a clear error, and nothing written.
	for _, tc := range []struct {
		code int
		want string
		args []string
	}{
		{exitUsage, "not a task state", []string{"tasks", "list", "--state", "stuck"}},
		{exitUsage, "pass one", []string{"tasks", "list", "--key", "a", "--prefix", "b"}},
		{exitUsage, "task key is 1 to 480 bytes", []string{"tasks", "list", "--key", ""}},
		{exitUsage, "--limit must be", []string{"tasks", "list", "--limit", "0"}},
		{exitUsage, "not a positive integer", []string{"tasks", "show", "two"}},
		{exitFailure, "no task 999", []string{"tasks", "show", "999"}},
		{exitUsage, "--reason", []string{"tasks", "retry", "2"}},
		{exitUsage, "--reason", []string{"tasks", "skip", "2", "--reason", "  "}},
		{exitUsage, "not a positive integer", []string{"tasks", "retry", "0", "--reason", "x"}},
		{exitFailure, "no task 999", []string{"tasks", "retry", "999", "--reason", "refilled"}},
		{exitFailure, "task 1 is done, not failed", []string{"tasks", "retry", "1", "--reason", "again"}},
		{exitFailure, "task 3 is pending, not failed", []string{"tasks", "skip", "3", "--reason", "cancelled"}},
	} {
		if code, _, errOut := cli(t, environ, tc.args...); code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: code %d, want %d with %q:\n%s", tc.args, code, tc.code, tc.want, errOut)
		}
	}
	for id, want := range map[int64]string{1: "done", 2: "failed", 3: "pending"} {
		if state, _, _ := taskState(t, ctx, db.Pool, id); state != want {
			t.Errorf("after the refused commands task %d is %s, want %s", id, state, want)
		}
	}
	if _, _, blocked := taskState(t, ctx, db.Pool, 2); blocked != 2 {
		t.Fatalf("after the refused commands key sku/42 is blocked by %d, want 2", blocked)
	}

	// A role that may see none of them lists none, and may not retry.
	app := newRole(t, db, "pgfence_t_tasks_app_", "LOGIN PASSWORD 'not-a-secret' IN ROLE pgfence_app")
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	asApp := map[string]string{"DATABASE_URL": fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=not-a-secret", cfg.Host, cfg.Port, cfg.Database, app)}
	if code, out, errOut := cli(t, asApp, "tasks", "list"); code != exitOK || !strings.Contains(out, "(no tasks this role may see)") {
		t.Errorf("tasks list as a role granted nothing: code %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := cli(t, asApp, "tasks", "retry", "2", "--reason", "mine now"); code != exitFailure || !strings.Contains(errOut, "no task 2") {
		t.Errorf("tasks retry as a role granted nothing: code %d\n%s", code, errOut)
	}
	if state, _, _ := taskState(t, ctx, db.Pool, 2); state != tasks.StateFailed {
		t.Fatalf("task 2 is %s after a refused retry, want failed", state)
	}
	// The role that enqueued a task sees it fail, and may not retry it:
	// that is an operator's action.
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, 'mine/')`, app); err != nil {
		t.Fatal(err)
	}
	appPool, err := pgxpool.New(ctx, asApp["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer appPool.Close()
	mine := enqueueTask(t, ctx, appPool, "mine/1", `{}`, "")
	own := newTaskConsumer(t, ctx, db.Pool, "mine/1")
	own.fail(ctx, own.claim(ctx), "boom")
	if code, out, errOut := cli(t, asApp, "tasks", "show", fmt.Sprint(mine)); code != exitOK || !strings.Contains(out, "boom") {
		t.Errorf("tasks show of its own task: code %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := cli(t, asApp, "tasks", "skip", fmt.Sprint(mine), "--reason", "mine"); code != exitFailure || !strings.Contains(errOut, "pgfence_operator") {
		t.Errorf("tasks skip of its own task as a pgfence_app member: code %d\n%s", code, errOut)
	}
	if state, _, blocked := taskState(t, ctx, db.Pool, mine); state != tasks.StateFailed || blocked != mine {
		t.Fatalf("task %d is %s, its key blocked by %d after a refused skip; want failed, blocked by it", mine, state, blocked)
	}

	// retry: pending again with its attempts reset, the key unblocked; the
	// consumer applies it next, in order.
	code, out, errOut = cli(t, environ, "tasks", "retry", "2", "--reason", "stock refilled", "--json")
	var acted taskActionJSON
	if code != exitOK || json.Unmarshal([]byte(out), &acted) != nil || acted.State != tasks.StatePending || acted.Key != "sku/42" {
		t.Fatalf("tasks retry 2: code %d\n%s%s", code, out, errOut)
	}
	if state, attempts, blocked := taskState(t, ctx, db.Pool, 2); state != tasks.StatePending || attempts != 0 || blocked != 0 {
		t.Fatalf("after retry task 2 is %s after %d attempts, key blocked by %d; want pending, 0, none", state, attempts, blocked)
	}
	if id := c.claim(ctx); id != 2 {
		t.Fatalf("after the retry the consumer claims task %d, want 2", id)
	}
	c.fail(ctx, 2, "out of stock again")

	// skip: never applied; the key's next task goes on.
	if code, out, errOut = cli(t, environ, "tasks", "skip", "2", "--reason", "order cancelled"); code != exitOK || !strings.Contains(out, "skipped") {
		t.Fatalf("tasks skip 2: code %d\n%s%s", code, out, errOut)
	}
	if state, _, blocked := taskState(t, ctx, db.Pool, 2); state != tasks.StateSkipped || blocked != 0 {
		t.Fatalf("after skip task 2 is %s, key blocked by %d; want skipped, none", state, blocked)
	}
	// The database records the last action: what, by whom, when, why.
	code, out, errOut = cli(t, environ, "tasks", "show", "2", "--json")
	var skipped taskShowJSON
	var op struct{ Action, By, At, Reason string }
	if code != exitOK || json.Unmarshal([]byte(out), &skipped) != nil || json.Unmarshal(skipped.Task.Operator, &op) != nil ||
		op.Action != "skip" || op.Reason != "order cancelled" || op.By == "" || op.At == "" {
		t.Fatalf("tasks show 2 after the skip: code %d, operator %+v\n%s%s; want the skip, its role, time and reason", code, op, out, errOut)
	}
	if id := c.claim(ctx); id != 3 {
		t.Fatalf("after the skip the consumer claims task %d, want 3", id)
	}
	if code, _, errOut = cli(t, environ, "tasks", "skip", "2", "--reason", "twice"); code != exitFailure || !strings.Contains(errOut, "task 2 is skipped, not failed") {
		t.Fatalf("skip of a skipped task: code %d, %s", code, errOut)
	}
}

// The doctor reports the ordered tasks as the role connecting sees them: a
// key a failed task blocks (with the commands that unblock it), pending
// tasks waiting past the threshold, and nothing of what row-level security
// hides.
func TestDoctorTasks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	_, got := doctorRun(t, db.URL)
	wantCheck(t, got, "ordered tasks", statusOK, "no open task this role may see")

	setupTasks(t, ctx, db)
	_, got = doctorRun(t, db.URL)
	wantCheck(t, got, "ordered tasks", statusWarn, "1 key(s) in strict order blocked by a failed task", "'sku/42' by task 2 since", "(out of stock)",
		"pgfence tasks retry ID --reason TEXT", "2 open task(s) in 2 key(s)")
	if strings.Contains(got["ordered tasks"].Detail, "older than") {
		t.Errorf("fresh pending tasks reported late: %s", got["ordered tasks"].Detail)
	}

	// Skipped, the key goes on: no warning while its task is young; backdated
	// past the threshold, the key is late.
	if code, _, errOut := cli(t, map[string]string{"DATABASE_URL": db.URL}, "tasks", "skip", "2", "--reason", "order cancelled"); code != exitOK {
		t.Fatalf("tasks skip 2: code %d, %s", code, errOut)
	}
	_, got = doctorRun(t, db.URL)
	wantCheck(t, got, "ordered tasks", statusOK, "2 open task(s) in 2 key(s)", "no key is blocked")
	if _, err := db.Pool.Exec(ctx, `UPDATE pgfence.tasks SET enqueued_at = enqueued_at - interval '10 minutes' WHERE id = 4`); err != nil {
		t.Fatal(err)
	}
	_, got = doctorRun(t, db.URL)
	wantCheck(t, got, "ordered tasks", statusWarn, "1 key(s) with a pending task older than 5m0s", "the oldest waiting: 'sku/7': 1 open, oldest pending 10m")

	// A pgfence_app member granted neither key sees none of it. (It may
	// read the schema version, which the doctor's schema checks need.)
	app := newRole(t, db, "pgfence_t_doctor_tasks_", "LOGIN PASSWORD 'not-a-secret' IN ROLE pgfence_app")
	mustExec(t, db, `GRANT SELECT ON `+migrations.VersionTable+` TO `+app)
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, got = doctorRun(t, fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=not-a-secret", cfg.Host, cfg.Port, cfg.Database, app))
	wantCheck(t, got, "ordered tasks", statusOK, "no open task this role may see")
}
