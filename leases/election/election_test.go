package election_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/election"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// replica is an in-process participant of an election, run by Run.
type replica struct {
	name string
	e    *election.Election
	stop context.CancelFunc
	done chan error

	mu      sync.Mutex
	started []int64
	stopped map[int64]error
	seen    []election.Leader
}

func startReplica(t *testing.T, pool *pgxpool.Pool, key, name string, cfg election.Config) *replica {
	t.Helper()
	return startReplicaWith(t, newClient(t, pool, nil), key, name, cfg)
}

// startReplicaWith starts a replica on a client of the caller's.
func startReplicaWith(t *testing.T, client *leases.Client, key, name string, cfg election.Config) *replica {
	t.Helper()
	r := &replica{name: name, done: make(chan error, 1), stopped: map[int64]error{}}
	cfg.HolderInfo = name
	cfg.OnStartedLeading = func(ctx context.Context, term *election.Term) {
		r.mu.Lock()
		r.started = append(r.started, term.Token())
		r.mu.Unlock()
		<-ctx.Done()
	}
	cfg.OnStoppedLeading = func(term *election.Term, cause error) {
		r.mu.Lock()
		r.stopped[term.Token()] = cause
		r.mu.Unlock()
	}
	cfg.OnLeader = func(l election.Leader) {
		r.mu.Lock()
		r.seen = append(r.seen, l)
		r.mu.Unlock()
	}
	if cfg.Logger == nil && testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("replica", name)
	}
	e, err := election.New(client, key, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.e = e
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { r.done <- e.Run(ctx) }()
	t.Cleanup(func() { r.close(t) })
	return r
}

// close stops Run and waits for it: a stop asked for is no failure, and Run
// returns nil.
func (r *replica) close(t *testing.T) {
	r.stop()
	if err := <-r.done; err != nil {
		t.Errorf("%s: Run returned %v, want nil", r.name, err)
	}
	r.done <- nil // for a later close
}

// terms lists the terms r saw begin, in order.
func (r *replica) terms() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int64
	for _, l := range r.seen {
		if l.Term != 0 && (len(out) == 0 || out[len(out)-1] != l.Term) {
			out = append(out, l.Term)
		}
	}
	return out
}

func (r *replica) lastSeen() election.Leader {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) == 0 {
		return election.Leader{}
	}
	return r.seen[len(r.seen)-1]
}

func (r *replica) stopCause(term int64) (error, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	err, ok := r.stopped[term]
	return err, ok
}

// leaders returns the replicas that lead now.
func leaders(rs []*replica) []*replica {
	var out []*replica
	for _, r := range rs {
		if r.e.IsLeader() {
			out = append(out, r)
		}
	}
	return out
}

// oneLeader waits until exactly one replica leads, other than not, and
// every replica has seen its value.
func oneLeader(t *testing.T, rs []*replica, not *replica) *replica {
	t.Helper()
	var leader *replica
	eventually(t, 20*time.Second, "one leader, seen by all", func() bool {
		ls := leaders(rs)
		if len(ls) != 1 || ls[0] == not {
			return false
		}
		term := ls[0].e.Term().Token()
		for _, r := range rs {
			if seen := r.lastSeen(); seen.Term != term || seen.Value == "" {
				return false
			}
		}
		leader = ls[0]
		return true
	})
	return leader
}

// Three replicas: one leads, every replica sees it and what it publishes; a
// resignation hands over at once, and the one who resigned does not take
// it back; a replica whose Run ends resigns. Every replica sees the same
// terms in the same order.
func TestRunElectsOneLeaderAndHandsOver(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	cfg := election.Config{TTL: 5 * time.Second}
	var rs []*replica
	for _, name := range []string{"a", "b", "c"} {
		rs = append(rs, startReplica(t, pool, "leader", name, cfg))
	}

	first := oneLeader(t, rs, nil)
	term1 := first.e.Term()
	if seen := rs[0].lastSeen(); seen.Value != first.name || seen.Holder != term1.Holder() {
		t.Fatalf("seen %+v, want %s's term %d", seen, first.name, term1.Token())
	}
	if err := term1.Proclaim(ctx, first.name+" at 10.0.0.7:8080"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the proclaimed value seen by all", func() bool {
		for _, r := range rs {
			if r.lastSeen().Value != first.name+" at 10.0.0.7:8080" || r.lastSeen().Term != term1.Token() {
				return false
			}
		}
		return true
	})
	if l, err := rs[1].e.Leader(ctx); err != nil || l.Term != term1.Token() || l.Value != first.name+" at 10.0.0.7:8080" {
		t.Fatalf("Leader() = %+v, %v", l, err)
	}
	for _, r := range rs {
		if r != first && r.e.Term() != nil {
			t.Errorf("%s (a follower) has a term", r.name)
		}
	}

	// A resignation: another replica is elected long before the TTL (the
	// release is announced), not the one who resigned.
	start := time.Now()
	if err := first.e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if cause, ok := first.stopCause(term1.Token()); !ok || !errors.Is(cause, election.ErrResigned) {
		t.Fatalf("%s's term %d stopped: %v, %v; want ErrResigned", first.name, term1.Token(), cause, ok)
	}
	if !errors.Is(context.Cause(term1.Context()), election.ErrResigned) || term1.Err() == nil {
		t.Fatalf("the resigned term's context: %v", context.Cause(term1.Context()))
	}
	second := oneLeader(t, rs, first)
	t.Logf("handed over from %s to %s in %s", first.name, second.name, time.Since(start))
	if second.e.Term().Token() <= term1.Token() {
		t.Fatalf("term %d after term %d", second.e.Term().Token(), term1.Token())
	}

	// A replica whose Run ends resigns.
	term2 := second.e.Term()
	second.close(t)
	if cause, ok := second.stopCause(term2.Token()); !ok || !errors.Is(cause, election.ErrResigned) {
		t.Fatalf("%s's term stopped by the end of Run: %v, %v", second.name, cause, ok)
	}
	third := oneLeader(t, slices.DeleteFunc(slices.Clone(rs), func(r *replica) bool { return r == second }), second)
	third.close(t)
	// The only replica left takes over (after its hold-off, if it resigned).
	last := slices.DeleteFunc(slices.Clone(rs), func(r *replica) bool { return r == second || r == third })
	oneLeader(t, last, nil)

	// Every replica saw the terms of its lifetime, in the order granted.
	var all []int64
	for _, r := range rs {
		if ts := r.terms(); len(ts) > len(all) {
			all = ts
		}
	}
	for _, r := range rs {
		ts := r.terms()
		if len(ts) == 0 || !slices.Equal(ts, all[:len(ts)]) {
			t.Errorf("%s saw terms %v, the longest history is %v", r.name, ts, all)
		}
		if !slices.IsSorted(ts) {
			t.Errorf("%s saw terms out of order: %v", r.name, ts)
		}
	}
}

// A term fences the leader's writes: once a later term wrote, the database
// refuses the earlier term's writes, whatever its holder believes.
func TestTermFencesEarlierTerms(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := pool.Exec(ctx, `CREATE TABLE config (k text PRIMARY KEY, v text, term bigint)`); err != nil {
		t.Fatal(err)
	}
	write := func(term *election.Term, v string) error {
		_, err := pgfence.Exec(ctx, pool, term, `INSERT INTO config VALUES ('mode', $1, $2) ON CONFLICT (k) DO UPDATE SET v = $1, term = $2`, v, term.Token())
		return err
	}
	// run runs an election on a client of its own and returns its first term.
	run := func() (*election.Election, *election.Term) {
		t.Helper()
		terms := make(chan *election.Term, 4)
		e, err := election.New(newClient(t, pool, nil), "config-leader", &election.Config{TTL: 10 * time.Second,
			OnStartedLeading: func(ctx context.Context, term *election.Term) { terms <- term; <-ctx.Done() }})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- e.Run(rctx) }()
		t.Cleanup(func() { cancel(); <-done })
		select {
		case term := <-terms:
			return e, term
		case <-ctx.Done():
			t.Fatal("not elected")
		}
		return nil, nil
	}
	_, ta := run()
	if err := write(ta, "a"); err != nil {
		t.Fatal(err)
	}
	// a's lease runs out by the database clock (a is paused, say); b wins
	// while a still believes it leads.
	backdate(t, pool, "config-leader", 0)
	b, tb := run()
	if err := write(tb, "b"); err != nil {
		t.Fatal(err)
	}
	err := write(ta, "a, late")
	var stale *pgfence.StaleTokenError
	if !errors.As(err, &stale) || stale.Presented != ta.Token() || stale.Accepted != tb.Token() {
		t.Fatalf("the earlier term's write after the later term's: %v, want a stale token", err)
	}
	var v string
	if err := pool.QueryRow(ctx, `SELECT v FROM config`).Scan(&v); err != nil || v != "b" {
		t.Fatalf("config %q %v, want b's", v, err)
	}
	if !b.IsLeader() {
		t.Fatal("b does not lead")
	}
}

// A leader cut off from the database (no reply, no reset) stops leading
// while the database still holds its lease: nobody else can be elected yet.
// It says why, and a follower is elected once the lease expires.
func TestLeaderCutOffStopsBeforeExpiry(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	p := newProxy(t, serverAddr(t, db.URL))
	url, err := p.ConnString(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfgPool, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfgPool.ConnConfig.ConnectTimeout = 2 * time.Second
	cut, err := pgxpool.NewWithConfig(ctx, cfgPool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cut.Close)

	cfg := election.Config{TTL: 3 * time.Second}
	leader := startReplica(t, cut, "leader", "cut", cfg)
	eventually(t, 10*time.Second, "cut leads", leader.e.IsLeader)
	follower := startReplica(t, db.Pool, "leader", "follower", cfg)
	term := leader.e.Term()

	p.SetBlackhole(faultproxy.ClientToServer, true)
	p.SetBlackhole(faultproxy.ServerToClient, true)
	select {
	case <-term.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the cut-off leader still leads after 10 s")
	}
	var live bool
	if err := db.Pool.QueryRow(ctx, `SELECT live FROM pgfence.lease_status WHERE key = 'leader'`).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if !live {
		t.Fatal("the leader stopped leading only after the database let its lease expire")
	}
	if leader.e.IsLeader() || follower.e.IsLeader() {
		t.Fatalf("IsLeader: cut %v, follower %v; want neither while the lease runs out", leader.e.IsLeader(), follower.e.IsLeader())
	}
	if err := context.Cause(term.Context()); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("the term ended with %v, want ErrLeaseLost", err)
	}
	backdate(t, db.Pool, "leader", 0) // let the remaining TTL pass
	eventually(t, 10*time.Second, "the follower leads", follower.e.IsLeader)
	if got := follower.e.Term().Token(); got <= term.Token() {
		t.Fatalf("term %d after %d", got, term.Token())
	}
	p.Heal()
	p.CutAll()
	if err := leader.e.Health(); err == nil && !leader.e.IsLeader() {
		t.Logf("the cut-off replica is healthy again as a follower")
	}
}

// Health answers for a readiness probe: not running, leader, follower, and
// a follower that cannot read the election.
func TestHealth(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	p := newProxy(t, serverAddr(t, db.URL))
	url, err := p.ConnString(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfgPool, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfgPool.ConnConfig.ConnectTimeout = time.Second
	cut, err := pgxpool.NewWithConfig(context.Background(), cfgPool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cut.Close)

	idle, err := election.New(newClient(t, db.Pool, nil), "h", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Health(); err == nil || !strings.Contains(err.Error(), "not campaigning") {
		t.Fatalf("Health without Run: %v", err)
	}
	leader := startReplica(t, db.Pool, "h", "leader", election.Config{})
	eventually(t, 10*time.Second, "a leader", leader.e.IsLeader)
	// A follower with a short poll, so that it reads (and fails) soon.
	follower := startReplica(t, cut, "h", "follower", election.Config{PollInterval: 50 * time.Millisecond})
	eventually(t, 10*time.Second, "the follower healthy", func() bool { return follower.e.Health() == nil })
	if err := leader.e.Health(); err != nil {
		t.Fatalf("leader: %v", err)
	}
	p.SetRefuse(true)
	p.CutAll()
	eventually(t, 10*time.Second, "the cut-off follower unhealthy", func() bool { return follower.e.Health() != nil })
	t.Logf("unhealthy: %v", follower.e.Health())
	p.SetRefuse(false)
	eventually(t, 10*time.Second, "the follower healthy again", func() bool { return follower.e.Health() == nil })
}

// Observe streams the current leadership, then every change: a key never
// led, a term, a published value, a resignation.
func TestObserve(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	terms := make(chan *election.Term, 1)
	e, err := election.New(newClient(t, pool, nil), "o", &election.Config{AcquireOptions: leases.AcquireOptions{HolderInfo: "v1"},
		OnStartedLeading: func(ctx context.Context, term *election.Term) { terms <- term; <-ctx.Done() }})
	if err != nil {
		t.Fatal(err)
	}
	octx, cancel := context.WithCancel(ctx)
	ch, err := e.Observe(octx)
	if err != nil {
		t.Fatal(err)
	}
	next := func() election.Leader {
		t.Helper()
		select {
		case l := <-ch:
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no leadership change within 10 s")
		}
		return election.Leader{}
	}
	if l := next(); l.Term != 0 {
		t.Fatalf("first: %+v, want no leader", l)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(rctx) }()
	defer func() { stop(); <-done }()
	term := <-terms
	if l := next(); l.Term != term.Token() || l.Value != "v1" || l.Holder != term.Holder() {
		t.Fatalf("after the campaign: %+v", l)
	}
	if err := term.Proclaim(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	if l := next(); l.Term != term.Token() || l.Value != "v2" {
		t.Fatalf("after Proclaim: %+v", l)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if l := next(); l.Term != 0 || l.Since.IsZero() {
		t.Fatalf("after Resign: %+v", l)
	}
	if err := term.Proclaim(ctx, "v3"); !errors.Is(err, election.ErrResigned) {
		t.Fatalf("Proclaim after Resign: %v", err)
	}
	cancel()
	for range ch {
	}
}

// New refuses what an election cannot do, naming the field.
func TestNewRefuses(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, nil)
	for field, cfg := range map[string]*election.Config{
		"Config.TTL":          {TTL: -1},
		"Config.PollInterval": {PollInterval: -1},
		"Config.TryOnce":      {AcquireOptions: leases.AcquireOptions{TryOnce: true}},
		"Config.MaxWait":      {AcquireOptions: leases.AcquireOptions{MaxWait: time.Second}},
		// A term lasts while its lease is renewed.
		"Config.NoKeepAlive": {AcquireOptions: leases.AcquireOptions{NoKeepAlive: true}},
		// Renewals the TTL leaves no room for: every term would lapse
		// unrenewed (the keep-alive would meet them only once a term began).
		"AcquireOptions.RenewInterval": {AcquireOptions: leases.AcquireOptions{RenewInterval: 20 * time.Second}},
		"AcquireOptions.MaxHold":       {AcquireOptions: leases.AcquireOptions{MaxHold: -1}},
		"AcquireOptions.MaxFailures":   {AcquireOptions: leases.AcquireOptions{MaxFailures: -1}},
		"AcquireOptions.HolderInfo":    {AcquireOptions: leases.AcquireOptions{HolderInfo: strings.Repeat("x", leases.MaxHolderInfoBytes+1)}},
		"must be at most 24h0m0s":      {TTL: 25 * time.Hour}, // the database's limit
	} {
		if _, err := election.New(c, "k", cfg); !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), field) {
			t.Errorf("%+v: %v, want ErrInvalid naming %s", cfg, err, field)
		}
	}
	for _, key := range []string{"", "k\x00", "\xff"} {
		if _, err := election.New(c, key, nil); !errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("key %q: %v", key, err)
		}
	}
}

// Run returns nil when its context ends: a stop asked for is not a failure,
// whether the context ended before Run began (then it sends nothing and
// leads nothing), while it follows, or while it leads (it resigns first).
func TestRunReturnsNilWhenStopped(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	client := newClient(t, pool, nil)
	ctx := ctxTimeout(t, time.Minute)
	run := func(e *election.Election, rctx context.Context) chan error {
		done := make(chan error, 1)
		go func() { done <- e.Run(rctx) }()
		return done
	}
	returned := func(what string, done chan error) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: Run returned %v, want nil", what, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Run did not return within 10 s", what)
		}
	}
	newElection := func(key string) *election.Election {
		t.Helper()
		e, err := election.New(client, key, &election.Config{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}

	// Cancelled, and past its deadline, before Run began.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	for what, rctx := range map[string]context.Context{"cancelled": cancelled, "deadline passed": expired} {
		e := newElection("stopped-before")
		returned(what+" before Run", run(e, rctx))
		if e.IsLeader() || e.Term() != nil {
			t.Fatalf("%s before Run: it leads term %v", what, e.Term())
		}
		if err := e.Health(); err == nil || !strings.Contains(err.Error(), "not campaigning") {
			t.Fatalf("%s before Run: Health %v, want not campaigning", what, err)
		}
	}
	if _, err := client.Get(ctx, "stopped-before"); !errors.Is(err, pgfence.ErrNotFound) {
		t.Fatalf("a Run stopped before it began granted the key: %v", err)
	}

	// Leading, then a follower, each stopped by its context.
	leader := newElection("stopped")
	lctx, stopLeader := context.WithCancel(ctx)
	defer stopLeader()
	leaderDone := run(leader, lctx)
	eventually(t, 10*time.Second, "a leader", leader.IsLeader)
	term := leader.Term()
	follower := newElection("stopped")
	fctx, stopFollower := context.WithCancel(ctx)
	defer stopFollower()
	followerDone := run(follower, fctx)
	eventually(t, 10*time.Second, "the follower healthy", func() bool { return follower.Health() == nil })
	stopFollower()
	returned("a follower cancelled", followerDone)
	if !leader.IsLeader() {
		t.Fatalf("the leader's term ended when the follower stopped: %v", term.Err())
	}
	stopLeader()
	returned("a leader cancelled", leaderDone)
	if err := context.Cause(term.Context()); !errors.Is(err, election.ErrResigned) {
		t.Fatalf("the term of a Run stopped by its context ended with %v, want ErrResigned", err)
	}
	if st, err := client.Get(ctx, "stopped"); err != nil || st.Live {
		t.Fatalf("after the leader's Run returned: %+v %v, want released", st, err)
	}
}

// Run's watch ends with Run's context, and the watcher may notice first: Run
// then still resigns (the term's context ends, so OnStartedLeading returns)
// instead of waiting forever for a callback that waits for its term. The
// same when the client is closed under a leading Run. Ended many times, since
// which of the two Run sees first is up to the scheduler.
func TestRunEndsWhenItsWatchEnds(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	lead := func(client *leases.Client, key string) (context.CancelFunc, chan error, chan error) {
		t.Helper()
		leading := make(chan struct{})
		termEnded := make(chan error, 1)
		e, err := election.New(client, key, &election.Config{
			TTL: 5 * time.Second,
			OnStartedLeading: func(ctx context.Context, _ *election.Term) {
				close(leading)
				<-ctx.Done()
				termEnded <- context.Cause(ctx)
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- e.Run(rctx) }()
		select {
		case <-leading:
		case <-time.After(10 * time.Second):
			t.Fatal("not elected within 10s")
		}
		return cancel, done, termEnded
	}
	ended := func(what string, done, termEnded chan error) error {
		t.Helper()
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Run did not return within 10s", what)
		}
		if cause := <-termEnded; !errors.Is(cause, election.ErrResigned) {
			t.Fatalf("%s: the term ended with %v, want ErrResigned", what, cause)
		}
		return err
	}
	client := newClient(t, pool, nil)
	for i := range 30 {
		cancel, done, termEnded := lead(client, "watch-ends/"+strconv.Itoa(i))
		cancel()
		// A stop asked for is not a failure.
		if err := ended("Run's context cancelled", done, termEnded); err != nil {
			t.Fatalf("Run ended by its context: %v, want nil", err)
		}
	}
	closing, err := leases.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	cancel, done, termEnded := lead(closing, "watch-ends/closed")
	defer cancel()
	if err := closing.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ended("client closed", done, termEnded); !errors.Is(err, leases.ErrClosed) {
		t.Fatalf("Run under a closed client: %v, want ErrClosed", err)
	}
}

// A leader under Run may resign from OnStartedLeading: Election.Resign with
// the callback's context ends the term and returns at once, and the lease
// stays granted until the callback returns, so the leader's work stops
// before another replica may begin.
func TestResignFromOnStartedLeading(t *testing.T) {
	for _, via := range []string{"Election.Resign"} {
		t.Run(via, func(t *testing.T) {
			checkLeaks(t)
			pool := pgfencetest.NewPool(t)
			client := newClient(t, pool, nil)
			ctx := ctxTimeout(t, time.Minute)
			var (
				e       *election.Election
				inside  = make(chan error, 1) // what the callback saw
				stopped = make(chan error, 1)
			)
			cfg := election.Config{
				TTL: 10 * time.Second,
				OnStartedLeading: func(cbctx context.Context, term *election.Term) {
					if err := e.Resign(cbctx); err != nil {
						inside <- fmt.Errorf("%s from the callback: %w", via, err)
						return
					}
					if cbctx.Err() == nil {
						inside <- errors.New("the term's context has not ended after the resignation")
						return
					}
					// Still granted while the leader's work runs.
					s, err := client.Get(ctx, "solo")
					switch {
					case err != nil:
						inside <- err
					case !s.Live || s.Token != term.Token():
						inside <- fmt.Errorf("lease %+v while the callback runs, want term %d live", s, term.Token())
					default:
						inside <- nil
					}
				},
				OnStoppedLeading: func(_ *election.Term, cause error) { stopped <- cause },
			}
			var err error
			if e, err = election.New(client, "solo", &cfg); err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- e.Run(rctx) }()
			defer func() {
				cancel()
				<-done
			}()
			select {
			case err := <-inside:
				if err != nil {
					t.Fatal(err)
				}
			case <-ctx.Done():
				t.Fatal("the callback did not finish: the resignation blocks it")
			}
			if cause := <-stopped; !errors.Is(cause, election.ErrResigned) {
				t.Fatalf("OnStoppedLeading: %v, want ErrResigned", cause)
			}
			if s, err := client.Get(ctx, "solo"); err != nil || s.Live || s.ReleasedAt.IsZero() {
				t.Fatalf("after the callback returned: %+v %v, want released", s, err)
			}
		})
	}
}

// A resignation that arrives while Run steps down from a term it lost is
// for that term: it does not end the next term this replica wins.
func TestResignOfALostTermSparesTheNext(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	client := newClient(t, pool, nil)
	operator := newClient(t, pool, nil)
	ctx := ctxTimeout(t, time.Minute)
	var (
		mu      sync.Mutex
		started []*election.Term
		proceed = make(chan struct{})
		first   = true
	)
	terms := make(chan *election.Term, 4)
	cfg := election.Config{
		TTL:            3 * time.Second,
		PollInterval:   100 * time.Millisecond,
		AcquireOptions: leases.AcquireOptions{RenewInterval: 100 * time.Millisecond},
		OnStartedLeading: func(cbctx context.Context, term *election.Term) {
			mu.Lock()
			started = append(started, term)
			hold := first
			first = false
			mu.Unlock()
			terms <- term
			<-cbctx.Done()
			if hold {
				<-proceed // the first term's work takes a while to stop
			}
		},
	}
	e, err := election.New(client, "resign-lost", &cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(rctx) }()
	defer func() {
		cancel()
		<-done
	}()
	release := sync.OnceFunc(func() { close(proceed) })
	defer release() // before Run is stopped: its step-down waits for the callback
	t1 := <-terms
	if _, err := operator.ForceRelease(ctx, "resign-lost", "test: the first term is lost"); err != nil {
		t.Fatal(err)
	}
	<-t1.Context().Done() // lost at its next renewal; Run waits for its callback
	if !errors.Is(context.Cause(t1.Context()), pgfence.ErrLeaseLost) {
		t.Fatalf("the first term ended with %v, want ErrLeaseLost", context.Cause(t1.Context()))
	}
	resigned := make(chan error, 1)
	go func() { resigned <- e.Resign(ctx) }()
	eventually(t, 10*time.Second, "Resign's signal to Run", func() bool { return election.ResignPending(e) == 1 })
	release()
	if err := <-resigned; err != nil && !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("Resign of the lost term: %v", err)
	}
	// Had the signal been kept, Run would end the next term with it.
	if n := election.ResignPending(e); n != 0 {
		t.Fatalf("%d resignations still wait for Run after the term they were for ended", n)
	}
	t2 := <-terms
	if t2.Token() <= t1.Token() {
		t.Fatalf("term %d after term %d", t2.Token(), t1.Token())
	}
	if err := t2.Err(); err != nil {
		t.Fatalf("the next term ended: %v", err)
	}
}

// A second Resign of a term whose release is under way waits for it only as
// long as its own context allows.
func TestSecondResignKeepsItsDeadline(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	p := newProxy(t, serverAddr(t, db.URL))
	url, err := p.ConnString(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r := startReplicaWith(t, newClient(t, pool, &leases.Config{DisableWakeups: true}), "second-resign", "solo", election.Config{TTL: 10 * time.Second})
	eventually(t, 10*time.Second, "a leader", r.e.IsLeader)
	term := r.e.Term()
	p.SetHold(faultproxy.ServerToClient, true) // the release's reply waits
	first := make(chan error, 1)
	go func() { first <- r.e.Resign(ctx) }()
	eventually(t, 10*time.Second, "the first resignation under way", func() bool { return term.Err() != nil })
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	second := make(chan error, 1)
	go func() { second <- r.e.Resign(short) }()
	select {
	case err := <-second:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the second Resign: %v, want its context's deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the second Resign waited for the first past its own deadline")
		defer func() { <-second }()
	}
	p.SetHold(faultproxy.ServerToClient, false)
	if err := <-first; err != nil {
		t.Fatalf("the first Resign: %v", err)
	}
}
