package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/election"
)

// The election curves: how long an election goes without a leader after the
// leader dies, and what the followers of a healthy election cost the
// database. Every replica has a client, a pool and a LISTEN connection of
// its own, as it would in a process of its own.
const (
	// failoverReplicas campaign in the failover curve: one leads, the others
	// follow; a killed leader is replaced by a new replica.
	failoverReplicas = 3
	// electedTimeout bounds the wait for a leader, beyond the TTL.
	electedTimeout = 30 * time.Second
)

// errKilled is what a killed replica's connections answer.
var errKilled = errors.New("replica killed")

// killSwitch is a replica's dialer: kill closes every connection the
// replica has to the server and refuses new ones, which is what the server
// sees of a process killed with SIGKILL — its sockets closed, no release,
// its lease left to expire.
type killSwitch struct {
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

func (k *killSwitch) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if k.killed() {
		return nil, errKilled
	}
	c, err := k.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		_ = c.Close()
		return nil, errKilled
	}
	k.conns = append(k.conns, c)
	return c, nil
}

func (k *killSwitch) killed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dead
}

func (k *killSwitch) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	for _, c := range k.conns {
		_ = c.Close()
	}
	k.conns = nil
}

// elected is a replica's start of a term, by its own clock.
type elected struct {
	r    *replica
	term int64
	at   time.Time
}

// replica is one participant of a bench election.
type replica struct {
	name   string
	ks     *killSwitch
	pool   *pgxpool.Pool
	client *leases.Client
	e      *election.Election
	cancel context.CancelFunc
	done   chan error
	// observed is the newest term this replica's OnLeader reported.
	observed atomic.Int64
}

// electionConfig is what a bench replica is started with.
type electionConfig struct {
	key     string
	ttl     time.Duration
	counter *statementCounter
	elected chan<- elected // receives every start of a term; never blocks the election
}

// startReplica starts a replica campaigning in the election of cfg.key.
func (lab *Lab) startReplica(ctx context.Context, name string, cfg electionConfig) (*replica, error) {
	pcfg, err := pgxpool.ParseConfig(lab.url)
	if err != nil {
		return nil, err
	}
	r := &replica{name: name, ks: &killSwitch{dial: pcfg.ConnConfig.DialFunc}, done: make(chan error, 1)}
	if r.ks.dial == nil {
		r.ks.dial = (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext
	}
	pcfg.ConnConfig.DialFunc = r.ks.dialContext
	pcfg.ConnConfig.Tracer = cfg.counter // the LISTEN connection copies it too
	pcfg.MaxConns = 2
	if r.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, err
	}
	if r.client, err = leases.New(r.pool, nil); err != nil {
		r.pool.Close()
		return nil, err
	}
	r.e, err = election.New(r.client, cfg.key, &election.Config{
		TTL:            cfg.ttl,
		AcquireOptions: leases.AcquireOptions{HolderInfo: name},
		OnStartedLeading: func(ctx context.Context, term *election.Term) {
			select {
			case cfg.elected <- elected{r: r, term: term.Token(), at: time.Now()}:
			default:
			}
			<-ctx.Done()
		},
		OnLeader: func(l election.Leader) { r.observed.Store(l.Term) },
	})
	if err != nil {
		_ = r.client.Close()
		r.pool.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	go func() { r.done <- r.e.Run(rctx) }()
	return r, nil
}

// stop ends the replica's Run (a leader resigns, unless it was killed) and
// closes its client and pool.
func (r *replica) stop() error {
	r.cancel()
	var err error
	select {
	case err = <-r.done:
		if errors.Is(err, context.Canceled) {
			err = nil
		}
	case <-time.After(electedTimeout):
		err = fmt.Errorf("replica %s: Run did not return within %s of its context's end", r.name, electedTimeout)
	}
	_ = r.client.Close()
	r.pool.Close()
	return err
}

// waitElected returns the next start of a term.
func waitElected(ctx context.Context, ch <-chan elected, ttl time.Duration) (elected, error) {
	select {
	case el := <-ch:
		return el, nil
	case <-ctx.Done():
		return elected{}, ctx.Err()
	case <-time.After(ttl + electedTimeout):
		return elected{}, fmt.Errorf("no leader elected within %s", ttl+electedTimeout)
	}
}

// curveFailover measures the time from killing the leader (its connections
// closed, as SIGKILL would: no release) to the start of the next leader's
// term, over kills failovers among failoverReplicas replicas; each kill falls
// at a random moment of the leader's renewal interval. X is the TTL in
// milliseconds; the statements are every replica's, while the curve ran.
func (lab *Lab) curveFailover(ctx context.Context, ttl time.Duration, kills int, measure pointFunc) (err error) {
	counter := &statementCounter{}
	ch := make(chan elected, 16)
	cfg := electionConfig{key: curvePrefix + "election/failover", ttl: ttl, counter: counter, elected: ch}
	var replicas []*replica
	defer func() {
		for _, r := range replicas {
			err = errors.Join(err, r.stop())
		}
	}()
	seq := 0
	start := func() error {
		seq++
		r, err := lab.startReplica(ctx, "bench-replica-"+strconv.Itoa(seq), cfg)
		if err == nil {
			replicas = append(replicas, r)
		}
		return err
	}
	for range failoverReplicas {
		if err := start(); err != nil {
			return err
		}
	}
	fmt.Fprintf(lab.progress, "  election failover: %d kills of the leader among %d replicas, TTL %s\n", kills, failoverReplicas, ttl)
	leader, err := waitElected(ctx, ch, ttl)
	if err != nil {
		return err
	}
	began, before := time.Now(), counter.Load()
	var lat []time.Duration
	for i := range kills {
		// A leader renews every TTL/3: a crash falls anywhere in between.
		select {
		case <-time.After(rand.N(ttl / 3)):
		case <-ctx.Done():
			return ctx.Err()
		}
		killedAt := time.Now()
		leader.r.ks.kill()
		next, err := waitElected(ctx, ch, ttl)
		if err != nil {
			return fmt.Errorf("after kill %d: %w", i+1, err)
		}
		if next.r == leader.r || next.term <= leader.term {
			return fmt.Errorf("after kill %d: term %d of %s followed term %d of %s", i+1, next.term, next.r.name, leader.term, leader.r.name)
		}
		lat = append(lat, next.at.Sub(killedAt))
		fmt.Fprintf(lab.progress, "  kill %d: %s (term %d) → %s (term %d) after %s\n", i+1, leader.r.name, leader.term, next.r.name, next.term, next.at.Sub(killedAt).Round(time.Millisecond))
		// The dead replica's process is gone: a new one takes its place.
		for j, r := range replicas {
			if r == leader.r {
				replicas = append(replicas[:j], replicas[j+1:]...)
				if err := r.stop(); err != nil {
					return err
				}
				break
			}
		}
		if err := start(); err != nil {
			return err
		}
		leader = next
	}
	res := benchrun.Summarize(lat, time.Since(began), failoverReplicas, 0, 0, nil)
	res.SetStatements(counter.Load() - before)
	measure("election-failover", ttl.Milliseconds(), res)
	return nil
}

// curveFollowers measures the statements per second of n idle followers of
// a leader that holds its term, for each n in sizes, over window (after every
// follower has read the leader once). The leader's own statements are
// reported beside them.
func (lab *Lab) curveFollowers(ctx context.Context, sizes []int64, ttl, window time.Duration, measure pointFunc) error {
	for _, n := range sizes {
		if err := lab.followersPoint(ctx, n, ttl, window, measure); err != nil {
			return err
		}
	}
	return nil
}

func (lab *Lab) followersPoint(ctx context.Context, n int64, ttl, window time.Duration, measure pointFunc) (err error) {
	key := curvePrefix + "election/followers-" + strconv.FormatInt(n, 10)
	leaderCount, followerCount := &statementCounter{}, &statementCounter{}
	ch := make(chan elected, 1)
	var replicas []*replica
	defer func() {
		for _, r := range replicas {
			err = errors.Join(err, r.stop())
		}
	}()
	leader, err := lab.startReplica(ctx, "bench-leader", electionConfig{key: key, ttl: ttl, counter: leaderCount, elected: ch})
	if err != nil {
		return err
	}
	replicas = append(replicas, leader)
	el, err := waitElected(ctx, ch, ttl)
	if err != nil {
		return err
	}
	for i := range n {
		r, err := lab.startReplica(ctx, "bench-follower-"+strconv.FormatInt(i, 10), electionConfig{key: key, ttl: ttl, counter: followerCount, elected: ch})
		if err != nil {
			return fmt.Errorf("follower %d of %d: %w", i+1, n, err)
		}
		replicas = append(replicas, r)
	}
	// Every follower has read the election and knows its leader.
	deadline := time.Now().Add(electedTimeout)
	for {
		all := true
		for _, r := range replicas[1:] {
			all = all && r.observed.Load() == el.term
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d followers: not all read the leader of term %d within %s", n, el.term, electedTimeout)
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	done := startProgress(lab.progress, fmt.Sprintf("idle followers = %d (TTL %s, the leader renewing every %s)", n, ttl, (ttl/3).Round(time.Millisecond)), window, 0)
	began, fBefore, lBefore := time.Now(), followerCount.Load(), leaderCount.Load()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		done()
		return ctx.Err()
	}
	elapsed := time.Since(began)
	done()
	if !leader.e.IsLeader() {
		return fmt.Errorf("%d followers: the leader lost its term during the measurement", n)
	}
	select {
	case el := <-ch:
		return fmt.Errorf("%d followers: %s was elected (term %d) while the leader held its term", n, el.r.name, el.term)
	default:
	}
	res := benchrun.Result{Workers: int(n), Elapsed: elapsed}
	res.SetStatements(followerCount.Load() - fBefore)
	lead := benchrun.Result{Workers: 1, Elapsed: elapsed}
	lead.SetStatements(leaderCount.Load() - lBefore)
	fmt.Fprintf(lab.progress, "  %d idle followers: %.2f statements/s (%.3f per follower); the leader: %.2f statements/s\n",
		n, res.StatementsPerS, res.StatementsPerS/float64(n), lead.StatementsPerS)
	measure("idle-followers", n, res)
	measure("idle-followers-leader", n, lead)
	return nil
}

// pointFunc records one measured point of a curve.
type pointFunc func(curve string, x int64, r benchrun.Result)

// electionVerdicts states the election's goals against the points.
func electionVerdicts(points []Point) []string {
	var out []string
	for _, p := range points {
		if p.Curve != "election-failover" || p.Ops == 0 {
			continue
		}
		ttl := time.Duration(p.X) * time.Millisecond
		out = append(out, fmt.Sprintf("leader failover after a kill, TTL %s: p50 %.2f s, p99 %.2f s over %d kills (goal p99 ≤ TTL + 1 s = %.1f s; "+
			"client-go's defaults, 15 s lease / 10 s renew deadline / 2 s retry, replace a dead leader no sooner than 15 s after a follower "+
			"last saw it renew, at its next 2 s retry)",
			ttl, p.P50.Seconds(), p.P99.Seconds(), p.Ops, (ttl+time.Second).Seconds()))
	}
	var followers, leader []string
	for _, p := range points {
		switch p.Curve {
		case "idle-followers":
			followers = append(followers, fmt.Sprintf("%d: %.2f/s (%.3f each)", p.X, p.StatementsPerS, p.StatementsPerS/float64(max(p.X, 1))))
		case "idle-followers-leader":
			leader = append(leader, fmt.Sprintf("%d: %.2f/s", p.X, p.StatementsPerS))
		}
	}
	if len(followers) > 0 {
		out = append(out, fmt.Sprintf("idle followers, statements/s by followers — %s; the leader's own, by followers — %s (goal: flat in N)",
			strings.Join(followers, ", "), strings.Join(leader, ", ")))
	}
	return out
}
