package pgfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// After an asynchronous failover, a grant the old primary acknowledged but
// never replicated is unknown to the new primary. Its holder's token is
// refused there (PF012: the lease has not issued it), also before anyone
// else has written the resource on the new primary, where a token-only check
// alone (nothing higher accepted yet) would still let it in; its
// lease-checked writes are refused too.
func TestLostGrantAfterFailoverIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	primary := db.Pool
	mustExec(t, primary, `CREATE TABLE doc (id text PRIMARY KEY, body text NOT NULL)`)
	write := func(pool *pgxpool.Pool, l leaseRow, body string) error {
		_, err := pgfence.Exec(ctx, pool, l.lease(), `INSERT INTO doc VALUES ('1', $1) ON CONFLICT (id) DO UPDATE SET body = excluded.body`, body)
		return err
	}
	l1 := grant(t, primary, "doc:1")
	if err := write(primary, l1, "first"); err != nil {
		t.Fatal(err)
	}
	standby, err := pgcluster.At(cluster.Addr()).StartStandby(ctx, &pgcluster.StandbyConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	if err := pgcluster.At(cluster.Addr()).WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}
	if err := standby.Stop(pgcluster.Fast); err != nil { // falls behind
		t.Fatal(err)
	}
	mustExec(t, primary, expireSQL, "doc:1")
	lost := grant(t, primary, "doc:1") // acknowledged, never replicated
	primary.Close()
	if err := cluster.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted, err := pgxpool.New(ctx, standby.ConnString(db.Name))
	if err != nil {
		t.Fatal(err)
	}
	defer promoted.Close()

	var notIssued *pgfence.TokenNotIssuedError
	if err := write(promoted, lost, "by the lost grant's holder"); !errors.As(err, &notIssued) || notIssued.Issued != l1.Token {
		t.Fatalf("fenced write with the lost grant's token: %v, want *TokenNotIssuedError (issued %d)", err, l1.Token)
	}
	if _, err := pgfence.Exec(ctx, promoted, pgfence.Checked(lost.lease()), `SELECT 1`); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("lease-checked write of the lost grant: %v, want ErrLeaseLost", err)
	}
	var body string
	if err := promoted.QueryRow(ctx, `SELECT body FROM doc WHERE id = '1'`).Scan(&body); err != nil || body != "first" {
		t.Fatalf("row %q %v", body, err)
	}
	// The key's next holder on the new timeline writes.
	mustExec(t, promoted, expireSQL, "doc:1")
	l3 := grant(t, promoted, "doc:1")
	if l3.Token <= lost.Token {
		t.Fatalf("grant after the failover: token %d not above the lost %d", l3.Token, lost.Token)
	}
	if err := write(promoted, l3, "third"); err != nil {
		t.Fatal(err)
	}
}
