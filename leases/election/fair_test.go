package election_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/election"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// With Fair, candidates lead in the order they began to campaign, and a
// leader that resigns queues behind those who waited; a candidate whose Run
// ends leaves the queue. Four replicas a, b, c, d that resign in turn, c
// stopped after the first hand-over, lead a, b, d, a, b.
func TestFairCandidatesLeadInArrivalOrder(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	queued := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_waiters WHERE key = 'fifo'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	cfg := election.Config{TTL: 5 * time.Second, AcquireOptions: leases.AcquireOptions{Fair: true}}
	var rs []*replica
	for i, name := range []string{"a", "b", "c", "d"} {
		rs = append(rs, startReplica(t, pool, "fifo", name, cfg))
		if i == 0 {
			oneLeader(t, rs, nil)
			continue
		}
		// The next candidate starts once this one has its place.
		eventually(t, 10*time.Second, name+" queued", func() bool { return queued() == i })
	}
	a, b, c, d := rs[0], rs[1], rs[2], rs[3]

	leader := a
	handOver := func(live []*replica, want *replica) {
		t.Helper()
		// Every candidate but the leader waits its turn, the last leader
		// too once its successor was elected.
		eventually(t, 20*time.Second, fmt.Sprint(len(live)-1, " candidates queued"), func() bool { return queued() == len(live)-1 })
		if err := leader.e.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if next := oneLeader(t, live, leader); next != want {
			t.Fatalf("%s resigned and %s leads, want %s (arrival order)", leader.name, next.name, want.name)
		}
		leader = want
	}
	handOver(rs, b) // queue: b c d
	c.close(t)      // queue: c d a, and c leaves
	live := []*replica{a, b, d}
	handOver(live, d) // queue: d a
	handOver(live, a) // queue: a b
	handOver(live, b) // queue: b d
	if c.e.Term() != nil {
		t.Fatalf("c, stopped while queued, has a term")
	}
}

// A fair leader that loses its lease is replaced by the head of the queue,
// not by whoever tries first, and queues again behind the others.
func TestFairTakeoverFollowsTheQueue(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	queued := func() (n int) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_waiters WHERE key = 'fifo-lost'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	cfg := election.Config{TTL: 5 * time.Second, AcquireOptions: leases.AcquireOptions{Fair: true}}
	var rs []*replica
	for i, name := range []string{"a", "b", "c"} {
		rs = append(rs, startReplica(t, pool, "fifo-lost", name, cfg))
		if i == 0 {
			oneLeader(t, rs, nil)
			continue
		}
		eventually(t, 10*time.Second, name+" queued", func() bool { return queued() == i })
	}
	// a's lease expires by the database clock, as if a had stopped renewing.
	backdate(t, pool, "fifo-lost", 0)
	if next := oneLeader(t, rs, rs[0]); next != rs[1] {
		t.Fatalf("a's lease expired and %s leads, want b (the head of the queue)", next.name)
	}
	eventually(t, 10*time.Second, "a and c queued", func() bool { return queued() == 2 })
	if err := rs[1].e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if next := oneLeader(t, rs, rs[1]); next != rs[2] {
		t.Fatalf("b resigned and %s leads, want c (queued before a)", next.name)
	}
}
