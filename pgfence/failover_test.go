package pgfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestFailover promotes a standby and checks that no token issued afterwards
// is at or below one issued before -- including, in async mode, a grant the
// old primary acknowledged but never replicated -- and that a standby issues
// no tokens and accepts no fences while in recovery.
func TestFailover(t *testing.T) {
	for _, sync := range []bool{false, true} {
		name := map[bool]string{false: "async", true: "sync"}[sync]
		t.Run(name, func(t *testing.T) { testFailover(t, sync) })
	}
}

func testFailover(t *testing.T, sync bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	primary := db.Pool
	mustExec(t, primary, `CREATE TABLE doc (resource text PRIMARY KEY, body text NOT NULL, token bigint NOT NULL)`)
	fencedWrite := func(pool *pgxpool.Pool, token int64, body string) error {
		_, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("doc:1", "", token),
			`INSERT INTO doc VALUES ('doc:1', $1, $2) ON CONFLICT (resource) DO UPDATE SET body = excluded.body, token = excluded.token`, body, token)
		return err
	}

	l1 := grant(t, primary, "doc:1")
	if err := fencedWrite(primary, l1.Token, "first"); err != nil {
		t.Fatal(err)
	}
	standby, err := pgcluster.At(cluster.Addr()).StartStandby(ctx, &pgcluster.StandbyConfig{Sync: sync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	if err := pgcluster.At(cluster.Addr()).WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}

	// In recovery: no token, no fence.
	replica, err := pgx.Connect(ctx, standby.ConnString(db.Name))
	if err != nil {
		t.Fatal(err)
	}
	_, err = replica.Exec(ctx, `SELECT pgfence.next_token(NULL)`)
	if sqlstate(err) != "PF005" || !errors.Is(pgfence.MapError(err), pgfence.ErrNotPrimary) {
		t.Fatalf("next_token on a standby: want PF005/ErrNotPrimary, got %v", err)
	}
	if _, err := pgfence.Exec(ctx, replica, pgfence.LeaseOf("doc:1", "", l1.Token+100), `SELECT 1`); !errors.Is(err, pgfence.ErrNotPrimary) {
		t.Fatalf("fence on a standby: want ErrNotPrimary, got %v", err)
	}
	if _, err := replica.Exec(ctx, grantSQL, "job2", newHolder(), "30 seconds"); !errors.Is(pgfence.MapError(err), pgfence.ErrNotPrimary) {
		t.Fatalf("grant on a standby: want ErrNotPrimary, got %v", err)
	}
	_ = replica.Close(ctx)

	if !sync {
		// The standby falls behind: the next grant is acknowledged by the old
		// primary and never reaches it.
		if err := standby.Stop(pgcluster.Fast); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(t, primary, expireSQL, "doc:1")
	l2 := grant(t, primary, "doc:1") // sync: returns only after the standby has it
	if l2.Token <= l1.Token {
		t.Fatalf("grant token %d not above %d", l2.Token, l1.Token)
	}
	if err := fencedWrite(primary, l2.Token, "second"); err != nil {
		t.Fatal(err)
	}
	primary.Close()
	if err := cluster.Kill(); err != nil {
		t.Fatal(err)
	}
	if !sync {
		if err := standby.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}

	promoted, err := pgxpool.New(ctx, standby.ConnString(db.Name))
	if err != nil {
		t.Fatal(err)
	}
	defer promoted.Close()
	var leaseToken, fenceToken int64
	if err := promoted.QueryRow(ctx, `SELECT l.token, f.token FROM pgfence.leases l, pgfence.fences f WHERE l.key = 'doc:1' AND f.resource = 'doc:1'`).Scan(&leaseToken, &fenceToken); err != nil {
		t.Fatal(err)
	}
	want := l2.Token
	if !sync {
		want = l1.Token // the second grant was lost with the old primary
	}
	if leaseToken != want || fenceToken != want {
		t.Fatalf("promoted standby has lease token %d, fence token %d; want %d (tokens before: %d, %d)", leaseToken, fenceToken, want, l1.Token, l2.Token)
	}

	// Every token issued now is above every token issued before the failover.
	mustExec(t, promoted, expireSQL, "doc:1")
	l3 := grant(t, promoted, "doc:1")
	var fresh int64
	if err := promoted.QueryRow(ctx, `SELECT pgfence.next_token(NULL)`).Scan(&fresh); err != nil {
		t.Fatal(err)
	}
	t.Logf("tokens: before %#x %#x, after promotion %#x, fresh %#x", l1.Token, l2.Token, l3.Token, fresh)
	if l3.Token <= l2.Token || fresh <= l2.Token {
		t.Fatalf("after promotion: grant %d, fresh %d; not above %d issued before", l3.Token, fresh, l2.Token)
	}
	if err := fencedWrite(promoted, l3.Token, "third"); err != nil {
		t.Fatal(err)
	}
	// The old holders are fenced out, including the one whose grant was lost.
	for _, old := range []int64{l1.Token, l2.Token} {
		var st *pgfence.StaleTokenError
		if err := fencedWrite(promoted, old, "old"); !errors.As(err, &st) || st.Accepted != l3.Token {
			t.Fatalf("write with pre-failover token %d: want stale, got %v", old, err)
		}
	}
	var body string
	if err := promoted.QueryRow(ctx, `SELECT body FROM doc WHERE resource = 'doc:1'`).Scan(&body); err != nil || body != "third" {
		t.Fatalf("final row %q %v", body, err)
	}
}
