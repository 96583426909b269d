package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// expireLease moves the key's lease into the past (database clock), as if
// its owner had stopped heartbeating long ago.
func expireLease(t testing.TB, pool *pgxpool.Pool, key string) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), `UPDATE pgfence.idempotency_keys
   SET created_at = clock_timestamp() - interval '1 hour', lease_expires_at = clock_timestamp() - interval '1 second'
 WHERE key = $1 AND status = 'in_progress'`, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("expire lease of %s: %v, %d rows", key, err, tag.RowsAffected())
	}
}

func claimNew(t testing.TB, store *idempotency.Store, pool *pgxpool.Pool, req idempotency.Request) *idempotency.Attempt {
	t.Helper()
	out, err := store.Claim(context.Background(), pool, req)
	if err != nil || out.Replayed || out.Attempt == nil {
		t.Fatalf("claim %s: %+v, %v", req.Key, out, err)
	}
	return out.Attempt
}

// TestLeasedCrashedOwnerTakenOverResumes: an owner records a recovery point
// after the external call, then "crashes" (never returns). A retry during its
// lease is told in progress; after the lease expires (database clock) the
// retry takes over, resumes from the recovery point with the same derived key,
// and the crashed owner's late completion is refused.
func TestLeasedCrashedOwnerTakenOverResumes(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	store := newStore(t, &idempotency.Config{Lease: time.Minute})
	req := idempotency.Request{Scope: "payments", Key: "order-1:capture", Payload: []byte(`{"amount":100}`)}

	crashed := claimNew(t, store, pool, req)
	if crashed.Epoch() != 1 || crashed.RecoveryPoint() != "" {
		t.Fatalf("first claim: epoch %d, point %q", crashed.Epoch(), crashed.RecoveryPoint())
	}
	if time.Until(crashed.TrustedUntil()) <= 0 {
		t.Fatal("trust window already over")
	}
	providerKey := crashed.DerivedKey("provider")
	if err := crashed.Advance(ctx, "charged", []byte("ch_123")); err != nil {
		t.Fatal(err)
	}

	out, err := store.Claim(ctx, pool, req)
	var ip *idempotency.InProgressError
	if !errors.As(err, &ip) || out != nil {
		t.Fatalf("claim during lease: %+v, %v; want in progress", out, err)
	}
	if ip.RetryAfter < 50*time.Second || ip.RetryAfter > time.Minute {
		t.Fatalf("retry after %v, want about the remaining minute of lease", ip.RetryAfter)
	}

	expireLease(t, pool, req.Key)
	next := claimNew(t, store, pool, req)
	if next.Epoch() != 2 || next.Owner() == crashed.Owner() {
		t.Fatalf("takeover: epoch %d, owner %s (old %s)", next.Epoch(), next.Owner(), crashed.Owner())
	}
	if next.RecoveryPoint() != "charged" || string(next.RecoveryData()) != "ch_123" {
		t.Fatalf("takeover resumes from %q %q, want charged ch_123", next.RecoveryPoint(), next.RecoveryData())
	}
	if next.DerivedKey("provider") != providerKey {
		t.Fatalf("derived key changed across attempts: %q vs %q", next.DerivedKey("provider"), providerKey)
	}

	// The crashed owner wakes up: every write of it is refused.
	if _, err := crashed.Complete(ctx, []byte("late")); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("late complete: %v, want ErrLeaseLost", err)
	}
	if err := crashed.Heartbeat(ctx); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("late heartbeat: %v, want ErrLeaseLost", err)
	}
	if err := crashed.Advance(ctx, "other", nil); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("late advance: %v, want ErrLeaseLost", err)
	}
	if _, err := crashed.Fail(ctx, &idempotency.Failure{Code: "x"}); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("late fail: %v, want ErrLeaseLost", err)
	}
	if err := crashed.Release(ctx); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("late release: %v, want ErrLeaseLost", err)
	}

	if err := next.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := next.Complete(ctx, []byte("receipt-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Complete(ctx, []byte("late")); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("late complete after completion: %v, want ErrLeaseLost", err)
	}
	out, err = store.Claim(ctx, pool, req)
	if err != nil || !out.Replayed || string(out.Result) != "receipt-1" || out.ExpiresAt.IsZero() {
		t.Fatalf("replay: %+v, %v", out, err)
	}
	// Completing twice is refused too: the key has no owner any more.
	if _, err := next.Complete(ctx, []byte("again")); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("second complete: %v, want ErrLeaseLost", err)
	}
}

// TestLeasedTakeoverRace: many attempts race for an expired lease; exactly one
// becomes the owner.
func TestLeasedTakeoverRace(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "payments", Key: "order-2:capture"}
	claimNew(t, store, pool, req)
	expireLease(t, pool, req.Key)

	var wg sync.WaitGroup
	var mu sync.Mutex
	owners, inProgress := 0, 0
	for range 16 {
		wg.Go(func() {
			out, err := store.Claim(ctx, pool, req)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && !out.Replayed:
				owners++
			case errors.Is(err, idempotency.ErrInProgress):
				inProgress++
			default:
				t.Errorf("claim: %+v, %v", out, err)
			}
		})
	}
	wg.Wait()
	if owners != 1 || inProgress != 15 {
		t.Fatalf("%d owners, %d in progress; want 1 and 15", owners, inProgress)
	}
}

func TestLeasedReleaseKeepsRecoveryPoint(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "mail", Key: "welcome:user-7"}
	a := claimNew(t, store, pool, req)
	if err := a.Advance(ctx, "rendered", []byte("<html>")); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil { // transient SMTP error
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.idempotency_keys WHERE result IS NOT NULL OR failure_code IS NOT NULL`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a release stored a result: %d rows, %v", n, err)
	}
	// The next attempt takes over at once, no lease to wait for.
	b := claimNew(t, store, pool, req)
	if b.RecoveryPoint() != "rendered" || string(b.RecoveryData()) != "<html>" || b.Epoch() != 2 {
		t.Fatalf("after release: point %q data %q epoch %d", b.RecoveryPoint(), b.RecoveryData(), b.Epoch())
	}
	if err := a.Heartbeat(ctx); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("released owner's heartbeat: %v, want ErrLeaseLost", err)
	}
}

func TestLeasedPermanentFailureReplayed(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "devices", Key: "dev-1:reboot", Payload: []byte("now")}
	a := claimNew(t, store, pool, req)
	if _, err := a.Fail(ctx, &idempotency.Failure{Code: "device_unknown", Message: "no such device", Data: []byte("404")}); err != nil {
		t.Fatal(err)
	}
	out, err := store.Claim(ctx, pool, req)
	if err != nil || !out.Replayed || out.Failure == nil || out.Failure.Code != "device_unknown" ||
		out.Failure.Message != "no such device" || string(out.Failure.Data) != "404" || out.Result != nil {
		t.Fatalf("replay: %+v, %v", out, err)
	}
	// Atomic mode sees the same stored answer for the key.
	if out, err := store.Do(ctx, pool, req, func(context.Context, pgx.Tx) ([]byte, error) {
		t.Error("fn ran for a stored failure")
		return nil, nil
	}); err != nil || out.Failure == nil {
		t.Fatalf("atomic view: %+v, %v", out, err)
	}
}

func TestLeasedMismatchNeverShowsResult(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "payments", Key: "order-3:capture", Payload: []byte("100")}
	a := claimNew(t, store, pool, req)
	other := req
	other.Payload = []byte("999")
	// Refused while in progress ...
	if out, err := store.Claim(ctx, pool, other); !errors.Is(err, idempotency.ErrMismatch) || out != nil {
		t.Fatalf("mismatch in progress: %+v, %v", out, err)
	}
	// ... after the lease expired (no takeover with another payload) ...
	expireLease(t, pool, req.Key)
	if _, err := store.Claim(ctx, pool, other); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("mismatch after lease: %v", err)
	}
	if _, err := a.Complete(ctx, []byte("secret receipt")); err != nil {
		t.Fatal(err)
	}
	// ... and after completion, without the stored result.
	out, err := store.Claim(ctx, pool, other)
	if !errors.Is(err, idempotency.ErrMismatch) || out != nil {
		t.Fatalf("mismatch after completion: %+v, %v", out, err)
	}
}

// TestLeasedSQLFunctions: clients in other languages call the SQL functions
// and branch on SQLSTATEs.
func TestLeasedSQLFunctions(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	var outcome, owner string
	if err := pool.QueryRow(ctx, `SELECT outcome, owner::text FROM pgfence.idempotency_claim('s', 'k', sha256('a'), '1 minute', '1 day')`).Scan(&outcome, &owner); err != nil || outcome != "new" {
		t.Fatalf("claim: %q %v", outcome, err)
	}
	wantCode := func(name, code, sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		if pgerr.Code(err) != code {
			t.Fatalf("%s: %v, want SQLSTATE %s", name, err, code)
		}
		t.Logf("%s: %v", name, pgerr.PgError(err).Message)
	}
	wantCode("in progress", pgerr.CodeKeyInProgress, `SELECT * FROM pgfence.idempotency_claim('s', 'k', sha256('a'), '1 minute', '1 day')`)
	wantCode("mismatch", pgerr.CodeKeyMismatch, `SELECT * FROM pgfence.idempotency_claim('s', 'k', sha256('b'), '1 minute', '1 day')`)
	wantCode("not owner", pgerr.CodeLeaseNotHeld, `SELECT pgfence.idempotency_complete('s', 'k', gen_random_uuid(), 'x')`)
	wantCode("bad lease", pgerr.CodeInvalid, `SELECT * FROM pgfence.idempotency_claim('s', 'k2', sha256('a'), '0', '1 day')`)
	wantCode("bad fingerprint", pgerr.CodeInvalid, `SELECT * FROM pgfence.idempotency_claim('s', 'k2', 'short', '1 minute', '1 day')`)
	wantCode("bad wait", pgerr.CodeInvalid, `SELECT * FROM pgfence.idempotency_claim('s', 'k2', sha256('a'), '1 minute', '1 day', '0')`)
	wantCode("wait beyond lock_timeout", pgerr.CodeInvalid, `SELECT * FROM pgfence.idempotency_claim('s', 'k2', sha256('a'), '1 minute', '1 day', '25 days')`)
	wantCode("isolation", pgerr.CodeIsolation, `BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT * FROM pgfence.idempotency_claim('s', 'k3', sha256('a'), '1 minute', '1 day'); COMMIT`)
	if _, err := pool.Exec(ctx, `SELECT pgfence.idempotency_complete('s', 'k', $1::uuid, 'done')`, owner); err != nil {
		t.Fatal(err)
	}
	var result []byte
	if err := pool.QueryRow(ctx, `SELECT outcome, result FROM pgfence.idempotency_claim('s', 'k', sha256('a'), '1 minute', '1 day')`).Scan(&outcome, &result); err != nil ||
		outcome != "replayed" || string(result) != "done" {
		t.Fatalf("replay: %q %q %v", outcome, result, err)
	}
}

func TestLeasedCompleteTxWithBusinessWrite(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "payments", Key: "order-4:capture"}
	a := claimNew(t, store, pool, req)

	// Rolled back: neither the business row nor the result.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ('order-4', 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CompleteTx(ctx, tx, []byte("r")); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if out, err := store.Claim(ctx, pool, req); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("after rollback: %+v, %v; want still in progress", out, err)
	}
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ('order-4', 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CompleteTx(ctx, tx, []byte("r")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := store.Claim(ctx, pool, req); err != nil || !out.Replayed || countCharges(t, pool, "order-4") != 1 {
		t.Fatalf("after commit: %+v, %v", out, err)
	}
}

// TestRetryAfterOfLeaseLongerThanDuration: the claim functions refuse a lease
// above 24 hours (PF008), but a row written by hand (by the schema's owner)
// may carry a lease longer than a time.Duration holds; the retry hint of
// Claim and Do saturates instead of wrapping around to a negative duration.
func TestRetryAfterOfLeaseLongerThanDuration(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "long", Key: "k", Payload: []byte("p")}
	_, err := pool.Exec(ctx, `SELECT pgfence.idempotency_claim($1, $2, $3, '1000 years', '1 day')`,
		req.Scope, req.Key, idempotency.Fingerprint(req.Payload))
	if pgerr.Code(err) != "PF008" {
		t.Fatalf("a claim with a 1000-year lease: %v, want PF008", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pgfence.idempotency_claim($1, $2, $3, '1 hour', '1 day')`,
		req.Scope, req.Key, idempotency.Fingerprint(req.Payload)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgfence.idempotency_keys SET lease_expires_at = clock_timestamp() + interval '1000 years'
WHERE scope = $1 AND key = $2`, req.Scope, req.Key); err != nil {
		t.Fatal(err)
	}
	var ip *idempotency.InProgressError
	_, err = store.Claim(ctx, pool, req)
	if !errors.As(err, &ip) || ip.RetryAfter != math.MaxInt64 {
		t.Errorf("Claim: %v; want in progress, retry after %v", err, time.Duration(math.MaxInt64))
	}
	_, err = store.Do(ctx, pool, req, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
	if !errors.As(err, &ip) || ip.RetryAfter != math.MaxInt64 {
		t.Errorf("Do: %v; want in progress, retry after %v", err, time.Duration(math.MaxInt64))
	}
}

// TestDerivedKeysOfDifferentIntentsDiffer: a derived key is handed to a
// downstream system (a payment provider) that deduplicates on it alone. Two
// intents must never share one: not the same key in two scopes (the HTTP
// middleware scopes a client's Idempotency-Key by principal, so two
// customers sending "1" are two intents; idemhttp tests that too), and not a key and step that only
// concatenate alike. Otherwise the provider answers the second customer's
// charge with the first one's.
func TestDerivedKeysOfDifferentIntentsDiffer(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	store := newStore(t, nil)
	type derived struct {
		scope, key, step string
	}
	seen := map[string]derived{}
	attempts := map[[2]string]*idempotency.Attempt{}
	for _, d := range []derived{
		{"payments/tenant-a", "1", "charge"},
		{"payments/tenant-b", "1", "charge"},
		{"payments/tenant-a", "1:charge", "x"},
		{"payments/tenant-a", "1", "charge:x"},
		{"a:b", "c", "s"},
		{"a", "b:c", "s"},
	} {
		a := attempts[[2]string{d.scope, d.key}]
		if a == nil {
			a = claimNew(t, store, pool, idempotency.Request{Scope: d.scope, Key: d.key})
			attempts[[2]string{d.scope, d.key}] = a
		}
		k := a.DerivedKey(d.step)
		if other, ok := seen[k]; ok {
			t.Errorf("%+v and %+v share the derived key %q", d, other, k)
		}
		seen[k] = d
		if k2 := a.DerivedKey(d.step); k2 != k {
			t.Errorf("%+v: derived key not stable: %q, %q", d, k, k2)
		}
	}
}

// TestLeasedClaimOnRepeatableReadDefault: a database (or role) whose
// sessions default to REPEATABLE READ. The claim needs READ COMMITTED; on a
// pool the caller has no transaction to change, so Claim must not refuse
// with ErrIsolation (Do runs its own READ COMMITTED transaction too).
func TestLeasedClaimOnRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "payments", Key: "rr", Payload: []byte("p")}
	out, err := store.Claim(ctx, pool, req)
	if err != nil || out.Replayed {
		t.Fatalf("claim: %+v, %v; want New", out, err)
	}
	if out, err := store.Claim(ctx, pool, req); !errors.Is(err, idempotency.ErrInProgress) || out != nil {
		t.Fatalf("duplicate: %+v, %v; want InProgress", out, err)
	}
	if _, err := store.Claim(ctx, pool, idempotency.Request{Scope: "payments", Key: "rr", Payload: []byte("q")}); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("other payload: %v; want ErrMismatch", err)
	}
	if _, err := out.Attempt.Complete(ctx, []byte("done")); err != nil {
		t.Fatal(err)
	}
	if out, err := store.Claim(ctx, pool, req); err != nil || !out.Replayed || string(out.Result) != "done" {
		t.Fatalf("replay: %+v, %v", out, err)
	}
}

// TestLeasedClaimWaitsBoundedForLockedRow: the owner completes inside its
// own business transaction just after its lease ran out; until that commits
// it holds the key's row locked. A duplicate's claim waits for that lock at
// most Config.WaitTimeout and reports in progress, instead of blocking for
// as long as the owner's transaction lasts (the middleware answered 500).
func TestLeasedClaimWaitsBoundedForLockedRow(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	store := newStore(t, &idempotency.Config{WaitTimeout: 200 * time.Millisecond, RetryAfter: 3 * time.Second})
	req := idempotency.Request{Scope: "payments", Key: "order-9:capture"}
	a := claimNew(t, store, pool, req)
	expireLease(t, pool, req.Key)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := a.CompleteTx(ctx, tx, []byte("r")); err != nil {
		t.Fatal(err)
	}
	out, err := store.Claim(ctx, pool, req)
	var ip *idempotency.InProgressError
	if !errors.As(err, &ip) || out != nil {
		t.Fatalf("claim while the owner's completion is uncommitted: %+v, %v; want in progress", out, err)
	}
	// The lease is already over: the hint is the configured one, not 0.
	if ip.RetryAfter != 3*time.Second {
		t.Errorf("RetryAfter = %v, want the configured 3s", ip.RetryAfter)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := store.Claim(ctx, pool, req); err != nil || !out.Replayed {
		t.Fatalf("claim after the owner committed: %+v, %v; want Replayed", out, err)
	}
}

// TestAdvanceTxCommitsWithThePhase: the recovery point of AdvanceTx and the
// phase's business write commit together: a rolled-back phase leaves the
// previous point and no write, a committed one both.
func TestAdvanceTxCommitsWithThePhase(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "payments", Key: "order-5:capture"}
	a := claimNew(t, store, pool, req)
	phase := func(commit bool) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := charge("order-5", 5)(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if err := a.AdvanceTx(ctx, tx, "charged", []byte("ch_1")); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	point := func() string {
		t.Helper()
		var p string
		if err := pool.QueryRow(ctx, `SELECT recovery_point FROM pgfence.idempotency_keys WHERE key = $1`, req.Key).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	phase(false)
	if p, n := point(), countCharges(t, pool, "order-5"); p != "" || n != 0 {
		t.Fatalf("rolled-back phase: point %q, %d charges; want neither", p, n)
	}
	phase(true)
	if p, n := point(), countCharges(t, pool, "order-5"); p != "charged" || n != 1 {
		t.Fatalf("committed phase: point %q, %d charges; want both", p, n)
	}
	// A takeover resumes from it.
	expireLease(t, pool, req.Key)
	b := claimNew(t, store, pool, req)
	if b.RecoveryPoint() != "charged" || string(b.RecoveryData()) != "ch_1" {
		t.Fatalf("takeover at %q %q", b.RecoveryPoint(), b.RecoveryData())
	}
}

// TestAdvanceTxFencedByOwner: only the current owner can advance. After a
// takeover the replaced owner's AdvanceTx returns ErrLeaseLost and its
// transaction cannot commit the phase's write. While an owner's AdvanceTx
// is uncommitted, its row lock holds a takeover back, and the commit
// extends the lease, so the takeover finds the key in progress.
func TestAdvanceTxFencedByOwner(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, &idempotency.Config{WaitTimeout: 100 * time.Millisecond, Lease: time.Minute})
	req := idempotency.Request{Scope: "payments", Key: "order-6:capture"}
	old := claimNew(t, store, pool, req)
	expireLease(t, pool, req.Key)

	// The owner advances after its lease ran out, before anyone took over:
	// it still owns the key, and its open transaction holds takeovers back.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.AdvanceTx(ctx, tx, "charged", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, pool, req); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("takeover while the advance is uncommitted: %v, want ErrInProgress", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, pool, req); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("takeover after the advance committed: %v, want ErrInProgress (the lease was extended)", err)
	}

	expireLease(t, pool, req.Key)
	claimNew(t, store, pool, req) // the takeover
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := charge("order-6", 6)(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := old.AdvanceTx(ctx, tx, "recorded", nil); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("the replaced owner's AdvanceTx: %v, want ErrLeaseLost", err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("commit after the refused advance: %v, want a rollback", err)
	}
	if n := countCharges(t, pool, "order-6"); n != 0 {
		t.Fatalf("%d charges from the replaced owner's phase", n)
	}
}

// A leased call that the pool gives no connection sent nothing: with the
// context already ended it reports the context's error, on a closed pool
// ErrUnavailable, never ErrOutcomeUnknown (which says a change may have
// been made).
func TestLeasedCallsThatSendNothing(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "orders", Key: "nothing-sent"}
	out, err := store.Claim(ctx, pool, req)
	if err != nil || out.Attempt == nil {
		t.Fatalf("Claim: %+v, %v", out, err)
	}
	a := out.Attempt
	ended, cancel := context.WithCancel(ctx)
	cancel()
	calls := func(ctx context.Context) map[string]error {
		_, complete := a.Complete(ctx, []byte("r"))
		_, fail := a.Fail(ctx, &idempotency.Failure{Code: "c"})
		_, claim := store.Claim(ctx, pool, idempotency.Request{Scope: "orders", Key: "nothing-sent-2"})
		_, gc := gcStore.GC(ctx, pool, nil)
		return map[string]error{
			"Claim": claim, "Heartbeat": a.Heartbeat(ctx), "Advance": a.Advance(ctx, "p", nil),
			"Complete": complete, "Fail": fail, "Release": a.Release(ctx), "GC": gc,
		}
	}
	for name, err := range calls(ended) {
		if !errors.Is(err, context.Canceled) || errors.Is(err, idempotency.ErrOutcomeUnknown) {
			t.Errorf("%s with an ended context: %v, want context.Canceled and not ErrOutcomeUnknown", name, err)
		}
	}
	pool.Close()
	for name, err := range calls(ctx) {
		if !errors.Is(err, idempotency.ErrUnavailable) || errors.Is(err, idempotency.ErrOutcomeUnknown) {
			t.Errorf("%s on a closed pool: %v, want ErrUnavailable and not ErrOutcomeUnknown", name, err)
		}
	}
}

// An attempt claimed on one connection is safe for concurrent use, as
// documented: a heartbeat goroutine next to the work's Advance calls takes
// turns on the connection instead of sending on it at the same time.
func TestAttemptOnOneConnectionTakesTurns(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	store := newStore(t, nil)
	out, err := store.Claim(ctx, conn, idempotency.Request{Scope: "orders", Key: "one-conn"})
	if err != nil || out.Attempt == nil {
		t.Fatalf("Claim: %+v, %v", out, err)
	}
	a := out.Attempt
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	wg.Go(func() {
		for range 50 {
			errs <- a.Heartbeat(ctx)
		}
	})
	wg.Go(func() {
		for i := range 50 {
			errs <- a.Advance(ctx, fmt.Sprintf("step %d", i), nil)
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent calls on one connection: %v", err)
		}
	}
	if _, err := a.Complete(ctx, []byte("done")); err != nil {
		t.Fatal(err)
	}
}
