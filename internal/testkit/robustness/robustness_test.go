package robustness

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

var (
	robustnessDuration = flag.Duration("robustness.duration", 20*time.Second,
		"how long the randomized robustness run injects faults (CI default; try -robustness.duration=10m)")
	robustnessSeed = flag.Uint64("robustness.seed", 0, "seed of the randomized robustness run (0: derived from the clock, printed)")
)

// The randomized robustness run, in the style of etcd's robustness tests: a
// few worker processes run lease → fenced writes → renewal → idempotent
// effect → release cycles on a few resources, each through its own fault
// proxy. The cycles play faults of their own (seeded): a holder paused past
// its lease without noticing, whose renewal is refused, whose lease the next
// holder takes over and whose write arriving after the next holder's is
// stale; a COMMIT or release whose request or reply is lost, which the worker
// reads back (pgfence.Resolve, the idempotency key); a duplicate request for
// a recent intent. Meanwhile faults are injected at random: connection cuts,
// delays, network partitions, SIGSTOP past the lease, and fast and crash
// database restarts. Every operation is recorded with monotonic call and
// return times and the outcome the driver saw (unknown when it could not
// know). Afterwards the ground truth is read back and the history is checked
// (Check: invariants + porcupine). A failing history is saved under testdata/
// with porcupine's HTML view. The summary counts the completed operations of
// each part of a cycle.
func TestRobustnessRandomized(t *testing.T) {
	if testing.Short() {
		t.Skip("randomized fault run; skipped with -short")
	}
	seed := *robustnessSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	duration := *robustnessDuration
	t.Logf("seed %d (rerun with -robustness.seed=%d), faults for %v", seed, seed, duration)
	started := time.Now()

	resources := []string{"res-0", "res-1", "res-2", "res-3"}
	e := newEnv(t, envOptions{dedicated: true, resources: resources})
	const workers = 4
	proxies := make([]*faultproxy.Proxy, workers)
	remotes := make([]*remote, workers)
	for i := range workers {
		proxies[i] = e.proxy()
		remotes[i] = e.startRemote(i, e.url(proxies[i]))
	}

	run := &randomRun{e: e, proxies: proxies, remotes: remotes, resources: resources, faults: map[string]int{}, holding: map[int]bool{},
		written: map[string]int64{}}
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run.cycles(ctx, i, rand.New(rand.NewPCG(seed, uint64(i)+1)))
		}()
	}
	run.inject(ctx, rand.New(rand.NewPCG(seed, 0)))

	// Heal everything, let the workers finish what they have in flight.
	for i := range workers {
		proxies[i].Heal()
		_ = remotes[i].w.Cont()
	}
	wg.Wait()
	for i := range workers {
		if err := remotes[i].w.Close(); err != nil {
			t.Logf("worker %d exit: %v", i, err)
		}
	}

	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	e.admin().Reset()
	if err := e.waitQuiet(rctx, "pf-"); err != nil {
		t.Fatal(err)
	}
	truth, err := e.truth(rctx)
	if err != nil {
		t.Fatalf("read ground truth: %v", err)
	}
	ops := e.rec.Ops()
	rep := Check(ops, truth, 2*time.Minute)
	sum := Summary{
		Seed:       int64(seed),
		Duration:   time.Since(started),
		Scenarios:  []string{"lease → fenced writes → renewal → idempotent effect → release cycles", fmt.Sprintf("%d worker processes", workers), fmt.Sprintf("%d resources", len(resources))},
		Faults:     run.faultCounts(),
		Ops:        len(ops),
		ByOutcome:  map[Outcome]int{},
		Accepted:   len(truth.Writes),
		Grants:     len(truth.Grants),
		Parts:      parts(ops, truth),
		Result:     rep.Linearizable,
		Violations: rep.Violations,
	}
	for _, op := range ops {
		sum.ByOutcome[op.Outcome]++
	}
	for _, rs := range truth.Effects {
		sum.Effects += len(rs)
	}
	fmt.Print(sum.String())
	if !rep.OK() {
		name := fmt.Sprintf("failed-robustness-seed-%d", seed)
		path, err := Save("testdata", name+".json", Record{Seed: int64(seed), Note: "TestRobustnessRandomized", Ops: ops, Truth: truth, Violations: rep.Violations})
		if f, ferr := os.Create(filepath.Join("testdata", name+".html")); ferr == nil {
			_ = rep.Visualize(f)
			_ = f.Close()
		}
		t.Fatalf("%d violations; history saved to %s (%v)", len(rep.Violations), path, err)
	}
	if rep.Ops < 50 {
		t.Fatalf("only %d operations ran: the run proved little", rep.Ops)
	}
	for _, p := range sum.Parts {
		if p.Count == 0 {
			t.Errorf("no %s: the run did not exercise every part", p.Name)
		}
	}
}

// parts counts the completed operations of each part of a cycle, as the
// driver saw them; a takeover is a grant the database recorded as replacing
// a grant that had expired unreleased.
func parts(ops []Op, truth Truth) []Part {
	takeover := map[grant]bool{}
	for _, g := range truth.Grants {
		takeover[grant{g.Key, g.Token}] = g.Event == "taken_over"
	}
	var grants, takeovers, refused, accepted, stale, effects, resolved, releases int
	for _, op := range ops {
		if op.Resolved != "" && op.Outcome != Unknown {
			resolved++
		}
		switch {
		case op.Kind == Acquire && op.Outcome == OK:
			grants++
			if takeover[grant{op.Key, op.Token}] {
				takeovers++
			}
		case op.Kind == Renew && op.Outcome == Rejected:
			refused++
		case op.Kind == Write && op.Outcome == OK:
			accepted++
		case op.Kind == Write && op.Outcome == Stale:
			stale++
		case op.Kind == Effect && op.Outcome == OK && op.Result == op.Value:
			effects++
		case op.Kind == Release && op.Outcome == OK:
			releases++
		}
	}
	return []Part{
		{"lease grants", grants},
		{"takeovers of an expired lease", takeovers},
		{"renewals refused by the database", refused},
		{"fenced writes accepted", accepted},
		{"fenced writes refused as stale", stale},
		{"idempotent effects executed", effects},
		{"unknown outcomes resolved", resolved},
		{"releases", releases},
	}
}

// grant names one grant of a lease.
type grant struct {
	key   string
	token int64
}

// randomRun is the state of one randomized run.
type randomRun struct {
	e         *env
	proxies   []*faultproxy.Proxy
	remotes   []*remote
	resources []string

	mu      sync.Mutex
	faults  map[string]int
	seq     int
	holding map[int]bool     // workers between a granted acquire and their release
	written map[string]int64 // highest token of an acknowledged write per resource
	// intents counts the intents made so far; recent are the newest.
	intents int
	recent  []string
}

func (r *randomRun) setHolding(i int, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holding[i] = on
}

// victim picks a worker to pause: one that holds a lease now if any (its
// pause then outlives the lease with writes still to do), else any.
func (r *randomRun) victim(rng *rand.Rand) *remote {
	r.mu.Lock()
	var holders []int
	for i := range r.remotes {
		if r.holding[i] {
			holders = append(holders, i)
		}
	}
	r.mu.Unlock()
	if len(holders) == 0 {
		return r.remotes[rng.IntN(len(r.remotes))]
	}
	return r.remotes[holders[rng.IntN(len(holders))]]
}

func (r *randomRun) count(fault string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults[fault]++
}

func (r *randomRun) faultCounts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.faults))
	for k, v := range r.faults {
		out[k] = v
	}
	return out
}

func (r *randomRun) next() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	return r.seq
}

// Timing of a cycle. The lease TTL is short so that pauses and partitions
// outlast it; the driver waits longer than the worker's own timeout plus its
// read-back of an unknown outcome, so an unanswered call means the worker
// was stopped or cut off.
const (
	cycleTTL   = time.Second
	cycleWait  = 250 * time.Millisecond
	opTimeout  = 2 * time.Second
	driverWait = 4 * time.Second
)

// The mix of a cycle: one holder in pauseOneIn is paused past its lease;
// one fenced write, effect or release in cutOneIn loses its request or its
// reply; one cycle in duplicateOneIn repeats one of the last recentIntents
// intents instead of starting a new one.
const (
	pauseOneIn     = 2
	cutOneIn       = 4
	duplicateOneIn = 4
	recentIntents  = 8
)

// A cut is a message of a cycle whose request or reply may be lost.
type cut struct {
	name  string
	match func(faultproxy.Message) bool
}

var (
	commitCut  = &cut{"commit", faultproxy.IsCommit}
	releaseCut = &cut{"release", faultproxy.SQLContains("pgfence.release(")}
)

// cycles runs lease cycles for worker i until ctx ends.
func (r *randomRun) cycles(ctx context.Context, i int, rng *rand.Rand) {
	w := r.remotes[i]
	var paused []grant // grants of holders paused past their lease, with a write still on its way
	for ctx.Err() == nil {
		// A paused holder's write that arrives after the next holder's
		// is stale.
		waiting := paused[:0]
		for _, g := range paused {
			if !r.overwritten(g.key, g.token) {
				waiting = append(waiting, g)
				continue
			}
			r.do(i, rng, "write", opArgs{Key: g.key, Token: g.token, Value: fmt.Sprintf("w%d-%d", i, r.next()), Resolve: true, Timeout: opTimeout}, commitCut)
		}
		paused = waiting

		key := r.resources[rng.IntN(len(r.resources))]
		acq := w.do("acquire", opArgs{Key: key, TTL: cycleTTL, Wait: cycleWait, Timeout: opTimeout}, driverWait)
		if acq.Outcome != OK {
			time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
			continue
		}
		r.setHolding(i, true)
		for range 1 + rng.IntN(2) {
			args := opArgs{Key: key, Token: acq.Token, Value: fmt.Sprintf("w%d-%d", i, r.next()), Timeout: opTimeout}
			if rng.IntN(4) == 0 {
				r.do(i, rng, "write_leased", args, nil)
			} else {
				args.Resolve = true
				r.do(i, rng, "write", args, commitCut)
			}
		}
		// A holder paused past its lease without noticing: its renewal is
		// refused, and it releases nothing, so the next holder takes over.
		pause := rng.IntN(pauseOneIn) == 0 && r.expire(key, acq.Token)
		r.do(i, rng, "renew", opArgs{Key: key, Timeout: opTimeout}, nil)
		r.do(i, rng, "effect", opArgs{Key: r.intent(rng), Value: fmt.Sprintf("e%d-%d", i, r.next()), Resolve: true, Timeout: opTimeout}, commitCut)
		if pause {
			paused = append(paused, grant{key, acq.Token})
		} else {
			r.do(i, rng, "release", opArgs{Key: key, Timeout: opTimeout}, releaseCut)
		}
		r.setHolding(i, false)
	}
}

// do runs cmd on worker i and records it. With c, one time in cutOneIn it
// first arms a one-shot cut of the worker's next message that c matches,
// before the message reaches the server (a lost request) or after the
// server has answered it (a lost reply).
func (r *randomRun) do(i int, rng *rand.Rand, cmd string, args opArgs, c *cut) Op {
	var (
		trig  *faultproxy.Trigger
		fault string
	)
	if c != nil && rng.IntN(cutOneIn) == 0 {
		if rng.IntN(2) == 0 {
			trig, fault = r.proxies[i].CutBefore(c.match), "lost-"+c.name+"-request"
		} else {
			trig, fault = r.proxies[i].CutAfter(c.match), "lost-"+c.name+"-reply"
		}
	}
	op := r.remotes[i].do(cmd, args, driverWait)
	if trig != nil {
		trig.Cancel()
		if trig.Fired() {
			r.count(fault)
		}
	}
	if op.Kind == Write && op.Outcome == OK {
		r.wrote(op.Key, op.Token)
	}
	return op
}

// expire ends the grant of key with token by the database clock, as if its
// holder had been paused past its TTL without noticing (a frozen VM whose
// clock stood still too): the lease row is backdated, the holder is not
// told. It reports whether the grant was still current.
func (r *randomRun) expire(key string, token int64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	tag, err := r.e.admin().Exec(ctx, backdateSQL+` AND token = $2 AND released_at IS NULL`, key, token)
	if err != nil || tag.RowsAffected() != 1 {
		return false
	}
	r.count("pause-unnoticed")
	return true
}

// wrote notes an acknowledged write with token on key.
func (r *randomRun) wrote(key string, token int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.written[key] = max(r.written[key], token)
}

// overwritten reports whether a write with a token above token was
// acknowledged on key.
func (r *randomRun) overwritten(key string, token int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.written[key] > token
}

// intent picks a cycle's business intent: a new one, or one time in
// duplicateOneIn one of the newest (a duplicate request, perhaps while the
// first is still in flight).
func (r *randomRun) intent(rng *rand.Rand) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recent) > 0 && rng.IntN(duplicateOneIn) == 0 {
		return r.recent[rng.IntN(len(r.recent))]
	}
	r.intents++
	intent := fmt.Sprintf("intent-%d", r.intents)
	r.recent = append(r.recent, intent)
	if len(r.recent) > recentIntents {
		r.recent = r.recent[1:]
	}
	return intent
}

// inject injects one random fault at a time until ctx ends; the lost
// requests and replies are the cycles' own.
func (r *randomRun) inject(ctx context.Context, rng *rand.Rand) {
	sleep := func(min, max time.Duration) {
		d := min + time.Duration(rng.Int64N(int64(max-min)))
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	kinds := []struct {
		name   string
		weight int
		run    func()
	}{
		{"cut-connections", 3, func() {
			r.proxies[rng.IntN(len(r.proxies))].CutAll()
		}},
		{"delay", 2, func() {
			p := r.proxies[rng.IntN(len(r.proxies))]
			dir := faultproxy.Direction(rng.IntN(2))
			p.SetDelay(dir, time.Duration(50+rng.IntN(400))*time.Millisecond)
			sleep(300*time.Millisecond, 1500*time.Millisecond)
			p.SetDelay(dir, 0)
		}},
		{"partition", 2, func() {
			p := r.proxies[rng.IntN(len(r.proxies))]
			p.SetBlackhole(faultproxy.ClientToServer, true)
			p.SetBlackhole(faultproxy.ServerToClient, true)
			sleep(300*time.Millisecond, 2*time.Second)
			p.SetBlackhole(faultproxy.ClientToServer, false)
			p.SetBlackhole(faultproxy.ServerToClient, false)
			p.CutAll() // the swallowed bytes left the streams unusable
		}},
		{"sigstop-past-lease", 5, func() {
			w := r.victim(rng).w
			if w.Stop() != nil {
				return
			}
			sleep(6*cycleTTL/5, 5*cycleTTL/2)
			_ = w.Cont()
		}},
		{"restart-fast", 1, func() { r.restart(false) }},
		{"restart-crash", 1, func() { r.restart(true) }},
	}
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	for ctx.Err() == nil {
		sleep(50*time.Millisecond, 300*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
		n := rng.IntN(total)
		for _, k := range kinds {
			if n < k.weight {
				r.count(k.name)
				k.run()
				break
			}
			n -= k.weight
		}
	}
}

// restart restarts the server: a fast shutdown, or a crash.
func (r *randomRun) restart(crash bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := restart(ctx, r.e.cluster, crash); err != nil {
		r.e.t.Errorf("restart (crash %v): %v", crash, err)
	}
	r.e.admin().Reset()
}

// restart restarts cluster's server: a fast shutdown, or a crash (SIGKILL,
// then crash recovery).
func restart(ctx context.Context, cluster *pgfencetest.Cluster, crash bool) error {
	if !crash {
		return cluster.Restart(ctx)
	}
	if err := cluster.Kill(); err != nil {
		return err
	}
	return cluster.Start(ctx)
}

// The harness end to end, on a system with a known bug: an old holder writes
// through a path that bypasses the fence (the table is left unprotected, the
// write carries no fence call) after a new holder took over. The client is
// told the write succeeded; reconciliation against the database must say
// that accepted tokens went backwards and the final state is not the highest
// token's write.
func TestRobustnessCatchesAnUnfencedWriter(t *testing.T) {
	e := newEnv(t, envOptions{resources: []string{sku}})
	ctx := bounded(t, time.Minute)
	if _, err := pgfence.Unprotect(ctx, e.admin(), pgx.Identifier{"stock"}); err != nil {
		t.Fatal(err)
	}
	a, b := e.local(0, nil), e.local(1, nil)
	t1 := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)
	want(t, e.recorded(0, func() Op { return a.write(ctx, sku, t1.Token, "a1") }), OK)
	e.backdate(sku)
	t2 := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)
	want(t, e.recorded(1, func() Op { return b.write(ctx, sku, t2.Token, "b1") }), OK)
	want(t, e.recorded(0, func() Op { // the bug: no fence
		op := Op{Kind: Write, Key: sku, Token: t1.Token, Value: "a-unfenced", Outcome: OK}
		if _, err := a.pool.Exec(ctx, writeSQL, sku, op.Value, t1.Token); err != nil {
			op.Outcome, op.Err = Failed, err.Error()
		}
		return op
	}), OK)

	if err := e.waitQuiet(ctx, "pf-"); err != nil {
		t.Fatal(err)
	}
	truth, err := e.truth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep := Check(e.rec.Ops(), truth, 10*time.Second)
	if rep.OK() {
		t.Fatal("the checker passed a history in which a stale holder's unfenced write landed")
	}
	joined := strings.Join(rep.Violations, "\n")
	for _, want := range []string{"accepted tokens decreased", "not the highest accepted token", "not linearizable"} {
		if !strings.Contains(joined, want) {
			t.Errorf("violations do not mention %q:\n%s", want, joined)
		}
	}
}
