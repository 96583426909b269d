package job_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/job"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Two replicas run the same nightly job for the same day: one runs it and
// records the report with the slot's completion; the other finds the slot
// completed and skips it.
func Example() {
	db, err := pgfencetest.Open() // a fresh migrated database; use your own pool
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE reports (day text PRIMARY KEY, body text)`); err != nil {
		fmt.Println(err)
		return
	}
	client, err := leases.New(db.Pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	nightly := func(ctx context.Context, s *job.Slot) error {
		body := "report of " + s.Name() // the job's work
		// The last write and the slot's completion commit together, fenced
		// with this run's token.
		return s.Finish(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO reports VALUES ($1, $2)`, s.Name(), body)
			return err
		})
	}
	for _, replica := range []string{"a", "b"} {
		runner, err := job.New(client, "jobs/nightly-report", nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		res, err := runner.Run(ctx, "2026-12-03", nightly)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(replica+": ran", res.Ran, "| runs:", res.Runs)
	}
	var n int
	_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM reports`).Scan(&n)
	fmt.Println("reports:", n)

	// Output:
	// a: ran true | runs: 1
	// b: ran false | runs: 1
	// reports: 1
}
