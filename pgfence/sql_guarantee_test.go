package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// accepted returns the token accepted for resource (0: none).
func accepted(t testing.TB, db *pgfencetest.Database, resource string) int64 {
	t.Helper()
	var token int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT coalesce(max(token), 0) FROM pgfence.fences WHERE resource = $1`, resource).Scan(&token); err != nil {
		t.Fatal(err)
	}
	return token
}

// rejections counts the recorded rejections of resource.
func rejections(t testing.TB, db *pgfencetest.Database, resource string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgfence.fence_rejections WHERE resource = $1`, resource).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A stale token is refused atomically with the write, through every API
// and driver: fn is not called and the row keeps its value; a write whose
// fn or statement fails after the fence was accepted leaves no accepted
// token behind; a refusal on the helper's own transaction is recorded.
func TestStaleTokenRefused(t *testing.T) { forEach(t, staleTokenRefused) }

func staleTokenRefused(t *testing.T, c connector, db *pgfencetest.Database, f fencer) {
	ctx := testContext(t)
	newKV(t, db.Pool)
	pgfencetest.IssueToken(t, db.Pool, "kv:a", 10)

	r, err := f.write(ctx, pgfence.LeaseOf("kv:a", "", 5), set("five", 5))
	if err != nil || r.Resource != "kv:a" || r.Token != 5 || r.Op == (pgfence.OpID{}) {
		t.Fatalf("write with token 5: %+v, %v", r, err)
	}

	called := false
	_, err = f.write(ctx, pgfence.LeaseOf("kv:a", "", 4), func(ctx context.Context, tx stmts) error {
		called = true
		return set("four", 4)(ctx, tx)
	})
	var stale *pgfence.StaleTokenError
	if !errors.As(err, &stale) || !errors.Is(err, pgfence.ErrStaleToken) || stale.Resource != "kv:a" || stale.Presented != 4 || stale.Accepted != 5 {
		t.Fatalf("write with stale token 4: %v, want a *StaleTokenError (4 < 5)", err)
	}
	if called {
		t.Error("fn ran for a stale token")
	}
	if _, err := f.exec(ctx, pgfence.LeaseOf("kv:a", "", 3), `UPDATE kv SET v = 'three', token = 3 WHERE k = 'a'`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("exec with stale token 3: %v, want ErrStaleToken", err)
	}
	if _, err := f.exec(ctx, pgfence.LeaseOf("kv:a", "", 2), `UPDATE kv SET v = 'two', token = 2 WHERE k = 'a'`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("exec with stale lease token 2: %v, want ErrStaleToken", err)
	}
	if v, token := kvRow(t, db.Pool); v != "five" || token != 5 {
		t.Fatalf("row %q token %d after stale writes, want five/5", v, token)
	}

	// The fence and the write are one: a failure after the fence leaves
	// neither.
	boom := errors.New("boom")
	if _, err := f.write(ctx, pgfence.LeaseOf("kv:a", "", 9), func(ctx context.Context, tx stmts) error {
		if err := set("nine", 9)(ctx, tx); err != nil {
			return err
		}
		return boom
	}); err != boom { //nolint:errorlint // returned unchanged
		t.Fatalf("fn's error: %v, want it unchanged", err)
	}
	if _, err := f.exec(ctx, pgfence.LeaseOf("kv:a", "", 8), `UPDATE kv SET v = 'eight', token = 1 / 0 WHERE k = 'a'`); err == nil {
		t.Fatal("a failing statement was accepted")
	}
	if got := accepted(t, db, "kv:a"); got != 5 {
		t.Fatalf("accepted token %d after failed writes, want 5: the fence outlived its write", got)
	}
	if n, err := f.exec(ctx, pgfence.LeaseOf("kv:a", "", 6), `UPDATE kv SET v = 'six', token = 6 WHERE k = 'a'`); err != nil || n != 1 {
		t.Fatalf("exec with token 6: %d rows, %v", n, err)
	}
	// The rows affected are the statement's, not the fence's (whose SELECT
	// returns one row).
	if n, err := f.exec(ctx, pgfence.LeaseOf("kv:a", "", 6), `UPDATE kv SET v = v WHERE false`); err != nil || n != 0 {
		t.Fatalf("exec of an UPDATE of no row: %d rows, %v", n, err)
	}
	if v, token := kvRow(t, db.Pool); v != "six" || token != 6 {
		t.Fatalf("row %q token %d, want six/6", v, token)
	}

	// Refusals on the helper's own transaction are recorded; inside the
	// caller's they roll back with its work.
	want := 3
	if c.inTx {
		want = 0
	}
	if n := rejections(t, db, "kv:a"); n != want {
		t.Errorf("%d rejections recorded, want %d", n, want)
	}
}

// A lease-checked write is refused as soon as its lease is lost: expired, or
// taken over; the old holder's fenced write is refused once the new holder
// wrote.
func TestLostLeaseRefused(t *testing.T) { forEach(t, lostLeaseRefused) }

func lostLeaseRefused(t *testing.T, c connector, db *pgfencetest.Database, f fencer) {
	ctx := testContext(t)
	newKV(t, db.Pool)
	l := acquire(t, db.Pool, "kv:a")
	if _, err := f.write(ctx, pgfence.Checked(l), set("held", l.Token())); err != nil {
		t.Fatalf("write under a live lease: %v", err)
	}
	if n, err := f.exec(ctx, pgfence.Checked(l), `UPDATE kv SET v = 'exec held' WHERE k = 'a'`); err != nil || n != 1 {
		t.Fatalf("exec under a live lease: %d rows, %v", n, err)
	}

	expire(t, db.Pool, "kv:a")
	called := false
	_, err := f.write(ctx, pgfence.Checked(l), func(ctx context.Context, tx stmts) error {
		called = true
		return set("expired", l.Token())(ctx, tx)
	})
	var lost *pgfence.LeaseLostError
	if !errors.As(err, &lost) || !errors.Is(err, pgfence.ErrLeaseLost) || lost.Reason != "expired" || lost.Key != "kv:a" {
		t.Fatalf("write under an expired lease: %v, want a *LeaseLostError (expired)", err)
	}
	if called {
		t.Error("fn ran under an expired lease")
	}
	if _, err := f.exec(ctx, pgfence.Checked(l), `UPDATE kv SET v = 'exec expired' WHERE k = 'a'`); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("exec under an expired lease: %v, want ErrLeaseLost", err)
	}

	next := acquire(t, db.Pool, "kv:a")
	_, err = f.write(ctx, pgfence.Checked(l), set("taken over", l.Token()))
	if !errors.As(err, &lost) || lost.Reason != "taken_over" || lost.Current != next.Token() {
		t.Fatalf("write under a lease taken over: %v, want a *LeaseLostError (taken_over, token %d)", err, next.Token())
	}
	if v, _ := kvRow(t, db.Pool); v != "exec held" {
		t.Fatalf("row %q after refused writes, want the last held write", v)
	}

	if _, err := f.write(ctx, next, set("next", next.Token())); err != nil {
		t.Fatalf("the new holder's fenced write: %v", err)
	}
	if _, err := f.write(ctx, l, set("old", l.Token())); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("the old holder's fenced write after the new holder's: %v, want ErrStaleToken", err)
	}
	if v, token := kvRow(t, db.Pool); v != "next" || token != next.Token() {
		t.Fatalf("row %q token %d, want the new holder's", v, token)
	}
}

// A token the resource's lease never issued is refused: a made-up one, and
// another key's.
func TestTokenNotIssuedRefused(t *testing.T) {
	forEach(t, func(t *testing.T, c connector, db *pgfencetest.Database, f fencer) {
		ctx := testContext(t)
		newKV(t, db.Pool)
		called := false
		_, err := f.write(ctx, pgfence.LeaseOf("kv:a", "", 5), func(ctx context.Context, tx stmts) error {
			called = true
			return nil
		})
		var notIssued *pgfence.TokenNotIssuedError
		if !errors.As(err, &notIssued) || !errors.Is(err, pgfence.ErrTokenNotIssued) || notIssued.Issued != 0 || notIssued.Presented != 5 {
			t.Fatalf("token of a lease never granted: %v, want a *TokenNotIssuedError", err)
		}
		if called {
			t.Error("fn ran for a token never issued")
		}
		other := acquire(t, db.Pool, "other")
		if _, err := f.write(ctx, pgfence.LeaseOf("kv:a", other.Holder(), other.Token()), set("other's", other.Token())); !errors.Is(err, pgfence.ErrTokenNotIssued) {
			t.Fatalf("another key's token: %v, want ErrTokenNotIssued", err)
		}
		pgfencetest.IssueToken(t, db.Pool, "kv:a", 7)
		if _, err := f.exec(ctx, pgfence.LeaseOf("kv:a", "", 8), `UPDATE kv SET v = 'eight' WHERE k = 'a'`); !errors.As(err, &notIssued) || notIssued.Issued != 7 {
			t.Fatalf("a token above the lease's: %v, want a *TokenNotIssuedError (issued 7)", err)
		}
		if v, _ := kvRow(t, db.Pool); v != "initial" {
			t.Fatalf("row %q after refused writes", v)
		}
		if _, err := f.exec(ctx, pgfence.LeaseOf("kv:a", "", 7), `UPDATE kv SET v = 'seven' WHERE k = 'a'`); err != nil {
			t.Fatalf("the lease's own token: %v", err)
		}
	})
}

// A COMMIT whose answer is lost is an unknown outcome, never "unavailable",
// whichever driver sent it (lib/pq reports driver.ErrBadConn then) and
// however the connection failed: closed, or answered by a pooler's FATAL
// 08P01 (PgBouncer's "server conn crashed?"); Resolve settles it: applied
// when the server committed, not applied when the COMMIT never arrived. The
// same FATAL before anything that could commit was sent is "unavailable".
func TestUnknownOutcomeResolved(t *testing.T) {
	for _, c := range connectors {
		if c.inTx {
			continue // the COMMIT is the caller's
		}
		for _, fatal := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/pooler-fatal=%v", c.name, fatal), func(t *testing.T) {
				t.Parallel()
				unknownOutcomeResolved(t, c, fatal)
			})
		}
	}
}

func unknownOutcomeResolved(t *testing.T, c connector, fatal bool) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	newKV(t, db.Pool)
	pgfencetest.IssueToken(t, db.Pool, "kv:a", 100)
	url, p := proxiedURL(t, db)
	p.SetPoolerFatal(fatal)
	f := c.open(t, url)
	resolve := func(what string, err error, want pgfence.Outcome) {
		t.Helper()
		var unknown *pgfence.OutcomeUnknownError
		if !errors.As(err, &unknown) || !errors.Is(err, pgfence.ErrOutcomeUnknown) || errors.Is(err, pgfence.ErrUnavailable) {
			t.Fatalf("%s: %v, want an *OutcomeUnknownError", what, err)
		}
		o, err := f.resolve(ctx, unknown)
		if err != nil || o != want {
			t.Fatalf("%s: resolved %v, %v; want %v", what, o, err, want)
		}
	}

	trig := p.CutAfter(faultproxy.IsCommit)
	_, err := f.write(ctx, pgfence.LeaseOf("kv:a", "", 10), set("lost reply", 10))
	<-trig.Done()
	if !trig.Fired() || !trig.Replied() {
		t.Fatalf("the proxy did not forward COMMIT and drop its answer (fired %v, replied %v)", trig.Fired(), trig.Replied())
	}
	resolve("write, reply to COMMIT lost", err, pgfence.Applied)
	if v, _ := kvRow(t, db.Pool); v != "lost reply" {
		t.Fatalf("row %q, want the committed write", v)
	}

	trig = p.CutBefore(faultproxy.IsCommit)
	_, err = f.write(ctx, pgfence.LeaseOf("kv:a", "", 11), set("lost commit", 11))
	<-trig.Done()
	resolve("write, COMMIT lost", err, pgfence.NotApplied)
	if v, _ := kvRow(t, db.Pool); v != "lost reply" {
		t.Fatalf("row %q after a lost COMMIT", v)
	}

	// Exec: committed at its Sync where it is one pipeline (pgx's
	// drivers), else at its COMMIT (lib/pq).
	match := faultproxy.IsCommit
	if c.pipeline {
		match = faultproxy.SQLContains("UPDATE kv")
	}
	trig = p.CutAfter(match)
	_, err = f.exec(ctx, pgfence.LeaseOf("kv:a", "", 12), `UPDATE kv SET v = 'exec', token = 12 WHERE k = 'a'`)
	<-trig.Done()
	resolve("exec, reply lost", err, pgfence.Applied)
	if v, token := kvRow(t, db.Pool); v != "exec" || token != 12 {
		t.Fatalf("row %q token %d, want the committed exec", v, token)
	}

	// The fence statement lost inside the write's transaction:
	// nothing could commit.
	trig = p.CutBefore(faultproxy.SQLContains("pgfence.fence"))
	_, err = f.write(ctx, pgfence.LeaseOf("kv:a", "", 13), set("lost fence", 13))
	<-trig.Done()
	if !trig.Fired() || !errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("write whose fence was lost (cut %v): %v, want ErrUnavailable", trig.Fired(), err)
	}
	if v, token := kvRow(t, db.Pool); v != "exec" || token != 12 {
		t.Fatalf("row %q token %d after a write whose fence was lost", v, token)
	}
}

// fn must leave COMMIT and ROLLBACK to the helper. When it ends the
// transaction itself, with the driver's API or as SQL, the helper cannot know
// what committed and says so: an unknown outcome (and ErrInvalid where it can
// tell why), never success.
func TestFnEndsTransaction(t *testing.T) {
	forEach(t, func(t *testing.T, c connector, db *pgfencetest.Database, f fencer) {
		ctx := testContext(t)
		newKV(t, db.Pool)
		pgfencetest.IssueToken(t, db.Pool, "kv:a", 100)
		_, err := f.write(ctx, pgfence.LeaseOf("kv:a", "", 5), func(ctx context.Context, tx stmts) error {
			return tx.exec(ctx, `ROLLBACK`)
		})
		if !errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Fatalf("fn sent ROLLBACK: %v, want ErrOutcomeUnknown", err)
		}
		if c.driver != "lib/pq" || c.inTx {
			// lib/pq's own COMMIT refuses a connection outside a
			// transaction without saying why.
			if !errors.Is(err, pgfence.ErrInvalid) {
				t.Errorf("fn sent ROLLBACK: %v, want ErrInvalid too", err)
			}
		}
		// Rolling back what fn already ended is no failure of its own.
		if strings.Contains(err.Error(), "rollback:") {
			t.Errorf("fn sent ROLLBACK: %v, want no rollback error joined to it", err)
		}
		if v, _ := kvRow(t, db.Pool); v != "initial" {
			t.Fatalf("row %q", v)
		}
	})
}
