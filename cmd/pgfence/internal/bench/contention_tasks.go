package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/tasks"
)

// The ordered-task mode of the contention run (ContentionOptions.Mode
// "tasks"): the workers are producers that hand each business intent over
// with tasks.Enqueue and come back for its result, and consumers apply each
// key's tasks in sequence order, many per transaction. A producer holds no
// connection while it waits: one listening connection of the run tells it
// when its task was applied (the consumer's transaction sends the NOTIFY,
// delivered when it commits), as an application would answer "processing"
// and tell its caller later.
//
// Before the tasks, the same producers insert the same task rows into a
// bare copy of pgfence.tasks (same columns and indexes, no function, no
// check, no consumer) for the same duration: the floor of any queue kept in
// this database, measured in the same run.

const (
	sqlTasksTables = `CREATE TABLE pgfence_bench.task_completions (id bigserial PRIMARY KEY, key pg_catalog.text NOT NULL,
	    task bigint NOT NULL, seq bigint NOT NULL, n bigint NOT NULL, producer int NOT NULL, pseq bigint NOT NULL);
	CREATE TABLE pgfence_bench.task_floor (LIKE pgfence.tasks INCLUDING ALL);
	CREATE SEQUENCE pgfence_bench.task_floor_ids AS bigint`
	// sqlTasksFloor is the floor: the row task_enqueue inserts, bare.
	sqlTasksFloor = `INSERT INTO pgfence_bench.task_floor (id, key, xid, payload, enqueued_by, enqueued_at)
	    VALUES (pg_catalog.nextval('pgfence_bench.task_floor_ids'), $1, pg_catalog.pg_current_xact_id(), $2::jsonb,
	        CURRENT_USER, pg_catalog.clock_timestamp())`
	// sqlTasksApply is the business write of one batch, in the consumer's
	// transaction: the key's counter goes up by the batch's size and a
	// completion row per task, in sequence order, records the counter as
	// that task left it. Completion ids are drawn in commit order per key
	// (the key has one consumer at a time).
	sqlTasksApply = `WITH c AS (UPDATE pgfence_bench.contention_counters SET n = n OPERATOR(pg_catalog.+) pg_catalog.cardinality($2::bigint[])
	        WHERE key OPERATOR(pg_catalog.=) $1 RETURNING n OPERATOR(pg_catalog.-) pg_catalog.cardinality($2::bigint[]) AS base)
	    INSERT INTO pgfence_bench.task_completions (key, task, seq, n, producer, pseq)
	    SELECT $1, t.task, t.seq, c.base OPERATOR(pg_catalog.+) t.ord, t.producer, t.pseq
	      FROM c, ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::bigint[]), pg_catalog.unnest($4::int[]),
	          pg_catalog.unnest($5::bigint[])) WITH ORDINALITY AS t(task, seq, producer, pseq, ord)
	     ORDER BY t.ord`
	sqlTasksNotify      = `SELECT pg_catalog.pg_notify($1, $2)`
	sqlTasksCompletions = `SELECT key, task, seq, n, producer, pseq FROM pgfence_bench.task_completions ORDER BY id`
	sqlTasksStates      = `SELECT key, pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'done'), pg_catalog.count(*)
	    FROM pgfence.tasks WHERE key OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[]) GROUP BY key`
)

// tasksDrainTimeout bounds how long the producers wait, after the run's
// end, for their last tasks to be applied.
const tasksDrainTimeout = time.Minute

// enqueued is one task a producer enqueued.
type enqueued struct {
	key      int
	id       int64
	producer int
	pseq     int64
}

// taskRow is one completion row of the ordered-task mode, in commit order.
type taskRow struct {
	key          string
	task, seq, n int64
	producer     int
	pseq         int64
}

// payload is a task's payload: its producer and the producer's count.
type payload struct {
	P int   `json:"p"`
	I int64 `json:"i"`
}

// tasksRun is the state the producers, consumers and listener share.
type tasksRun struct {
	opts    ContentionOptions
	lab     *Lab
	prefix  string
	keys    []string
	channel string

	floorInserts, enqueuedN, applied, batches, errs atomic.Int64

	mu          sync.Mutex
	floorLat    []time.Duration
	enqueueLat  []time.Duration
	appliedLat  []time.Duration
	batchGaps   []time.Duration
	batchWrites []time.Duration
	lastBatch   time.Time
	tasks       []enqueued
	waiting     map[int64]chan time.Time
	told        map[int64]time.Time // applied before its producer waited
	keyEnqueued []int64
	firstError  error
}

func (r *tasksRun) fail(err error) {
	r.errs.Add(1)
	r.mu.Lock()
	if r.firstError == nil {
		r.firstError = err
	}
	r.mu.Unlock()
}

func (r *tasksRun) sample(start time.Time) ContentionSample {
	e, a := r.enqueuedN.Load(), r.applied.Load()
	return ContentionSample{At: time.Since(start), Enqueued: e, Applied: a, Backlog: e - a, FloorInserts: r.floorInserts.Load()}
}

// contentionTasks is [Lab.Contention] in the ordered-task mode.
func (lab *Lab) contentionTasks(ctx context.Context, opts ContentionOptions, prefix string, keys []string) (*ContentionReport, error) {
	if lab.pooled {
		return nil, errors.New("bench contention --mode tasks: a transaction pooler answers at the URL, and the run tells producers their task was applied by LISTEN; run it against the server")
	}
	r := &tasksRun{opts: opts, lab: lab, prefix: prefix, keys: keys, channel: "pgfence_bench_" + strconv.FormatInt(time.Now().UnixNano(), 36),
		waiting: map[int64]chan time.Time{}, told: map[int64]time.Time{}, keyEnqueued: make([]int64, len(keys))}
	if _, err := lab.db.Pool.Exec(ctx, sqlTasksTables); err != nil {
		return nil, fmt.Errorf("contention setup: %w", err)
	}
	fmt.Fprintf(lab.progress, "bench contention: %d producers on %d keys for %s, %d consumers (lease TTL %s); first the floor, a bare INSERT of the task rows, for as long; %s\n",
		opts.Workers, opts.Keys, opts.Duration, opts.Consumers, opts.TTL, lab.settings)

	var samples []ContentionSample
	sampling := func(start time.Time) func() {
		return sampleEvery(opts.Duration, &samples, func() ContentionSample { return r.sample(start) })
	}

	// The floor.
	done := startProgressStatus(lab.progress, "floor", opts.Duration, 0, func() string {
		return fmt.Sprintf("%d rows inserted", r.floorInserts.Load())
	})
	start := time.Now()
	stopSampling := sampling(start)
	runCtx, cancel := context.WithDeadline(ctx, start.Add(opts.Duration))
	var wg sync.WaitGroup
	for i := range opts.Workers {
		wg.Go(func() { r.floor(ctx, runCtx, i) })
	}
	wg.Wait()
	cancel()
	floorElapsed := time.Since(start)
	stopSampling()
	done()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	floorSamples := samples
	samples = nil

	// The ordered tasks.
	ready, listening := make(chan error, 1), make(chan error, 1)
	lctx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	go func() { listening <- r.listen(lctx, ready) }()
	if err := <-ready; err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	consumers, err := r.consumers(ctx)
	if err != nil {
		return nil, err
	}
	done = startProgressStatus(lab.progress, "tasks", opts.Duration, 0, func() string {
		return fmt.Sprintf("%d enqueued, %d applied", r.enqueuedN.Load(), r.applied.Load())
	})
	start, statements := time.Now(), lab.stmts.Load()
	r.mu.Lock()
	r.lastBatch = start
	r.mu.Unlock()
	stopSampling = sampling(start)
	runCtx, cancel = context.WithDeadline(ctx, start.Add(opts.Duration))
	drainCtx, cancelDrain := context.WithDeadline(ctx, start.Add(opts.Duration+tasksDrainTimeout))
	for i := range opts.Workers {
		wg.Go(func() { r.produce(drainCtx, runCtx, i) })
	}
	wg.Wait()
	cancel()
	cancelDrain()
	elapsed := time.Since(start)
	stopSampling()
	done()
	consumers()
	statements = lab.stmts.Load() - statements

	stopListening()
	if err := <-listening; err != nil {
		r.fail(fmt.Errorf("listen: %w", err))
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	rep := &ContentionReport{Machine: machine(), Settings: lab.settings, Options: opts, Elapsed: elapsed, Errors: r.errs.Load(),
		RejectionsRecorded: -1, Samples: samples, FloorSamples: floorSamples, FloorElapsed: floorElapsed, FloorInserts: r.floorInserts.Load(),
		Enqueued: r.enqueuedN.Load(), Applied: r.applied.Load(), Batches: r.batches.Load(), Statements: statements}
	if r.firstError != nil {
		rep.FirstError = r.firstError.Error()
	}
	rep.FloorP50, rep.FloorP99 = percentiles(r.floorLat)
	rep.EnqueueP50, rep.EnqueueP99 = percentiles(r.enqueueLat)
	rep.AppliedP50, rep.AppliedP99 = percentiles(r.appliedLat)
	rep.BatchP50, rep.BatchP99 = percentiles(r.batchGaps)
	rep.WriteP50, rep.WriteP99 = percentiles(r.batchWrites)
	for _, s := range samples {
		rep.BacklogMax = max(rep.BacklogMax, s.Backlog)
	}

	counters, err := lab.counters(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := lab.db.Pool.Query(ctx, sqlTasksCompletions)
	table, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (taskRow, error) {
		var t taskRow
		return t, row.Scan(&t.key, &t.task, &t.seq, &t.n, &t.producer, &t.pseq)
	})
	if err != nil {
		return nil, fmt.Errorf("read the completions back: %w", err)
	}
	states := map[string][2]int64{}
	rows, _ = lab.db.Pool.Query(ctx, sqlTasksStates, keys)
	var k string
	var doneN, all int64
	if _, err := pgx.ForEachRow(rows, []any{&k, &doneN, &all}, func() error { states[k] = [2]int64{doneN, all}; return nil }); err != nil {
		return nil, fmt.Errorf("read the tasks back: %w", err)
	}
	rep.Completions = int64(len(table))
	rep.PerKey, rep.Checks = reconcileTasks(keys, r.tasks, table, counters, states)
	for i := range rep.PerKey {
		rep.PerKey[i].Enqueued = r.keyEnqueued[i]
	}
	rep.Reconciled = true
	for _, c := range rep.Checks {
		rep.Reconciled = rep.Reconciled && c.Held
	}
	return rep, nil
}

// percentiles returns the p50 and p99 of d (sorting it).
func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(d)
	if n := len(d); n > 0 {
		return d[n/2], d[n*99/100]
	}
	return 0, 0
}

// floor inserts bare task rows until runCtx ends.
func (r *tasksRun) floor(ctx, runCtx context.Context, id int) {
	var lat []time.Duration
	for i := int64(1); runCtx.Err() == nil; i++ {
		k := int(i+int64(id)) % len(r.keys)
		p, _ := json.Marshal(payload{P: id, I: i})
		start := time.Now()
		// The command's context: a statement cut at the run's end would count as an error.
		if _, err := r.lab.pool.Exec(ctx, sqlTasksFloor, r.keys[k], string(p)); err != nil {
			r.fail(fmt.Errorf("floor insert: %w", err))
			sleep(runCtx, 10*time.Millisecond)
			continue
		}
		lat = append(lat, time.Since(start))
		r.floorInserts.Add(1)
	}
	r.mu.Lock()
	r.floorLat = append(r.floorLat, lat...)
	r.mu.Unlock()
}

// produce enqueues a task, waits to be told it was applied (holding no
// connection), and enqueues the next, until runCtx ends; drainCtx bounds
// the wait for its last task.
func (r *tasksRun) produce(drainCtx, runCtx context.Context, id int) {
	var enq, appl []time.Duration
	defer func() {
		r.mu.Lock()
		r.enqueueLat, r.appliedLat = append(r.enqueueLat, enq...), append(r.appliedLat, appl...)
		r.mu.Unlock()
	}()
	for i := int64(1); runCtx.Err() == nil; i++ {
		k := int(i+int64(id)) % len(r.keys)
		p, _ := json.Marshal(payload{P: id, I: i})
		start := time.Now()
		t, err := tasks.Enqueue(drainCtx, r.lab.pool, r.keys[k], p, nil)
		if err != nil {
			r.fail(fmt.Errorf("enqueue to %s: %w", r.keys[k], err))
			sleep(runCtx, 10*time.Millisecond)
			continue
		}
		enq = append(enq, time.Since(start))
		r.enqueuedN.Add(1)
		r.mu.Lock()
		r.tasks = append(r.tasks, enqueued{key: k, id: t.ID, producer: id, pseq: i})
		r.keyEnqueued[k]++
		at, told := r.told[t.ID]
		delete(r.told, t.ID)
		wait := make(chan time.Time, 1)
		if !told {
			r.waiting[t.ID] = wait
		}
		r.mu.Unlock()
		if !told {
			select {
			case at = <-wait:
			case <-drainCtx.Done():
				r.fail(fmt.Errorf("task %d of %s was not applied within %s of the run's end", t.ID, r.keys[k], tasksDrainTimeout))
				return
			}
		}
		appl = append(appl, at.Sub(start))
	}
}

// listen tells the producers when their tasks were applied: the consumers'
// transactions send the ids on r.channel. It sends on ready once it listens
// (or the error that stopped it first), then returns the error it stopped
// with (nil when ctx ended).
func (r *tasksRun) listen(ctx context.Context, ready chan<- error) error {
	c, err := r.lab.pool.Acquire(ctx)
	if err != nil {
		ready <- err
		return nil
	}
	conn := c.Hijack() // closed, not returned to the pool: it listens
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.channel}.Sanitize()); err != nil {
		ready <- err
		return nil
	}
	ready <- nil
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		at := time.Now()
		ids := strings.Split(n.Payload, ",")
		r.applied.Add(int64(len(ids)))
		r.mu.Lock()
		for _, s := range ids {
			id, _ := strconv.ParseInt(s, 10, 64)
			if w, ok := r.waiting[id]; ok {
				w <- at
				delete(r.waiting, id)
			} else {
				r.told[id] = at
			}
		}
		r.mu.Unlock()
	}
}

// consumers starts opts.Consumers consumers, each with its own leases
// client, and returns the function that stops them and waits for them.
func (r *tasksRun) consumers(ctx context.Context) (stop func(), err error) {
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var clients []*leases.Client
	stop = func() {
		cancel()
		wg.Wait()
		for _, c := range clients {
			c.Close()
		}
	}
	for range r.opts.Consumers {
		client, err := leases.New(r.lab.pool, r.lab.leasesConfig(nil))
		if err != nil {
			stop()
			return nil, err
		}
		clients = append(clients, client)
		c, err := tasks.NewConsumer(client, r.apply, &tasks.Config{Prefix: r.prefix, TTL: r.opts.TTL, PollInterval: 10 * time.Millisecond})
		if err != nil {
			stop()
			return nil, err
		}
		wg.Go(func() {
			if err := c.Run(cctx); err != nil {
				r.fail(fmt.Errorf("consumer: %w", err))
			}
		})
	}
	return stop, nil
}

// apply is the consumers' business write: one statement for the batch,
// and the notification that tells its producers, delivered at commit.
func (r *tasksRun) apply(ctx context.Context, tx pgx.Tx, batch []tasks.Task) ([]json.RawMessage, error) {
	ids, seqs, producers, pseqs := make([]int64, len(batch)), make([]int64, len(batch)), make([]int32, len(batch)), make([]int64, len(batch))
	told := make([]string, len(batch))
	for i, t := range batch {
		var p payload
		if err := json.Unmarshal(t.Payload, &p); err != nil {
			return nil, fmt.Errorf("task %d: %w", t.ID, err)
		}
		ids[i], seqs[i], producers[i], pseqs[i] = t.ID, t.Seq, int32(p.P), p.I
		told[i] = strconv.FormatInt(t.ID, 10)
	}
	r.batches.Add(1)
	r.mu.Lock() // one key's batches come one at a time; several keys' interleave
	now := time.Now()
	r.batchGaps = append(r.batchGaps, now.Sub(r.lastBatch))
	r.lastBatch = now
	r.mu.Unlock()
	b := &pgx.Batch{}
	b.Queue(sqlTasksApply, batch[0].Key, ids, seqs, producers, pseqs)
	b.Queue(sqlTasksNotify, r.channel, strings.Join(told, ","))
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		r.fail(fmt.Errorf("apply a batch of %s: %w", batch[0].Key, err)) // the consumer only logs it
		return nil, err
	}
	took := time.Since(now)
	r.mu.Lock()
	r.batchWrites = append(r.batchWrites, took)
	r.mu.Unlock()
	return make([]json.RawMessage, len(batch)), nil
}

// reconcileTasks compares the tasks the producers enqueued with the
// business table read back (table, in commit order; counters by key) and
// pgfence.tasks (states: done and all tasks by key), and returns the
// figures per key and the checks.
func reconcileTasks(keys []string, enq []enqueued, table []taskRow, counters map[string]int64, states map[string][2]int64) ([]ContentionKey, []ContentionCheck) {
	per := make([]ContentionKey, len(keys))
	index := map[string]int{}
	for i, k := range keys {
		per[i] = ContentionKey{Key: k, Counter: counters[k]}
		index[k] = i
	}
	want := map[int64]enqueued{}
	for _, e := range enq {
		want[e.id] = e
	}
	seen := map[int64]int{}
	lastPseq := map[int]int64{}
	var unknown, twice, wrongKey, seqOff, counterGaps, producerOrder int
	var firstSeq, firstGap, firstOrder string
	for _, row := range table {
		i, ok := index[row.key]
		e, enqueuedIt := want[row.task]
		if !ok || !enqueuedIt {
			unknown++
			continue
		}
		if e.key != i || e.producer != row.producer || e.pseq != row.pseq {
			wrongKey++
		}
		if seen[row.task]++; seen[row.task] > 1 {
			twice++
		}
		p := &per[i]
		p.Completions++
		// Applied in number order, without a gap.
		if row.seq != p.Completions {
			seqOff++
			if firstSeq == "" {
				firstSeq = fmt.Sprintf("%s: completion %d applied task %d, seq %d", row.key, p.Completions, row.task, row.seq)
			}
		}
		p.LastSeq = row.seq
		if row.n != p.Completions {
			counterGaps++
			if firstGap == "" {
				firstGap = fmt.Sprintf("%s: completion %d saw the counter at %d", row.key, p.Completions, row.n)
			}
		}
		if row.pseq <= lastPseq[row.producer] {
			producerOrder++
			if firstOrder == "" {
				firstOrder = fmt.Sprintf("producer %d: its task %d applied after its task %d", row.producer, row.pseq, lastPseq[row.producer])
			}
		}
		lastPseq[row.producer] = row.pseq
	}
	missing := 0
	for id := range want {
		if seen[id] == 0 {
			missing++
		}
	}

	var checks []ContentionCheck
	add := func(check string, held bool, detail string) {
		checks = append(checks, ContentionCheck{Check: check, Held: held, Detail: detail})
	}
	add("every enqueued task was applied exactly once", missing == 0 && twice == 0 && unknown == 0 && wrongKey == 0,
		fmt.Sprintf("%d tasks enqueued, %d completion rows; %d not applied, %d applied twice, %d rows of no enqueued task, %d rows that differ from their task",
			len(want), len(table), missing, twice, unknown, wrongKey))
	add(counterCheck(per, counterGaps, firstGap, "task"))
	var detail string
	detail = "per key in commit order: 1, 2, 3, …"
	if seqOff > 0 {
		detail = fmt.Sprintf("%d rows out of sequence (first: %s)", seqOff, firstSeq)
	}
	add("each key's tasks were applied in sequence order, without gaps", seqOff == 0, detail)
	detail = "every producer's tasks in the order it enqueued them"
	if producerOrder > 0 {
		detail = fmt.Sprintf("%d rows out of their producer's order (first: %s)", producerOrder, firstOrder)
	}
	add("a task enqueued after another was applied after it", producerOrder == 0, detail)
	var notDone []string
	for _, p := range per {
		if s := states[p.Key]; s[0] != p.Completions || s[1] != p.Completions {
			notDone = append(notDone, fmt.Sprintf("%s: %d of %d tasks done, %d rows", p.Key, s[0], s[1], p.Completions))
		}
	}
	detail = "pgfence.tasks: every task of the run's keys is done, one per completion row"
	if len(notDone) > 0 {
		detail = fmt.Sprintf("%d keys off (first: %s)", len(notDone), first(notDone))
	}
	add("every task is recorded done with its business write", len(notDone) == 0, detail)
	return per, checks
}
