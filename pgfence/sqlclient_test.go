package pgfence_test

import (
	"errors"
	"testing"

	"github.com/pgfence/pgfence/internal/testkit/pyclient"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A grant made inside an open transaction (psql and psycopg2 open one before
// the first statement) returns its token before it commits. Another
// connection presenting that token is refused (PF012) while the grant is
// uncommitted and after it rolled back, although the next grant is given the
// same number: one token, one accepted writer. The granting transaction
// itself may write with it: its writes commit or roll back with the grant.
func TestUncommittedGrantTokenIsRefusedFromSQL(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	mustExec(t, db.Pool, `CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL)`)
	mustExec(t, db.Pool, `INSERT INTO stock VALUES ('sku-1', 10)`)
	lines := pyclient.Run(t, db.URL, `
import sys, psycopg2
url = sys.argv[1]
a = psycopg2.connect(url)                      # psycopg2's default: a transaction is open
b = psycopg2.connect(url); b.autocommit = True
ca, cb = a.cursor(), b.cursor()

def write(cur, token, label):
    try:
        cur.execute("BEGIN")
        cur.execute("SELECT pgfence.fence('stock:sku-1', %s)", (token,))
        cur.execute("UPDATE stock SET qty = qty - 1 WHERE sku = 'sku-1'")
        cur.execute("COMMIT")
        print(label, "accepted")
    except psycopg2.Error as e:
        cur.execute("ROLLBACK")
        print(label, e.pgcode)

ca.execute("SELECT acquired, token FROM pgfence.try_acquire('stock:sku-1', interval '30 seconds')")
acquired, token = ca.fetchone()
print("granted", acquired)
write(cb, token, "other-connection-before-commit")
ca.execute("SELECT pgfence.fence('stock:sku-1', %s)", (token,))
ca.execute("UPDATE stock SET qty = qty - 1 WHERE sku = 'sku-1'")
print("own-transaction accepted")
a.rollback()
write(cb, token, "other-connection-after-rollback")
cb.execute("SELECT acquired, token FROM pgfence.try_acquire('stock:sku-1', interval '30 seconds')")
acquired2, token2 = cb.fetchone()
print("regranted-same-number", acquired2 and token2 == token)
write(cb, token2, "new-holder")
cb.execute("SELECT qty FROM stock WHERE sku = 'sku-1'")
print("qty", cb.fetchone()[0])
`)
	want := []string{
		"granted True",
		"other-connection-before-commit PF012",
		"own-transaction accepted",
		"other-connection-after-rollback PF012",
		"regranted-same-number True",
		"new-holder accepted",
		"qty 9",
	}
	if len(lines) != len(want) {
		t.Fatalf("python printed %q, want %q", lines, want)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d: %q, want %q", i, lines[i], want[i])
		}
	}
}

// The same from Go: a token read from an open transaction's grant, presented
// on a pool, is refused as not issued, and never accepted after the grant
// rolled back.
func TestUncommittedGrantTokenIsRefused(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var token int64
	if err := tx.QueryRow(ctx, `SELECT token FROM pgfence.try_acquire('k', interval '30 seconds')`).Scan(&token); err != nil {
		t.Fatal(err)
	}
	_, err = pgfence.Exec(ctx, pool, pgfence.LeaseOf("k", "", token), `SELECT 1`)
	var notIssued *pgfence.TokenNotIssuedError
	if !errors.As(err, &notIssued) || !errors.Is(err, pgfence.ErrTokenNotIssued) || notIssued.Presented != token || notIssued.Resource != "k" {
		t.Fatalf("a token of an uncommitted grant: %v, want *TokenNotIssuedError", err)
	}
	if _, err := pgfence.Exec(ctx, tx, pgfence.LeaseOf("k", "", token), `SELECT 1`); err != nil {
		t.Fatalf("the granting transaction's own write: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("k", "", token), `SELECT 1`); !errors.Is(err, pgfence.ErrTokenNotIssued) {
		t.Fatalf("a token of a rolled-back grant: %v, want ErrTokenNotIssued", err)
	}
	if _, err := pgfence.LookupFence(ctx, pool, "k"); !errors.Is(err, pgfence.ErrNotFound) {
		t.Fatalf("after the refused writes: %v, want nothing accepted", err)
	}
}

// Tokens count per lease key: the token of lease "reports/daily" is refused
// for resource "inventory/sku-42" (it would otherwise lock out that
// resource's own holder, whose tokens are lower), and the resource's own
// holder writes.
func TestAnotherKeysTokenIsRefused(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	reports := grant(t, pool, "reports/daily")
	for range 4 {
		mustExec(t, pool, expireSQL, "reports/daily")
		reports = grant(t, pool, "reports/daily")
	}
	sku := grant(t, pool, "inventory/sku-42")
	if reports.Token <= sku.Token {
		t.Fatalf("the reports lease's token %d is not above the sku's %d: the test needs it higher", reports.Token, sku.Token)
	}
	_, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("inventory/sku-42", "", reports.Token), `SELECT 1`)
	var notIssued *pgfence.TokenNotIssuedError
	if !errors.As(err, &notIssued) || notIssued.Issued != sku.Token {
		t.Fatalf("another key's token: %v, want *TokenNotIssuedError naming issued %d", err, sku.Token)
	}
	if _, err := pgfence.Exec(ctx, pool, sku.lease(), `SELECT 1`); err != nil {
		t.Fatalf("the resource's own holder: %v", err)
	}
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("no-such-lease", "", 1), `SELECT 1`); !errors.As(err, &notIssued) || notIssued.Issued != 0 {
		t.Fatalf("a resource no lease names: %v, want *TokenNotIssuedError with Issued 0", err)
	}
}

// Tokens are bounded everywhere: a token above the largest any grant can
// issue (2^62 + 2^61) is refused by SQL (PF008), whichever client sends
// it, so no write can fence a resource beyond every future holder's reach.
func TestTokenBounds(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	const maxToken = 1<<62 + 1<<61
	pgfencetest.IssueToken(t, pool, "r", maxToken)
	for _, tok := range []int64{maxToken + 1, 9223372036854775807} {
		if _, err := pool.Exec(ctx, `SELECT pgfence.fence('r', $1)`, tok); sqlstate(err) != "PF008" {
			t.Errorf("SQL fence with token %d: %v, want PF008", tok, err)
		}
		if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("r", "", tok), `SELECT 1`); !errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("Exec with token %d: %v, want ErrInvalid", tok, err)
		}
		for _, q := range []string{
			`SELECT pgfence.check_lease('r', gen_random_uuid(), $1)`,
			`SELECT * FROM pgfence.renew('r', gen_random_uuid(), $1, interval '1 minute')`,
			`SELECT * FROM pgfence.release('r', gen_random_uuid(), $1)`,
		} {
			if _, err := pool.Exec(ctx, q, tok); sqlstate(err) != "PF008" {
				t.Errorf("%s with token %d: %v, want PF008", q, tok, err)
			}
		}
	}
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("r", "", maxToken), `SELECT 1`); err != nil {
		t.Errorf("the largest token: %v", err)
	}
}

// A resource fenced higher than its lease will reach again (here by a token
// issued by hand) locks every holder out; an operator lowers it with
// lower_fence, which records who and why. Nothing else may lower it.
func TestLowerFence(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	pgfencetest.IssueToken(t, pool, "r", 1<<50)
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("r", "", 1<<50), `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, expireSQL, "r")
	mustExec(t, pool, `UPDATE pgfence.leases SET token = 5 WHERE key = 'r'`) // as if rebuilt
	l := grant(t, pool, "r")
	if _, err := pgfence.Exec(ctx, pool, l.lease(), `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("holder below the fence: %v, want stale", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgfence.fences SET token = 1 WHERE resource = 'r'`); sqlstate(err) != "PF001" {
		t.Fatalf("lowering by hand: %v, want PF001", err)
	}
	var old int64
	if err := pool.QueryRow(ctx, `SELECT pgfence.lower_fence('r', $1, 'rebuilt the lease table')`, l.Token).Scan(&old); err != nil || old != 1<<50 {
		t.Fatalf("lower_fence: %d, %v", old, err)
	}
	if _, err := pgfence.Exec(ctx, pool, l.lease(), `SELECT 1`); err != nil {
		t.Fatalf("holder after lower_fence: %v", err)
	}
	var reason string
	var from, to int64
	if err := pool.QueryRow(ctx, `SELECT from_token, to_token, reason FROM pgfence.fence_resets WHERE resource = 'r'`).Scan(&from, &to, &reason); err != nil ||
		from != 1<<50 || to != l.Token || reason != "rebuilt the lease table" {
		t.Fatalf("fence_resets: %d %d %q %v", from, to, reason, err)
	}
	for what, args := range map[string][]any{
		"no reason":     {"r", 1, ""},
		"not lower":     {"r", l.Token, "not lower"},
		"no such fence": {"none", 1, "no such fence"},
	} {
		if _, err := pool.Exec(ctx, `SELECT pgfence.lower_fence($1, $2, $3)`, args...); sqlstate(err) != "PF008" {
			t.Errorf("lower_fence, %s: %v, want PF008", what, err)
		}
	}
}
