package pgfence_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// MapError of an error that is already one of the package's (a helper's
// error) returns it unchanged: a helper's ErrUnavailable stays unavailable,
// not an unknown outcome, and its message is not repeated.
func TestMapErrorIdempotent(t *testing.T) {
	ctx := testContext(t)
	dead, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	_, unavailable := pgfence.Exec(ctx, dead, pgfence.LeaseOf("r", "", 1), `SELECT 1`)
	if !errors.Is(unavailable, pgfence.ErrUnavailable) {
		t.Fatalf("Exec on a dead server: %v, want ErrUnavailable", unavailable)
	}
	pool := pgfencetest.NewPool(t)
	issue(t, pool, "r")
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("r", "", 9), `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	_, stale := pgfence.Exec(ctx, pool, pgfence.LeaseOf("r", "", 8), `SELECT 1`)
	for name, err := range map[string]error{"unavailable": unavailable, "stale": stale} {
		again := pgfence.MapError(err)
		if again != err {
			t.Errorf("MapError(%s error) = %v, want it unchanged (%v)", name, again, err)
		}
		if errors.Is(again, pgfence.ErrOutcomeUnknown) {
			t.Errorf("MapError(%s error) says the outcome is unknown: %v", name, again)
		}
	}
	if n := strings.Count(pgfence.MapError(unavailable).Error(), "database unavailable"); n != 1 {
		t.Errorf("MapError repeats the sentinel: %v", pgfence.MapError(unavailable))
	}
}

// The first Exec on a connection prepares its statements in a round trip of
// their own; a context that ends then returns the context's error, like any
// other call made with an ended context, and never a raw pgx preprocessing
// error or an unknown outcome.
func TestExecFirstUseContextEnded(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	issue(t, db.Pool, "r")
	conn, err := pgx.Connect(testContext(t), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	ended, cancel := context.WithCancel(testContext(t))
	cancel()
	_, first := pgfence.Exec(ended, conn, pgfence.LeaseOf("r", "", 1), `SELECT 1`)
	if _, err := pgfence.Exec(testContext(t), conn, pgfence.LeaseOf("r", "", 1), `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	_, later := pgfence.Exec(ended, conn, pgfence.LeaseOf("r", "", 1), `SELECT 1`)
	for name, err := range map[string]error{"first use": first, "later use": later} {
		if !errors.Is(err, context.Canceled) || errors.Is(err, pgfence.ErrOutcomeUnknown) || strings.Contains(err.Error(), "preprocessing") {
			t.Errorf("Exec with an ended context, %s: %v, want context.Canceled", name, err)
		}
	}

	// The context ends while the first use's prepare round trip waits for
	// its reply: nothing was executed, so it is the caller's deadline, not an
	// unknown outcome, and not a raw pgx error.
	fresh, p := proxied(t, db)
	p.SetHold(faultproxy.ServerToClient, true)
	deadline, cancel2 := context.WithTimeout(testContext(t), 300*time.Millisecond)
	defer cancel2()
	_, err = pgfence.Exec(deadline, fresh, pgfence.LeaseOf("r", "", 1), `SELECT 2`)
	p.SetHold(faultproxy.ServerToClient, false)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, pgfence.ErrOutcomeUnknown) || strings.Contains(err.Error(), "preprocessing") {
		t.Errorf("Exec whose context ended during the first prepare: %v, want context.DeadlineExceeded", err)
	}
}
