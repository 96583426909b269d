package pgfence_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// 16 writers with random tokens on one resource. Every accepted write appends
// to a log in the same transaction; the fence row lock orders the log by
// commit. Accepted tokens never decrease, every rejection names a higher
// accepted token, and the final state is the write of the highest token.
func TestConcurrentWriters(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	mustExec(t, pool, `CREATE TABLE state (id int PRIMARY KEY, token bigint NOT NULL, writer int NOT NULL)`)
	mustExec(t, pool, `INSERT INTO state VALUES (1, 0, -1)`)
	mustExec(t, pool, `CREATE TABLE log (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, token bigint NOT NULL, writer int NOT NULL)`)
	issue(t, pool, "state:1")
	const writers, rounds = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for r := range rounds {
				// Tokens drift upwards with overlap between writers, so that
				// many writes are accepted and many are stale.
				token := int64(r)*10 + 1 + rng.Int64N(40)
				_, err := pgfence.Write(ctx, pool, pgfence.LeaseOf("state:1", "", token), func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO log (token, writer) VALUES ($1, $2)`, token, w); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `UPDATE state SET token = $1, writer = $2 WHERE id = 1`, token, w)
					return err
				})
				var st *pgfence.StaleTokenError
				switch {
				case err == nil:
				case errors.As(err, &st):
					if st.Accepted <= st.Presented {
						errs <- errors.New("rejection without a higher accepted token: " + err.Error())
						return
					}
				default:
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT token, writer FROM log ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct{ Token, Writer int64 }
	log, err := pgx.CollectRows(rows, pgx.RowToStructByPos[entry])
	if err != nil {
		t.Fatal(err)
	}
	if len(log) == 0 {
		t.Fatal("no write was accepted")
	}
	for i := 1; i < len(log); i++ {
		if log[i].Token < log[i-1].Token {
			t.Fatalf("accepted tokens decreased: %d then %d (at %d)", log[i-1].Token, log[i].Token, i)
		}
	}
	last := log[len(log)-1]
	var token, writer int64
	if err := pool.QueryRow(ctx, `SELECT token, writer FROM state WHERE id = 1`).Scan(&token, &writer); err != nil {
		t.Fatal(err)
	}
	if token != last.Token || writer != last.Writer {
		t.Fatalf("final state token %d writer %d, want the last accepted write %+v", token, writer, last)
	}
	st, err := pgfence.LookupFence(ctx, pool, "state:1")
	if err != nil || st.Token != last.Token || st.Writes != int64(len(log)) {
		t.Fatalf("fence %+v (%v), want token %d after %d writes", st, err, last.Token, len(log))
	}
	t.Logf("%d of %d writes accepted, highest token %d", len(log), writers*rounds, last.Token)
}
