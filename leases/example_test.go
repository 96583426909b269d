package leases_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A lease with a fencing token: the second holder is refused while the first
// holds it, and gets a larger token after the release.
func Example() {
	db, err := pgfencetest.Open() // a fresh migrated database; use your own pool
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx := context.Background()

	c, err := leases.New(db.Pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	first, err := c.TryAcquire(ctx, "nightly-report", 30*time.Second, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = c.TryAcquire(ctx, "nightly-report", 30*time.Second, nil)
	var held *leases.HeldError
	fmt.Println("second attempt refused:", errors.As(err, &held) && held.Remaining > 29*time.Second)

	if err := first.Release(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("first lease context ended:", errors.Is(first.Err(), leases.ErrReleased))

	second, err := c.Acquire(ctx, "nightly-report", 30*time.Second, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("token increased:", second.Token() > first.Token())
	_ = second.Release(ctx)

	// Output:
	// second attempt refused: true
	// first lease context ended: true
	// token increased: true
}

// Do runs a function under a kept-alive lease; the function's context ends if
// the lease is lost, and the lease is released when it returns.
func ExampleClient_Do() {
	db, err := pgfencetest.Open()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := leases.New(db.Pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	err = c.Do(ctx, "singleton-cron", 30*time.Second, nil, func(ctx context.Context, l *leases.Lease) error {
		// Carry l.Token() to the resource this job writes (see package pgfence).
		fmt.Println("running under token > 0:", l.Token() > 0)
		return nil
	})
	fmt.Println("done:", err)

	hist, err := c.History(ctx, "singleton-cron", 10)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range hist {
		fmt.Println(e.Kind)
	}

	// Output:
	// running under token > 0: true
	// done: <nil>
	// released
	// acquired
}
