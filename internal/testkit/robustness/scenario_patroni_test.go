package robustness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/patroni"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence"
)

var patroniRounds = flag.Int("patroni.rounds", 1,
	"how many times TestScenarioPatroni runs its cycle of faults (kill -9, SIGSTOP past the TTL, switchover) on each cluster; "+
		"CI runs 1, the long run e.g. -patroni.rounds=5 -timeout=60m")

var patroniDCS = flag.String("patroni.dcs", "",
	"the etcd API Patroni uses in TestScenarioPatroni: etcd3 or etcd (v2); default: the harness's choice for the installed Patroni")

// haResources are the fenced resources (and lease keys) of the Patroni
// scenarios.
var haResources = []string{"ha/a", "ha/b"}

// stragglerKey is the lease and resource of the client that acts on an
// old primary as it resumes; no other client uses it, so its grant there
// is not refused for being held.
const stragglerKey = "ha/straggler"

// haActors is the number of clients writing through the failovers.
const haActors = 3

// TestScenarioPatroni runs pgfence clients against a Patroni cluster (an
// etcd member, a primary and a replica) through the faults an HA manager
// handles, with synchronous_mode off and on. The clients connect with a
// multi-host URL (target_session_attrs=read-write) and keep acquiring
// leases, writing with their tokens and releasing, from before each fault
// until after it:
//
//   - kill -9 of the primary's postmaster (Patroni fails over at once:
//     primary_start_timeout 0);
//   - SIGSTOP of the whole primary node (Patroni and PostgreSQL, as a
//     paused VM) past Patroni's TTL, then SIGCONT: the replica is promoted
//     meanwhile, and the old primary wakes up still believing it leads;
//   - a switchover through Patroni's REST API.
//
// After each fault: a new primary on a higher timeline, every client
// working again through its own pool (no restart), and the old primary back
// as a replica of the new timeline (pg_rewind), which refuses every grant
// (PF005). After the run the history is checked against the database (see
// [Check]): no token was granted twice, accepted tokens never went down,
// and every acknowledged fenced write is in the database, except, without
// synchronous_mode, the writes in the documented loss window: acknowledged
// by the old primary on its old timeline after the last WAL position the
// new primary had received (the new timeline's switch point), which are
// recorded as unknown. Which writes those were is decided by the WAL
// position read on the writer's own connection right after its commit.
func TestScenarioPatroni(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(map[bool]string{false: "async", true: "synchronous_mode"}[sync], func(t *testing.T) {
			h := newHAEnv(t, sync)
			ctx := bounded(t, time.Duration(*patroniRounds)*8*time.Minute)
			actors := make([]*actor, haActors)
			for i := range actors {
				a, err := newActor(ctx, actorConfig{URL: h.url, App: fmt.Sprintf("pf-ha-%d", i), MaxConns: 2})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(a.close)
				actors[i] = a
			}
			w := h.start(ctx, actors)
			defer w.stop()
			h.waitProgress(ctx, w, "before the first fault")
			for round := range *patroniRounds {
				h.fault(ctx, w, round, "kill -9 of the primary's postmaster", true, func(old *patroni.Node) {
					pid, err := old.KillPostmaster()
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("killed %s's postmaster %d", old.Name, pid)
				}, nil)
				var straggler *actor
				h.fault(ctx, w, round, "SIGSTOP of the primary node past the TTL", false, func(old *patroni.Node) {
					// A client connected to this node alone, with its
					// connection open across the freeze: it acts the moment
					// the node resumes, before Patroni demotes it.
					straggler = h.straggler(ctx, old)
					if err := old.Freeze(); err != nil {
						t.Fatal(err)
					}
				}, func(old *patroni.Node) {
					if err := old.Thaw(); err != nil {
						t.Fatal(err)
					}
					h.splitBrainWindow(ctx, straggler)
				})
				h.fault(ctx, w, round, "switchover", false, func(old *patroni.Node) {
					if err := h.cluster.Switchover(ctx, old, h.other(old)); err != nil {
						t.Fatal(err)
					}
				}, nil)
			}
			w.stop()
			h.renewAdmin(ctx)
			h.settle(ctx)
			tr, rep := h.reconcile(ctx)
			if !rep.OK() {
				return
			}
			for _, r := range haResources {
				t.Logf("%s: final token %d (timeline %d), %d accepted writes", r, tr.Final[r].Token, tr.Final[r].Token>>40, countWrites(tr, r))
			}
		})
	}
}

// haEnv is one Patroni cluster with the business schema, the history of
// its clients, and what the test learns about each timeline's end.
type haEnv struct {
	*env
	cluster *patroni.Cluster
	sync    bool
	url     string // multi-host URL of the database

	mu sync.Mutex
	// acks are the acknowledged fenced writes, with the WAL position of
	// their commit as seen from the writer's connection.
	acks []ackedWrite
	// switchpoints maps each timeline that a failover ended to the WAL
	// position where the next timeline branched off it.
	switchpoints map[int64]uint64
	// lostWindow is what the loss-window rule matched, by timeline.
	lostWindow map[int64]int
}

// ackedWrite is a fenced write its client was told had committed.
type ackedWrite struct {
	value    string
	timeline int64
	// before: the WAL insert position inside the transaction, before the
	// commit record. after: right after the commit, on the same connection
	// (0: that query failed, so the commit's position is not bounded).
	before, after uint64
}

func newHAEnv(t *testing.T, sync bool) *haEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := patroni.Start(ctx, &patroni.Config{SynchronousMode: sync, DCS: *patroniDCS, Progress: func(msg string) { t.Log(msg) }})
	if err != nil {
		if errors.Is(err, patroni.ErrNotInstalled) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	admin, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, `CREATE DATABASE pgfence_ha`)
	_ = admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := &haEnv{cluster: c, sync: sync, url: c.ConnString("pgfence_ha"), switchpoints: map[int64]uint64{}, lostWindow: map[int64]int{}}
	cfg, err := pgxpool.ParseConfig(h.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "harness"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := migrations.Up(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, businessSchema); err != nil {
		t.Fatal(err)
	}
	for _, r := range append([]string{stragglerKey}, haResources...) {
		if _, err := pool.Exec(ctx, `INSERT INTO stock (resource) VALUES ($1)`, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"stock"}, "resource", ""); err != nil {
		t.Fatal(err)
	}
	h.env = &env{t: t, rec: NewRecorder(), promoted: pool}
	t.Cleanup(h.checkNoConnections)
	return h
}

// workload is the clients' loop: each acquires a resource's lease, writes
// it with the token and releases it, over and over, recording every
// operation.
type workload struct {
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	progress []atomic.Int64 // complete cycles (acquire, write, release) per client
	once     sync.Once
}

func (w *workload) stop() { w.once.Do(func() { w.cancel(); w.wg.Wait() }) }

// haOpTimeout bounds every operation: longer than a connection attempt on a
// frozen node (connect_timeout 2 s) plus one on the next node.
const haOpTimeout = 5 * time.Second

func (h *haEnv) start(ctx context.Context, actors []*actor) *workload {
	ctx, cancel := context.WithCancel(ctx)
	w := &workload{cancel: cancel, progress: make([]atomic.Int64, len(actors))}
	for i, a := range actors {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				key := haResources[(i+n)%len(haResources)]
				op := func(fn func(ctx context.Context) Op) Op {
					octx, ocancel := context.WithTimeout(ctx, haOpTimeout)
					defer ocancel()
					return h.recorded(i, func() Op { return fn(octx) })
				}
				acq := op(func(ctx context.Context) Op { return a.acquire(ctx, key, 3*time.Second, time.Second) })
				if acq.Outcome != OK {
					pause(ctx, 50*time.Millisecond)
					continue
				}
				wr := op(func(ctx context.Context) Op { return h.write(ctx, a, key, acq.Token, fmt.Sprintf("c%d-%d", i, n)) })
				rel := op(func(ctx context.Context) Op { return a.release(ctx, key) })
				if wr.Outcome == OK && rel.Outcome == OK {
					w.progress[i].Add(1)
				}
				pause(ctx, 10*time.Millisecond)
			}
		}()
	}
	return w
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// sqlWALPosition is the server's timeline and WAL insert position.
const sqlWALPosition = `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint,
       (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint`

// write is actor.write on one connection of a's pool, which also reads
// the WAL position before the commit (in the transaction) and after it.
func (h *haEnv) write(ctx context.Context, a *actor, key string, token int64, value string) Op {
	op := Op{Kind: Write, Key: key, Token: token, Value: value}
	conn, err := a.pool.Acquire(ctx)
	if err != nil {
		op.Outcome, op.Err = classify(err), err.Error()
		return op
	}
	defer conn.Release()
	var ack ackedWrite
	_, err = pgfence.Write(ctx, conn.Conn(), pgfence.LeaseOf(key, "", token), func(ctx context.Context, tx pgx.Tx) error {
		var before int64
		if err := tx.QueryRow(ctx, sqlWALPosition).Scan(&ack.timeline, &before); err != nil {
			return err
		}
		ack.before = uint64(before)
		tag, err := tx.Exec(ctx, writeSQL, key, value, token)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("resource %q: %d rows updated", key, tag.RowsAffected())
		}
		return err
	})
	if err != nil {
		op.Outcome, op.Err = classify(err), err.Error()
		return op
	}
	op.Outcome = OK
	var tl, after int64
	if err := conn.QueryRow(ctx, sqlWALPosition).Scan(&tl, &after); err == nil && tl == ack.timeline {
		ack.after = uint64(after)
	}
	ack.value = value
	h.mu.Lock()
	h.acks = append(h.acks, ack)
	h.mu.Unlock()
	return op
}

// waitProgress waits until every client has completed two more cycles.
func (h *haEnv) waitProgress(ctx context.Context, w *workload, when string) {
	h.t.Helper()
	want := make([]int64, len(w.progress))
	for i := range w.progress {
		want[i] = w.progress[i].Load() + 2
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		behind := []string{}
		for i := range w.progress {
			if got := w.progress[i].Load(); got < want[i] {
				behind = append(behind, fmt.Sprintf("client %d at %d of %d", i, got, want[i]))
			}
		}
		if len(behind) == 0 {
			return
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			h.t.Fatalf("%s: clients did not resume (%s); last operations:\n  %s\n%s", when, strings.Join(behind, ", "), lastOps(h.rec.Ops(), 12), h.cluster.Logs(8))
		}
		pause(ctx, 50*time.Millisecond)
	}
}

func lastOps(ops []Op, n int) string {
	if len(ops) > n {
		ops = ops[len(ops)-n:]
	}
	s := make([]string, len(ops))
	for i, op := range ops {
		s[i] = fmt.Sprintf("%s → %s %s", op, op.Outcome, op.Err)
	}
	return strings.Join(s, "\n  ")
}

// other returns the node that is not n (the cluster has two).
func (h *haEnv) other(n *patroni.Node) *patroni.Node {
	for _, m := range h.cluster.Nodes() {
		if m != n {
			return m
		}
	}
	return nil
}

// fault applies inject to the current primary while the clients run, waits
// for a new primary on a higher timeline, for every client to resume, then
// applies recover (if any) to the old primary and waits until it is back as
// a replica of the new timeline that refuses grants.
func (h *haEnv) fault(ctx context.Context, w *workload, round int, what string, inPlace bool, inject, recover func(old *patroni.Node)) {
	t := h.t
	t.Helper()
	old, before, err := h.cluster.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Patroni fails over only to a replica within maximum_lag_on_failover
	// (1 MB) of the leader; one further behind (the schema just created, a
	// checkpoint, a loaded machine) makes it restart a crashed primary in
	// place instead, and the round would wait for a failover in vain.
	if _, err := h.cluster.WaitFor(ctx, "every replica within 256 kB of the leader", func(ms []patroni.Member) bool {
		for _, m := range ms {
			if m.Role != patroni.RoleLeader && (m.Lag == nil || *m.Lag > 256<<10) {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("round %d: %s on %s (timeline %d)", round+1, what, old.Name, before.Timeline)
	start := time.Now()
	inject(old)
	// With inPlace, Patroni may also restart the old primary where it is,
	// when its agent still holds the leader key: it comes back in recovery
	// and is promoted to a higher timeline, which is a timeline change for
	// the clients as well.
	ms, err := h.cluster.WaitFor(ctx, "a node leads on a higher timeline", func(ms []patroni.Member) bool {
		for _, m := range ms {
			if m.Role == patroni.RoleLeader && m.State == "running" && (inPlace || m.Name != old.Name) && m.Timeline > before.Timeline {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	var leader patroni.Member
	for _, m := range ms {
		if m.Role == patroni.RoleLeader {
			leader = m
		}
	}
	t.Logf("round %d: %s leads on timeline %d %s after the %s", round+1, leader.Name, leader.Timeline, time.Since(start).Round(100*time.Millisecond), what)
	h.readSwitchpoints(ctx, leader.Timeline)
	h.waitProgress(ctx, w, what+": after the failover")
	t.Logf("round %d: every client resumed %s after the %s", round+1, time.Since(start).Round(100*time.Millisecond), what)
	if recover != nil {
		recover(old)
	}
	if _, err := h.cluster.WaitHealthy(ctx, h.sync); err != nil {
		t.Fatal(err)
	}
	ms, err = h.cluster.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if leader.Name == old.Name {
		t.Logf("round %d: %s was restarted in place and leads on timeline %d", round+1, old.Name, leader.Timeline)
		return
	}
	for _, m := range ms {
		if m.Name == old.Name && (m.Role == patroni.RoleLeader || m.Timeline != leader.Timeline) {
			t.Fatalf("the old primary %s rejoined as %v, want a replica on timeline %d", old.Name, m, leader.Timeline)
		}
	}
	t.Logf("round %d: %s rejoined as a replica on timeline %d %s after the %s", round+1, old.Name, leader.Timeline, time.Since(start).Round(100*time.Millisecond), what)
	h.refusesGrants(ctx, old)
	h.waitProgress(ctx, w, what+": after the old primary rejoined")
}

// straggler returns a client connected to node n alone, its one connection
// open.
func (h *haEnv) straggler(ctx context.Context, n *patroni.Node) *actor {
	h.t.Helper()
	a, err := newActor(ctx, actorConfig{URL: n.ConnString("pgfence_ha"), App: "pf-ha-straggler", MaxConns: 1})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(a.close)
	if _, err := a.pool.Exec(ctx, `SELECT 1`); err != nil {
		h.t.Fatal(err)
	}
	return a
}

// splitBrainWindow has the straggler, on the old primary that just
// resumed, acquire a lease and write with its token at once. Until Patroni
// demotes it (it finds another node holds the leader key), the old primary
// is a writable primary on its old timeline. Without synchronous_mode what
// it acknowledges there is in the loss window (and the grant's token, of
// the old timeline, is below every token of the new one); with
// synchronous_mode its commits wait for a standby that no longer follows
// it, and end unknown when Patroni demotes it. The history checks both;
// this logs what happened.
func (h *haEnv) splitBrainWindow(ctx context.Context, a *actor) {
	h.t.Helper()
	client := haActors // its own client id in the history
	key := stragglerKey
	op := func(fn func(ctx context.Context) Op) Op {
		octx, cancel := context.WithTimeout(ctx, haOpTimeout)
		defer cancel()
		return h.recorded(client, func() Op { return fn(octx) })
	}
	acq := op(func(ctx context.Context) Op { return a.acquire(ctx, key, 3*time.Second, 0) })
	msg := fmt.Sprintf("on the old primary as it resumed: acquire %s", acq.Outcome)
	if acq.Outcome == OK {
		msg += fmt.Sprintf(" (token %d, timeline %d)", acq.Token, acq.Token>>40)
		wr := op(func(ctx context.Context) Op { return h.write(ctx, a, key, acq.Token, "straggler") })
		msg += fmt.Sprintf(", fenced write %s %s", wr.Outcome, wr.Err)
		op(func(ctx context.Context) Op { return a.release(ctx, key) })
	} else {
		msg += " " + acq.Err
	}
	h.t.Log(msg)
}

// refusesGrants checks that n, a replica now, grants nothing: a lease
// client connected to it alone gets ErrNotPrimary (PF005), never a token of
// its old timeline.
func (h *haEnv) refusesGrants(ctx context.Context, n *patroni.Node) {
	h.t.Helper()
	a, err := newActor(ctx, actorConfig{URL: n.ConnString("pgfence_ha"), App: "pf-ha-old-primary", MaxConns: 1})
	if err != nil {
		h.t.Fatal(err)
	}
	defer a.close()
	if l, err := a.leases.TryAcquire(ctx, haResources[0], time.Minute, nil); !errors.Is(err, pgfence.ErrNotPrimary) {
		h.t.Fatalf("a grant on the old primary %s after it rejoined: lease %v, error %v; want ErrNotPrimary", n.Name, l, err)
	}
}

// readSwitchpoints records where each earlier timeline ended, from the new
// primary's history file of timeline tl.
func (h *haEnv) readSwitchpoints(ctx context.Context, tl int64) {
	h.t.Helper()
	var history string
	err := h.onPrimary(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `SELECT pg_read_file('pg_wal/' || lpad(upper(to_hex($1::int)), 8, '0') || '.history')`, tl).Scan(&history)
	})
	if err != nil {
		h.t.Fatalf("read the history of timeline %d: %v", tl, err)
	}
	// Each line: parent timeline, switch point (X/Y), reason.
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, line := range strings.Split(history, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		parent, err1 := strconv.ParseInt(f[0], 10, 64)
		lsn, err2 := parseLSN(f[1])
		if err1 != nil || err2 != nil {
			h.t.Fatalf("history of timeline %d: cannot parse %q", tl, line)
		}
		h.switchpoints[parent] = lsn
	}
}

// onPrimary runs fn on a new connection to the current primary, trying
// again (for up to a minute) while a failover is under way: the harness's
// pool may still hold connections to a frozen node, where a statement
// would wait for as long as it stays frozen.
func (h *haEnv) onPrimary(ctx context.Context, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := func() error {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, h.url)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			return fn(ctx, conn)
		}()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		pause(ctx, 100*time.Millisecond)
	}
}

// renewAdmin replaces the harness's pool with a new one on the current
// primary, for the reads of the ground truth.
func (h *haEnv) renewAdmin(ctx context.Context) {
	h.t.Helper()
	cfg, err := pgxpool.ParseConfig(h.url)
	if err != nil {
		h.t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "harness"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(pool.Close)
	h.promoted.Close()
	h.promoted = pool
}

// parseLSN reads a WAL position written as X/Y.
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("not an LSN: %q", s)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("not an LSN: %q", s)
	}
	return h<<32 | l, nil
}

// settle applies the loss window before the history is checked. Without
// synchronous_mode, a write acknowledged on a timeline that a failover
// ended may be lost when its commit is past the switch point, the last WAL
// position the new primary had: it is recorded as unknown (its commit is
// bounded by the position read after it; an unbounded one counts as past).
// A write whose transaction began past the switch point cannot be on the
// new timeline at all. With synchronous_mode nothing is excused: every
// acknowledged write must be there.
func (h *haEnv) settle(ctx context.Context) {
	h.t.Helper()
	tr, err := h.truth(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	present := map[string]bool{}
	for _, w := range tr.Writes {
		present[w.Value] = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	window := map[string]bool{}
	for _, a := range h.acks {
		sp, ended := h.switchpoints[a.timeline]
		if !ended {
			continue
		}
		if a.before >= sp && present[a.value] {
			h.t.Errorf("write %s began at %X on timeline %d, past its switch point %X, and yet is on the new timeline", a.value, a.before, a.timeline, sp)
		}
		if a.after == 0 || a.after > sp {
			window[a.value] = true
			h.lostWindow[a.timeline]++
		}
	}
	lost := 0
	for _, a := range h.acks {
		if !present[a.value] {
			lost++
		}
	}
	h.t.Logf("%d acknowledged writes, %d in a loss window (by timeline %v), %d of them not in the database", len(h.acks), len(window), h.lostWindow, lost)
	if !h.sync {
		h.rec.MarkUnknown(func(op Op) bool { return op.Kind == Write && op.Outcome == OK && window[op.Value] },
			"acknowledged by an old primary past the WAL position its successor branched at")
	}
}

func countWrites(tr Truth, key string) int {
	n := 0
	for _, w := range tr.Writes {
		if w.Key == key {
			n++
		}
	}
	return n
}
