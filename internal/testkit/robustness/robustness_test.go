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
// few worker processes run lease → fenced writes → idempotent effect →
// release cycles on a few resources, each through its own fault proxy, while
// faults are injected at random (seeded): connection cuts, delays, network
// partitions, COMMITs whose request or reply is lost, SIGSTOP past the lease,
// and fast and crash database restarts. Every operation is recorded with
// monotonic call and return times and the outcome the driver saw (unknown when
// it could not know). Afterwards the ground truth is read back and the history
// is checked (Check: invariants + porcupine). A failing history is saved under
// testdata/ with porcupine's HTML view.
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

	resources := []string{"res-0", "res-1"}
	e := newEnv(t, envOptions{dedicated: true, resources: resources})
	const workers = 4
	proxies := make([]*faultproxy.Proxy, workers)
	remotes := make([]*remote, workers)
	for i := range workers {
		proxies[i] = e.proxy()
		remotes[i] = e.startRemote(i, e.url(proxies[i]))
	}

	run := &randomRun{e: e, proxies: proxies, remotes: remotes, resources: resources, faults: map[string]int{}, holding: map[int]bool{}}
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
		Scenarios:  []string{"lease → fenced writes → idempotent effect → release cycles", fmt.Sprintf("%d worker processes", workers), fmt.Sprintf("%d resources", len(resources))},
		Faults:     run.faultCounts(),
		Ops:        len(ops),
		ByOutcome:  map[Outcome]int{},
		Accepted:   len(truth.Writes),
		Grants:     len(truth.Grants),
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
	holding map[int]bool // workers between a granted acquire and their release
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
// outlast it; the driver waits longer than the worker's own timeout, so an
// unanswered call means the worker was stopped or cut off.
const (
	cycleTTL     = time.Second
	cycleWait    = 500 * time.Millisecond
	opTimeout    = 2 * time.Second
	driverWait   = 4 * time.Second
	intentsCount = 40
)

// cycles runs lease cycles for worker i until ctx ends.
func (r *randomRun) cycles(ctx context.Context, i int, rng *rand.Rand) {
	w := r.remotes[i]
	for ctx.Err() == nil {
		key := r.resources[rng.IntN(len(r.resources))]
		acq := w.do("acquire", opArgs{Key: key, TTL: cycleTTL, Wait: cycleWait, Timeout: opTimeout}, driverWait)
		if acq.Outcome != OK {
			time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
			continue
		}
		r.setHolding(i, true)
		for range 1 + rng.IntN(3) {
			value := fmt.Sprintf("w%d-%d", i, r.next())
			if rng.IntN(4) == 0 {
				w.do("write_leased", opArgs{Key: key, Token: acq.Token, Value: value, Timeout: opTimeout}, driverWait)
			} else {
				w.do("write", opArgs{Key: key, Token: acq.Token, Value: value, Timeout: opTimeout}, driverWait)
			}
		}
		intent := fmt.Sprintf("intent-%d", rng.IntN(intentsCount))
		w.do("effect", opArgs{Key: intent, Value: fmt.Sprintf("e%d-%d", i, r.next()), Timeout: opTimeout}, driverWait)
		w.do("release", opArgs{Key: key, Timeout: opTimeout}, driverWait)
		r.setHolding(i, false)
	}
}

// inject injects one random fault at a time until ctx ends.
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
		{"lost-commit-reply", 2, func() {
			trig := r.proxies[rng.IntN(len(r.proxies))].CutAfter(faultproxy.IsCommit)
			sleep(500*time.Millisecond, 1500*time.Millisecond)
			trig.Cancel()
		}},
		{"lost-commit-request", 1, func() {
			trig := r.proxies[rng.IntN(len(r.proxies))].CutBefore(faultproxy.IsCommit)
			sleep(500*time.Millisecond, 1500*time.Millisecond)
			trig.Cancel()
		}},
		{"lost-release-reply", 1, func() {
			trig := r.proxies[rng.IntN(len(r.proxies))].CutAfter(faultproxy.SQLContains("pgfence.release("))
			sleep(500*time.Millisecond, 1500*time.Millisecond)
			trig.Cancel()
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
