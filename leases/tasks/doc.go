// Package tasks keeps ordered task records per key in PostgreSQL: the answer
// to a hot key that a lock would serialise. Producers hand their intent over
// with [Enqueue] (inside their business transaction or on their own) and
// return at once, without waiting for each other or for a lock; a client can
// poll the task's [Status]. [Consumer]s claim keys, not tasks: one consumer
// at a time applies a key's tasks, in their sequence order, several in one
// transaction, fenced by its lease on the key.
//
//	task, err := tasks.Enqueue(ctx, tx, "sku/42", []byte(`{"order":1001,"qty":1}`), nil)
//	// ... commit tx; answer "processing" with task.ID
//
//	c, err := tasks.NewConsumer(client, func(ctx context.Context, tx pgx.Tx, batch []tasks.Task) ([]json.RawMessage, error) {
//		results := make([]json.RawMessage, 0, len(batch))
//		for _, t := range batch {
//			// apply t in tx, in order
//			results = append(results, json.RawMessage(`{"ok":true}`))
//		}
//		return results, nil
//	}, nil)
//	err = c.Run(ctx)
//
// The tasks live in pgfence.tasks, one row per task that is its own status
// record; pgfence.task_keys holds each key's numbering state. The SQL
// functions pgfence.task_enqueue, task_status, task_ready_keys, task_claim,
// task_complete and task_fail are the protocol: a client in another language
// takes part by calling them (the migration 00019_tasks.sql documents them).
//
// # Guarantees
//
//   - No enqueue waits on another producer or on a consumer: an enqueue is
//     one INSERT; it takes no lock and updates no counter.
//   - A task exists if and only if the transaction that enqueued it commits.
//   - Each task of a key gets a number (Seq) from 1, without gaps, in the
//     order the enqueues commit, assigned by the key's consumer and never
//     changed: a rolled-back enqueue leaves no task and no gap, and a task
//     enqueued after another one committed gets a higher number. An enqueue
//     in a transaction that stays open holds back no other task; it is
//     numbered after the ones that committed before it.
//   - One consumer applies a key at a time, under a lease on
//     [LeaseKey](key). Every claim and completion is checked against that
//     lease by the database (the lease row is locked until the transaction
//     ends, so no takeover commits in between): a paused or cut-off consumer
//     that lost its lease completes nothing, and everything it applied in the
//     batch's transaction rolls back ([pgfence.ErrLeaseLost]).
//   - A batch's tasks are recorded done, with their results, in the
//     transaction of the business writes that apply them: each task's
//     effects in this database happen exactly once, in sequence order.
//   - A task ends done (its result stored) or failed (its error stored)
//     after at most [Config.MaxAttempts] attempts, with exponential backoff
//     between them; a batch interrupted by a dead consumer counts an attempt
//     for each of its tasks. By default a key is strict: a task waiting for
//     a retry holds back the key's later tasks, and a failed one blocks the
//     key until an operator retries or skips it (pgfence.task_retry,
//     pgfence.task_skip); [Config.Unordered] lets later tasks go on.
//   - Tenancy as for leases: producers need a granted prefix of the task
//     key, consumers one of its lease key ("pgfence.task:" + key), which a
//     producer's grant does not cover; [Status] answers only the role that
//     enqueued the task, the key's consumers and operators.
//
// # Failure handling
//
//   - The backlog is full: [Enqueue] fails with [pgfence.ErrBacklogFull]
//     and writes nothing; answer "try later" (HTTP 429 or 503).
//   - A duplicate idempotency key that another transaction is still
//     enqueueing: [Enqueue] waits for it to end, at most 5 s (or the
//     session's lock_timeout when lower), then fails with
//     [github.com/pgfence/pgfence/idempotency.ErrInProgress] and writes
//     nothing; enqueue again later to learn the task.
//   - A consumer dies mid-batch: its transaction rolls back; once its lease
//     expires (its TTL) another consumer claims the key and applies the
//     batch again, in order.
//   - The connection breaks around a batch's commit: the next claim finds
//     the tasks done (the batch committed) or claims them again (it did not).
//   - Effects outside this database (a payment provider, an e-mail) are
//     applied at least once: a consumer can die after the effect and before
//     its commit. Send [Task.EffectKey] as the downstream idempotency key.
//   - A transaction that has written and stays open, in any database of
//     the cluster, holds back the watermark below which claims no longer
//     look for unnumbered tasks: claims read more of the key's index until
//     it ends (idle_in_transaction_session_timeout bounds an idle one). It
//     holds back no task.
//   - Wake-ups: pgfence.task_enqueue sends NOTIFY pgfence_task_enqueued
//     when no consumer holds the key, and an idle [Consumer] hears it on its
//     leases client's LISTEN connection; it polls every
//     [Config.PollInterval] as well (only that behind PgBouncer in
//     transaction mode, with [leases.Config.DisableWakeups]). A NOTIFY
//     serialises the commits that send one: enqueues to keys that no
//     consumer holds commit one at a time (a hot key's consumer holds it).
//
// # Observability
//
// Each enqueue and each applied batch has a span (pgfence.task.enqueue,
// pgfence.task.apply, with the key) and is counted in
// pgfence.task.operations by pgfence.operation and pgfence.outcome
// (enqueued, duplicate, backlog_full; applied, failed, lease_lost; per task
// task_done and task_failed); pgfence.task.duration holds the durations
// and, as operation "lag", each applied task's time from its enqueue. They
// use the global OpenTelemetry providers. A key's backlog and its oldest
// task's age are read from the database: `pgfence doctor`, `pgfence tasks
// list`.
package tasks
