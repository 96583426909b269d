package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// The contention run ([Lab.Contention]) is the capacity report: workers, each
// with its own leases.Client, contend for a few hot keys; every grant does one
// fenced business write and releases. A coordination rate alone (grants per
// second) says nothing about the work done, so the report puts successful
// acquisitions, wait time, give-ups, renewals, expiries, fence rejections and
// the business completions read back from the business table side by side,
// and reconciles what the workers saw accepted with what the table holds.
//
// Some grants are paused: the worker sleeps while holding its lease, past the
// TTL, without renewing (as a process stopped by a long GC pause, a VM stall
// or SIGSTOP would), and then still sends its fenced write, deliberately
// outside its lease's context (the process did not notice). If another worker
// took the key over and wrote meanwhile, the database must reject the write.

// The business tables of the contention run, in the lab's schema (dropped
// when the lab closes). Each completion row records the token of the grant
// that wrote it and the key's counter as that write left it.
const (
	sqlContentionTables = `CREATE TABLE pgfence_bench.contention_counters (key pg_catalog.text PRIMARY KEY, n bigint NOT NULL);
	CREATE TABLE pgfence_bench.contention_completions (id bigserial PRIMARY KEY, key pg_catalog.text NOT NULL, token bigint NOT NULL,
	    n bigint NOT NULL, worker int NOT NULL, paused boolean NOT NULL, at timestamp with time zone NOT NULL DEFAULT pg_catalog.clock_timestamp())`
	sqlContentionKeys = `INSERT INTO pgfence_bench.contention_counters (key, n) SELECT k, 0 FROM pg_catalog.unnest($1::pg_catalog.text[]) AS k`
	// sqlContentionWrite is the business write, sent by pgfence.Exec after
	// the fence of the lease's key in one implicit transaction: the key's
	// counter goes up by one and a completion row records it with the token.
	// The fence row stays locked from the fence to the commit, so the ids of
	// one key's completion rows are drawn in commit order.
	sqlContentionWrite = `WITH c AS (UPDATE pgfence_bench.contention_counters SET n = n OPERATOR(pg_catalog.+) 1
	        WHERE key OPERATOR(pg_catalog.=) $1 RETURNING n)
	    INSERT INTO pgfence_bench.contention_completions (key, token, n, worker, paused) SELECT $1, $2, c.n, $3, $4 FROM c`
	sqlContentionCounters    = `SELECT key, n FROM pgfence_bench.contention_counters`
	sqlContentionCompletions = `SELECT key, token, n, paused FROM pgfence_bench.contention_completions ORDER BY id`
	// sqlContentionRecorded counts the rejections pgfence recorded for the
	// run's keys (best effort: pgfence records them after the fact).
	sqlContentionRecorded = `SELECT pg_catalog.count(*) FROM pgfence.fence_rejections
	    WHERE resource OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[])`
)

// The modes of [Lab.Contention].
const (
	ModeLock  = "lock"  // workers take the key's lease and write under it
	ModeTasks = "tasks" // workers enqueue ordered tasks that consumers apply
)

// ContentionOptions says what [Lab.Contention] runs.
type ContentionOptions struct {
	// Mode is ModeLock (the default) or ModeTasks. In ModeTasks the
	// workers are producers, Consumers consumers apply the keys' tasks
	// under leases of TTL, and MaxWait, Hold and the pauses do not apply.
	Mode      string
	Consumers int
	// Workers contend for Keys keys for Duration; each has its own
	// leases.Client, as separate processes would.
	Workers, Keys int
	Duration      time.Duration
	// TTL is each grant's lease length.
	TTL time.Duration
	// MaxWait bounds each Acquire (AcquireOptions.MaxWait); one that waits
	// longer gives up. 0: wait until the run ends.
	MaxWait time.Duration
	// Hold is the business work of each grant before its write, its lease
	// renewed every TTL/3 meanwhile. 0: write at once.
	Hold time.Duration
	// PauseRate is the share of grants whose holder pauses for Pause (longer
	// than the TTL) before its write, without renewing. PauseFirst pauses
	// the first grant of every key as well, for Pause and until another
	// worker has written the key (or the run ends), so that every run has
	// stale writes to reject.
	PauseRate  float64
	Pause      time.Duration
	PauseFirst bool
}

// ContentionReport is what [Lab.Contention] measured and read back.
type ContentionReport struct {
	Machine, Settings string
	Options           ContentionOptions
	// Elapsed runs from the start to the last worker's end (a paused holder
	// finishes its write after Duration).
	Elapsed time.Duration

	// Coordination.
	Acquisitions int64
	// WaitP50 and WaitP99 are the wait of the successful Acquire calls.
	WaitP50, WaitP99 time.Duration
	// CycleP50 and CycleP99 are a granted worker's acquire + write +
	// release, from the start of its Acquire to the end of its Release.
	CycleP50, CycleP99 time.Duration
	// GiveUps are the Acquire calls that waited MaxWait in vain.
	GiveUps int64
	// Renewals are the renewals that committed while grants were held.
	Renewals int64
	// Expiries are the grants that expired before their release (the
	// release said the lease was lost); TakenOver those of them whose key was
	// granted to another worker meanwhile.
	Expiries, TakenOver int64
	PausedGrants        int64

	// Business.
	// Accepted are the writes the workers saw accepted.
	Accepted int64
	// Rejected are the writes the database refused with a stale token;
	// PausedRejected those of paused holders.
	Rejected, PausedRejected int64
	// LateAccepted are paused holders' writes the fence accepted: no newer
	// grant of the key had written yet (the fencing-token contract allows
	// it; the token order still holds).
	LateAccepted int64
	// Stopped are grants whose holder stopped before its write: the lease's
	// context ended (its trust window ran out) first.
	Stopped int64
	// Completions are the completion rows read back from the business table.
	Completions int64
	// RejectionsRecorded is what pgfence.fence_rejections holds for the
	// run's keys (best effort, recorded after each rejection); -1 when it
	// could not be read.
	RejectionsRecorded int64
	Errors             int64
	FirstError         string

	PerKey []ContentionKey
	Checks []ContentionCheck
	// Reconciled is true when every check held.
	Reconciled bool

	// Samples are the workers' counters over the run, about 20 from the
	// start to the end (at least 200ms apart: fewer events per sample
	// would make their rates mostly noise). In ModeTasks, FloorSamples
	// are the floor's, from its own start.
	Samples, FloorSamples []ContentionSample

	// ModeTasks. The floor ran for FloorElapsed before the tasks: the
	// producers inserted FloorInserts bare task rows, each in FloorP50 /
	// FloorP99. Then they enqueued Enqueued tasks, each in EnqueueP50 /
	// EnqueueP99, and were told Applied were applied, AppliedP50 /
	// AppliedP99 after the enqueue started. BacklogMax is the most tasks
	// enqueued and not yet applied at a sample. The consumers applied
	// Batches batches, BatchP50 / BatchP99 apart, their business write
	// taking WriteP50 / WriteP99 (the rest is the claim, the completion and
	// the commit); Statements are what the
	// run's pool sent meanwhile (producers' and consumers')..
	FloorElapsed                                time.Duration
	FloorInserts, Enqueued, Applied, BacklogMax int64
	Batches, Statements                         int64
	BatchP50, BatchP99, WriteP50, WriteP99      time.Duration
	FloorP50, FloorP99, EnqueueP50, EnqueueP99  time.Duration
	AppliedP50, AppliedP99                      time.Duration
}

// ContentionSample is what the workers had counted At after the run's start.
type ContentionSample struct {
	At                                        time.Duration
	Acquisitions, GiveUps, Renewals, Expiries int64
	Accepted, Rejected, Stopped               int64
	// ModeTasks: the floor's rows, the tasks enqueued and applied, and
	// the difference.
	FloorInserts, Enqueued, Applied, Backlog int64
}

// ContentionKey is one hot key's part of the run.
type ContentionKey struct {
	Key          string
	Acquisitions int64
	GiveUps      int64
	Accepted     int64
	Rejected     int64
	// Completions and Counter are read back: the key's completion rows and
	// its counter row.
	Completions int64
	Counter     int64
	// LastToken is the token of the key's last completion row (0: none).
	LastToken int64
	// ModeTasks: the tasks enqueued to the key, and the sequence number
	// of its last completion row (0: none).
	Enqueued, LastSeq int64
}

// ContentionCheck is one reconciliation check.
type ContentionCheck struct {
	Check  string
	Held   bool
	Detail string
}

// grantWrite is one write a worker sent, as the worker saw its outcome.
type grantWrite struct {
	key      int
	token    int64
	accepted bool
}

// completion is one completion row, in commit order.
type completion struct {
	key    string
	token  int64
	n      int64
	paused bool
}

// contentionRun is the state the workers share.
type contentionRun struct {
	opts    ContentionOptions
	lab     *Lab
	keys    []string
	first   []atomic.Bool  // per key: its first grant was taken (PauseFirst)
	newest  []atomic.Int64 // per key: the highest token granted so far
	written []atomic.Int64 // per key: the highest token of an accepted write

	acquisitions, giveUps, renewals, expiries, takenOver, paused    atomic.Int64
	accepted, rejected, pausedRejected, lateAccepted, stopped, errs atomic.Int64

	mu         sync.Mutex
	waits      []time.Duration
	cycles     []time.Duration
	writes     []grantWrite
	keyGrants  []int64
	keyGiveUps []int64
	firstError error
}

func (r *contentionRun) sample(start time.Time) ContentionSample {
	return ContentionSample{At: time.Since(start), Acquisitions: r.acquisitions.Load(), GiveUps: r.giveUps.Load(), Renewals: r.renewals.Load(),
		Expiries: r.expiries.Load(), Accepted: r.accepted.Load(), Rejected: r.rejected.Load(), Stopped: r.stopped.Load()}
}

func (r *contentionRun) fail(err error) {
	r.errs.Add(1)
	r.mu.Lock()
	if r.firstError == nil {
		r.firstError = err
	}
	r.mu.Unlock()
}

// Contention runs the capacity report: opts.Workers workers contend for
// opts.Keys keys for opts.Duration, then the business table is read back and
// reconciled with what the workers saw (in ModeTasks, with applying each
// key's tasks in order, after the floor; see contention_tasks.go). Progress goes to the lab's progress
// writer. An error means the run could not be made; a run whose
// reconciliation failed is reported with Reconciled false.
func (lab *Lab) Contention(ctx context.Context, opts ContentionOptions) (*ContentionReport, error) {
	run := &contentionRun{opts: opts, lab: lab, first: make([]atomic.Bool, opts.Keys), newest: make([]atomic.Int64, opts.Keys),
		written:   make([]atomic.Int64, opts.Keys),
		keyGrants: make([]int64, opts.Keys), keyGiveUps: make([]int64, opts.Keys)}
	// Fresh keys in every run: the fence of a key never goes back.
	prefix := "bench/contention/" + strconv.FormatInt(time.Now().UnixNano(), 36) + "/"
	for i := range opts.Keys {
		run.keys = append(run.keys, prefix+strconv.Itoa(i))
	}
	if _, err := lab.db.Pool.Exec(ctx, sqlContentionTables); err != nil {
		return nil, fmt.Errorf("contention setup: %w", err)
	}
	if _, err := lab.db.Pool.Exec(ctx, sqlContentionKeys, run.keys); err != nil {
		return nil, fmt.Errorf("contention setup: %w", err)
	}
	if opts.Mode == ModeTasks {
		return lab.contentionTasks(ctx, opts, prefix, run.keys)
	}
	clients := make([]*leases.Client, opts.Workers)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}()
	for i := range clients {
		c, err := leases.New(lab.pool, lab.leasesConfig(nil))
		if err != nil {
			return nil, err
		}
		clients[i] = c
	}

	pauses := fmt.Sprintf("%.0f%% of grants paused for %s", 100*opts.PauseRate, opts.Pause)
	if opts.PauseFirst {
		pauses += ", and the first grant of every key"
	}
	wakeups := "wake-ups on"
	if lab.pooled {
		wakeups = "wake-ups off (a pooler answers: waiters poll)"
	}
	fmt.Fprintf(lab.progress, "bench contention: %d workers on %d keys for %s, TTL %s, max wait %s, hold %s, %s, %s; %s\n",
		opts.Workers, opts.Keys, opts.Duration, opts.TTL, opts.MaxWait, opts.Hold, pauses, wakeups, lab.settings)
	done := startProgressStatus(lab.progress, "contention", opts.Duration, 0, func() string {
		return fmt.Sprintf("%d grants, %d accepted, %d rejected", run.acquisitions.Load(), run.accepted.Load(), run.rejected.Load())
	})
	start := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(opts.Duration))
	var wg sync.WaitGroup
	for i := range opts.Workers {
		wg.Go(func() { run.worker(ctx, runCtx, i, clients[i]) })
	}
	// The counters, sampled while the workers run: a few atomic loads.
	var samples []ContentionSample
	stopSampling := sampleEvery(opts.Duration, &samples, func() ContentionSample { return run.sample(start) })
	wg.Wait()
	stopSampling()
	cancel()
	elapsed := time.Since(start)
	done()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	rep := &ContentionReport{Machine: machine(), Settings: lab.settings, Options: opts, Elapsed: elapsed,
		Acquisitions: run.acquisitions.Load(), GiveUps: run.giveUps.Load(), Renewals: run.renewals.Load(),
		Expiries: run.expiries.Load(), TakenOver: run.takenOver.Load(), PausedGrants: run.paused.Load(),
		Accepted: run.accepted.Load(), Rejected: run.rejected.Load(), PausedRejected: run.pausedRejected.Load(),
		LateAccepted: run.lateAccepted.Load(), Stopped: run.stopped.Load(), Errors: run.errs.Load(), RejectionsRecorded: -1,
		Samples: samples}
	if run.firstError != nil {
		rep.FirstError = run.firstError.Error()
	}
	rep.WaitP50, rep.WaitP99 = percentiles(run.waits)
	rep.CycleP50, rep.CycleP99 = percentiles(run.cycles)

	// Read the business table back.
	counters, err := lab.counters(ctx)
	if err != nil {
		return nil, err
	}
	var table []completion
	rows, err := lab.db.Pool.Query(ctx, sqlContentionCompletions)
	if err != nil {
		return nil, fmt.Errorf("read the completions back: %w", err)
	}
	for rows.Next() {
		var c completion
		if err := rows.Scan(&c.key, &c.token, &c.n, &c.paused); err != nil {
			rows.Close()
			return nil, err
		}
		table = append(table, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the completions back: %w", err)
	}
	if err := lab.db.Pool.QueryRow(ctx, sqlContentionRecorded, run.keys).Scan(&rep.RejectionsRecorded); err != nil {
		fmt.Fprintf(lab.progress, "  could not count the recorded rejections: %v\n", err)
		rep.RejectionsRecorded = -1
	}
	rep.Completions = int64(len(table))
	rep.PerKey, rep.Checks = reconcile(run.keys, run.writes, table, counters)
	for i := range rep.PerKey {
		rep.PerKey[i].Acquisitions, rep.PerKey[i].GiveUps = run.keyGrants[i], run.keyGiveUps[i]
	}
	rep.Reconciled = true
	for _, c := range rep.Checks {
		rep.Reconciled = rep.Reconciled && c.Held
	}
	return rep, nil
}

// counters reads the contention run's counters back, by key.
func (lab *Lab) counters(ctx context.Context) (map[string]int64, error) {
	counters := map[string]int64{}
	rows, _ := lab.db.Pool.Query(ctx, sqlContentionCounters)
	var k string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { counters[k] = n; return nil }); err != nil {
		return nil, fmt.Errorf("read the counters back: %w", err)
	}
	return counters, nil
}

// worker takes grants until runCtx ends; ctx is the whole command's (a
// paused holder finishes its write after the run's end, unless ctx ends).
func (r *contentionRun) worker(ctx, runCtx context.Context, id int, client *leases.Client) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(id)))
	// The worker renews its grants itself (hold): a paused grant must not be
	// renewed, as a stopped process would not renew it, and which grant
	// pauses is known only once it is granted.
	opts := &leases.AcquireOptions{MaxWait: r.opts.MaxWait, HolderInfo: "pgfence bench contention worker " + strconv.Itoa(id), NoKeepAlive: true}
	for runCtx.Err() == nil {
		k := rng.IntN(len(r.keys))
		start := time.Now()
		l, err := client.Acquire(runCtx, r.keys[k], r.opts.TTL, opts)
		wait := time.Since(start)
		switch {
		case err == nil:
		case runCtx.Err() != nil:
			return // the run ended while this worker waited: not a give-up
		case errors.Is(err, context.DeadlineExceeded):
			r.giveUps.Add(1)
			r.mu.Lock()
			r.keyGiveUps[k]++
			r.mu.Unlock()
			continue
		default:
			r.fail(err)
			sleep(runCtx, 10*time.Millisecond)
			continue
		}
		r.acquisitions.Add(1)
		raise(&r.newest[k], l.Token())
		r.mu.Lock()
		r.waits = append(r.waits, wait)
		r.keyGrants[k]++
		r.mu.Unlock()
		paused := r.opts.PauseRate > 0 && rng.Float64() < r.opts.PauseRate
		firstOfKey := r.opts.PauseFirst && r.first[k].CompareAndSwap(false, true)
		r.grant(ctx, runCtx, id, k, l, paused || firstOfKey, firstOfKey)
		cycle := time.Since(start)
		r.mu.Lock()
		r.cycles = append(r.cycles, cycle)
		r.mu.Unlock()
	}
}

// hold keeps l for opts.Hold, or until it ends, renewing it every TTL / 3
// as the client's keep-alive would; it counts
// the renewals that committed. A failed renewal is tried again at the next
// one: the lease ends when its trust window runs out.
func (r *contentionRun) hold(l *leases.Lease) {
	done := time.NewTimer(r.opts.Hold)
	defer done.Stop()
	renew := time.NewTicker(r.opts.TTL / 3)
	defer renew.Stop()
	for {
		select {
		case <-done.C:
			return
		case <-l.Context().Done():
			return
		case <-renew.C:
			if l.Renew(l.Context()) == nil {
				r.renewals.Add(1)
			}
		}
	}
}

// grant does one grant's work: hold (renewing) or pause, the fenced write,
// the release. The first grant of a key under PauseFirst stalls until
// another worker has written the key too (or the run ends), so that its
// write is surely stale.
func (r *contentionRun) grant(ctx, runCtx context.Context, id, k int, l *leases.Lease, paused, firstOfKey bool) {
	writeCtx := l.Context()
	if paused {
		// Stalled: no renewal, no look at the lease's context; then the
		// write goes out as if nothing had happened.
		r.paused.Add(1)
		sleep(ctx, r.opts.Pause)
		for firstOfKey && r.written[k].Load() <= l.Token() && runCtx.Err() == nil {
			sleep(runCtx, 10*time.Millisecond)
		}
		writeCtx = ctx
	} else if r.opts.Hold > 0 {
		r.hold(l)
	}
	accepted, err := r.write(ctx, writeCtx, id, k, l, paused)
	switch {
	case err == nil && accepted:
		r.accepted.Add(1)
		raise(&r.written[k], l.Token())
		if paused {
			r.lateAccepted.Add(1)
		}
		r.record(grantWrite{key: k, token: l.Token(), accepted: true})
	case err == nil:
		// The lease's trust window ran out before the write, or during it
		// and the write did not commit: the client stopped itself.
		r.stopped.Add(1)
	case errors.Is(err, pgfence.ErrStaleToken):
		r.rejected.Add(1)
		if paused {
			r.pausedRejected.Add(1)
		}
		r.record(grantWrite{key: k, token: l.Token()})
	default:
		r.fail(fmt.Errorf("write for %s with token %d: %w", r.keys[k], l.Token(), err))
	}

	// Released even when the command's context ends (a grant left behind
	// would block the key for its TTL), but not waited for forever.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leases.ReleaseTimeoutDefault)
	defer cancel()
	switch err := l.Release(rctx); {
	case err == nil:
	case errors.Is(err, pgfence.ErrLeaseLost):
		r.expiries.Add(1)
		if r.newest[k].Load() > l.Token() {
			r.takenOver.Add(1)
		}
	default:
		r.fail(err)
	}
}

// write sends the fenced business write under writeCtx and tells whether it
// committed. A write whose context ended (the lease's trust window ran out)
// is not an error: it did not commit (false), or it did (true, after reading
// its outcome back when the commit's answer was cut off).
func (r *contentionRun) write(ctx, writeCtx context.Context, id, k int, l *leases.Lease, paused bool) (bool, error) {
	if writeCtx.Err() != nil {
		return false, nil
	}
	n, err := pgfence.Exec(writeCtx, r.lab.pool, l, sqlContentionWrite, r.keys[k], l.Token(), id, paused)
	var unknown *pgfence.OutcomeUnknownError
	switch {
	case err == nil && n != 1:
		return false, fmt.Errorf("the write for %s inserted %d completion rows, want 1", r.keys[k], n)
	case err == nil:
		return true, nil
	case errors.As(err, &unknown):
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		outcome, rerr := pgfence.Resolve(rctx, r.lab.pool, unknown)
		if rerr != nil {
			return false, fmt.Errorf("%w; resolving it: %w", err, rerr)
		}
		return outcome == pgfence.Applied, nil
	case writeCtx.Err() != nil && ctx.Err() == nil && !errors.Is(err, pgfence.ErrStaleToken):
		return false, nil
	}
	return false, err
}

func (r *contentionRun) record(w grantWrite) {
	r.mu.Lock()
	r.writes = append(r.writes, w)
	r.mu.Unlock()
}

// raise sets a to v if v is higher.
func raise(a *atomic.Int64, v int64) {
	for {
		if n := a.Load(); n >= v || a.CompareAndSwap(n, v) {
			return
		}
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// reconcile compares what the workers saw (writes) with the business table
// read back (table, in commit order; counters by key) and returns the figures
// per key and the checks.
func reconcile(keys []string, writes []grantWrite, table []completion, counters map[string]int64) ([]ContentionKey, []ContentionCheck) {
	per := make([]ContentionKey, len(keys))
	index := map[string]int{}
	for i, k := range keys {
		per[i] = ContentionKey{Key: k, Counter: counters[k]}
		index[k] = i
	}
	type grant struct {
		key   string
		token int64
	}
	accepted, rejected := map[grant]int{}, map[grant]bool{}
	var nAccepted int
	for _, w := range writes {
		g := grant{keys[w.key], w.token}
		if w.accepted {
			accepted[g]++
			nAccepted++
			per[w.key].Accepted++
		} else {
			rejected[g] = true
			per[w.key].Rejected++
		}
	}

	var unknownKey, notSeen, stale, regressed, counterGaps int
	var firstStale, firstRegress, firstGap string
	inTable := map[grant]int{}
	for _, c := range table {
		i, ok := index[c.key]
		if !ok {
			unknownKey++
			continue
		}
		p := &per[i]
		g := grant{c.key, c.token}
		inTable[g]++
		if rejected[g] {
			stale++
			if firstStale == "" {
				firstStale = fmt.Sprintf("%s token %d", c.key, c.token)
			}
		}
		if p.Completions > 0 && c.token <= p.LastToken {
			regressed++
			if firstRegress == "" {
				firstRegress = fmt.Sprintf("%s: token %d committed after %d", c.key, c.token, p.LastToken)
			}
		}
		p.Completions++
		p.LastToken = c.token
		if c.n != p.Completions {
			counterGaps++
			if firstGap == "" {
				firstGap = fmt.Sprintf("%s: completion %d saw the counter at %d", c.key, p.Completions, c.n)
			}
		}
	}
	for g, n := range accepted {
		if inTable[g] != n {
			notSeen++
		}
	}
	for g, n := range inTable {
		if accepted[g] != n {
			notSeen++
		}
	}

	var checks []ContentionCheck
	add := func(check string, held bool, detail string) {
		checks = append(checks, ContentionCheck{Check: check, Held: held, Detail: detail})
	}
	add("the completions in the table are the writes the workers saw accepted",
		len(table) == nAccepted && notSeen == 0 && unknownKey == 0,
		fmt.Sprintf("%d completion rows, %d writes accepted; %d grants whose rows differ, %d rows of other keys", len(table), nAccepted, notSeen, unknownKey))
	add(counterCheck(per, counterGaps, firstGap, "write"))
	var detail string
	detail = "in every key's commit order"
	if regressed > 0 {
		detail = fmt.Sprintf("%d rows out of order (first: %s)", regressed, firstRegress)
	}
	add("tokens strictly increase per key in commit order", regressed == 0, detail)
	detail = fmt.Sprintf("%d rejected writes, none in the table", len(rejected))
	if stale > 0 {
		detail = fmt.Sprintf("%d rows of writes the database rejected (first: %s)", stale, firstStale)
	}
	add("no stale write was accepted", stale == 0 && regressed == 0, detail)
	return per, checks
}

func first(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return s[0]
}

// sampleEvery appends sample() to samples about 20 times over a run of
// duration d, at least 200 ms apart, and once more when the returned stop is
// called; stop returns once the last sample is in.
func sampleEvery(d time.Duration, samples *[]ContentionSample, sample func() ContentionSample) (stop func()) {
	quit, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(max(d/20, 200*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-quit:
				*samples = append(*samples, sample())
				return
			case <-tick.C:
				*samples = append(*samples, sample())
			}
		}
	}()
	return func() { close(quit); <-sampled }
}

// counterCheck is the reconciliation both modes share: every key's counter
// equals its completion rows, and each completion (a write, a task) saw the
// counter the one before it left; gaps counts those that did not.
func counterCheck(per []ContentionKey, gaps int, firstGap, what string) (check string, held bool, detail string) {
	var off []string
	for _, p := range per {
		if p.Counter != p.Completions {
			off = append(off, fmt.Sprintf("%s: counter %d, %d rows", p.Key, p.Counter, p.Completions))
		}
	}
	detail = fmt.Sprintf("%d keys, every counter equals its completion rows, each %s saw the one before", len(per), what)
	if len(off) > 0 || gaps > 0 {
		detail = fmt.Sprintf("%d keys off (first: %s); %d %ss saw another counter than the one before left (first: %s)",
			len(off), first(off), gaps, what, firstGap)
	}
	return "each key's counter equals its completion rows", len(off) == 0 && gaps == 0, detail
}
