package election_test

import (
	"context"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/election"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Two replicas run the same election. The leader writes through the fence
// with its term and publishes its address; the follower sees who leads; when
// the leader's Run ends it resigns, and the follower is elected with a later
// term.
func Example() {
	db, err := pgfencetest.Open() // a fresh migrated database; use your own pool
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE leader_log (term bigint, who text)`); err != nil {
		fmt.Println(err)
		return
	}

	elected := make(chan string, 2)
	// Each replica is a process of its own, with its own client; here both
	// share one pool.
	client, err := leases.New(db.Pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	replica := func(name string) (*election.Election, error) {
		return election.New(client, "billing/scheduler", &election.Config{
			AcquireOptions: leases.AcquireOptions{HolderInfo: name},
			OnStartedLeading: func(ctx context.Context, term *election.Term) {
				// Every write of the leader goes through the fence with its term.
				if _, err := pgfence.Exec(ctx, db.Pool, term, `INSERT INTO leader_log VALUES ($1, $2)`, term.Token(), name); err != nil {
					fmt.Println(err)
				}
				elected <- name
				<-ctx.Done() // lead until the term ends
			},
		})
	}
	a, err := replica("a")
	if err != nil {
		fmt.Println(err)
		return
	}
	b, err := replica("b")
	if err != nil {
		fmt.Println(err)
		return
	}

	runA, stopA := context.WithCancel(ctx)
	doneA := make(chan error, 1)
	go func() { doneA <- a.Run(runA) }()
	fmt.Println("elected:", <-elected)
	if err := a.Term().Proclaim(ctx, "a at 10.0.0.7:8080"); err != nil {
		fmt.Println(err)
	}

	runB, stopB := context.WithCancel(ctx)
	doneB := make(chan error, 1)
	go func() { doneB <- b.Run(runB) }()
	leader, err := b.Leader(ctx)
	if err != nil {
		fmt.Println(err)
	}
	fmt.Println("b sees:", leader.Value, "| b leads:", b.IsLeader())

	stopA()                                   // a shuts down: it resigns, and b takes over at once
	fmt.Println("a's Run returned:", <-doneA) // a stop asked for is not a failure
	fmt.Println("elected:", <-elected)

	var terms int
	var increasing bool
	_ = db.Pool.QueryRow(ctx, `SELECT count(*), min(term) < max(term) FROM leader_log`).Scan(&terms, &increasing)
	fmt.Println("terms:", terms, "| increasing:", increasing)
	stopB()
	<-doneB

	// Output:
	// elected: a
	// b sees: a at 10.0.0.7:8080 | b leads: false
	// a's Run returned: <nil>
	// elected: b
	// terms: 2 | increasing: true
}
