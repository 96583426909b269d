package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The doctor's ordered-task check: the backlog and the oldest pending task
// of each key, and the keys a failed task blocks. It reads pgfence.tasks and
// pgfence.task_keys as the role connecting: row-level security shows a
// pgfence_app member the tasks it enqueued and the keys it consumes, an
// operator every one.
const (
	// taskAgeWarn: a pending task this old means no consumer is applying its
	// key (none runs, none may take the key's lease, or it fails and backs
	// off); consumers poll every second by default.
	taskAgeWarn = 5 * time.Minute
	// taskBacklogWarn: half the default bound of a key's open tasks, past
	// which task_enqueue refuses new ones.
	taskBacklogWarn = 5000
	// taskWorstKeys is how many keys the check names.
	taskWorstKeys = 5

	sqlTasksTable = `SELECT pg_catalog.to_regclass('pgfence.tasks') IS NOT NULL`
	// sqlTaskBacklog: the keys with open (pending or running) tasks, oldest
	// pending first, with their open tasks and their oldest pending task's
	// age (database clock, seconds), and over all keys: how many, their
	// open tasks, how many wait past taskAgeWarn or hold taskBacklogWarn.
	sqlTaskBacklog = `WITH k AS (
    SELECT t.key::pg_catalog.text AS key, pg_catalog.count(*) AS open,
           pg_catalog.min(t.enqueued_at) FILTER (WHERE t.state OPERATOR(pg_catalog.=) 'pending') AS oldest
      FROM pgfence.tasks t
     WHERE t.state OPERATOR(pg_catalog.=) ANY ('{pending,running}'::pg_catalog.text[])
     GROUP BY t.key
), a AS (
    SELECT k.key, k.open,
           coalesce(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) k.oldest), 0) AS age
      FROM k
)
SELECT a.key, a.open, a.age, pg_catalog.count(*) OVER (), pg_catalog.sum(a.open) OVER ()::pg_catalog.int8,
       pg_catalog.count(*) FILTER (WHERE a.age OPERATOR(pg_catalog.>=) $1 OR a.open OPERATOR(pg_catalog.>=) $2) OVER ()
  FROM a
 ORDER BY a.age DESC, a.open DESC, a.key
 LIMIT $3`
	// sqlBlockedKeys: keys in strict order that a failed task blocks, the
	// longest blocked first, with the task's error and when it failed, and
	// how many there are.
	sqlBlockedKeys = `SELECT k.key::pg_catalog.text, k.blocked_by, coalesce(t.error, ''), t.finished_at, pg_catalog.count(*) OVER ()
  FROM pgfence.task_keys k
  LEFT JOIN pgfence.tasks t ON t.id OPERATOR(pg_catalog.=) k.blocked_by
 WHERE k.blocked_by IS NOT NULL AND k.ordered
 ORDER BY t.finished_at NULLS FIRST, k.key
 LIMIT $1`
)

// taskBacklog reports the ordered tasks waiting per key; ok is false when
// pgfence.tasks does not exist (a schema older than ordered tasks), and the
// doctor then has no such check.
func taskBacklog(ctx context.Context, pool *pgxpool.Pool) (c check, ok bool) {
	const name = "ordered tasks"
	var exists bool
	if err := pool.QueryRow(ctx, sqlTasksTable).Scan(&exists); err != nil || !exists {
		return check{}, false
	}
	fail := func(err error) (check, bool) {
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf(
			"cannot read the ordered tasks (members of pgfence_app see their own and those of the keys they consume, pgfence_operator members every one): %v", err)}, true
	}
	var keys, open, late int64
	var worst []string
	rows, err := pool.Query(ctx, sqlTaskBacklog, taskAgeWarn.Seconds(), taskBacklogWarn, taskWorstKeys)
	if err != nil {
		return fail(err)
	}
	var key string
	var n int64
	var age float64
	_, err = pgx.ForEachRow(rows, []any{&key, &n, &age, &keys, &open, &late}, func() error {
		w := fmt.Sprintf("%s: %d open", quoteLiteral(key), n)
		switch d := time.Duration(age * float64(time.Second)).Round(time.Second); {
		case age <= 0: // running tasks only
		case d == 0:
			w += ", oldest pending <1s"
		default:
			w += ", oldest pending " + d.String()
		}
		worst = append(worst, w)
		return nil
	})
	if err != nil {
		return fail(err)
	}
	var blocked []string
	var nBlocked int64
	rows, err = pool.Query(ctx, sqlBlockedKeys, taskWorstKeys)
	if err != nil {
		return fail(err)
	}
	var id int64
	var msg string
	var since *time.Time
	_, err = pgx.ForEachRow(rows, []any{&key, &id, &msg, &since, &nBlocked}, func() error {
		b := fmt.Sprintf("%s by task %d", quoteLiteral(key), id)
		if since != nil {
			b += " since " + since.UTC().Format("2006-01-02 15:04:05Z")
		}
		if msg != "" {
			b += fmt.Sprintf(" (%s)", oneLine(msg))
		}
		blocked = append(blocked, b)
		return nil
	})
	if err != nil {
		return fail(err)
	}

	summary := "no open task this role may see"
	if keys > 0 {
		summary = fmt.Sprintf("%d open task(s) in %d key(s) this role may see; the oldest waiting: %s", open, keys, strings.Join(worst, "; "))
	}
	var problems []string
	if nBlocked > 0 {
		problems = append(problems, fmt.Sprintf(
			"%d key(s) in strict order blocked by a failed task, their later tasks held back: %s; once the cause is fixed, `pgfence tasks retry ID --reason TEXT` applies the task again, `pgfence tasks skip ID --reason TEXT` lets the key go on without it",
			nBlocked, strings.Join(blocked, "; ")))
	}
	if late > 0 {
		problems = append(problems, fmt.Sprintf(
			"%d key(s) with a pending task older than %s or %d or more open tasks: is a consumer running, granted the key's lease prefix (\"pgfence.task:\" + key), and applying without errors? (`pgfence tasks list --key KEY`)",
			late, taskAgeWarn, taskBacklogWarn))
	}
	if len(problems) > 0 {
		return check{Name: name, Status: statusWarn, Detail: strings.Join(problems, "; ") + ". " + summary}, true
	}
	return check{Name: name, Status: statusOK, Detail: summary + "; no key is blocked"}, true
}
