package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestLimitsMatchSQL checks each Go limit against the SQL functions other
// clients call: the limit itself is accepted, one byte more is refused with
// PF008. Either side changing alone fails here.
func TestLimitsMatchSQL(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	accepts := func(what string, limit int, sql string, arg func(n int) any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, arg(limit)); err != nil {
			t.Errorf("%s of %d bytes (the Go limit): %v, want accepted by SQL", what, limit, err)
		}
		if _, err := pool.Exec(ctx, sql, arg(limit+1)); pgerr.Code(err) != pgerr.CodeInvalid {
			t.Errorf("%s of %d bytes: %v, want PF008 from SQL", what, limit+1, err)
		}
	}
	text := func(n int) any { return strings.Repeat("é", n/2) + strings.Repeat("k", n%2) } // bytes, not characters
	blob := func(n int) any { return make([]byte, n) }
	const fp = `'\x00112233445566778899aabbccddeeff'::bytea`
	accepts("scope", idempotency.MaxScopeBytes,
		`SELECT pgfence.idempotency_check_args($1, 'k', `+fp+`, '1 day')`, text)
	accepts("key", idempotency.MaxKeyBytes,
		`SELECT pgfence.idempotency_check_args('s', $1, `+fp+`, '1 day')`, text)
	accepts("result", idempotency.MaxResultBytes,
		`SELECT pgfence.idempotency_check_result($1, NULL, NULL)`, blob)
	accepts("failure code", idempotency.MaxFailureCodeBytes,
		`SELECT pgfence.idempotency_check_result(NULL, $1, NULL)`, text)
	accepts("failure message", idempotency.MaxFailureMessageBytes,
		`SELECT pgfence.idempotency_check_result(NULL, 'c', $1)`, text)
	// The fingerprint Go sends is within what SQL accepts.
	if n := len(idempotency.Fingerprint(nil)); n < 16 || n > 64 {
		t.Errorf("Fingerprint is %d bytes; the schema accepts 16 to 64", n)
	}

	// Recovery points are checked by idempotency_advance, for the owner of a key.
	var owner string
	if err := pool.QueryRow(ctx, `SELECT owner::text FROM pgfence.idempotency_claim('s', 'rp', sha256('a'), '1 minute', '1 day')`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	accepts("recovery point", idempotency.MaxRecoveryPointBytes,
		`SELECT pgfence.idempotency_advance('s', 'rp', '`+owner+`', $1, NULL, '1 minute')`, text)
	accepts("recovery data", idempotency.MaxRecoveryDataBytes,
		`SELECT pgfence.idempotency_advance('s', 'rp', '`+owner+`', 'p', $1, '1 minute')`, blob)

	// The longest retention and lease, as the Go client sends durations:
	// the limit is accepted, a microsecond more is refused.
	durations := func(what string, limit time.Duration, sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, limit); err != nil {
			t.Errorf("%s of %v (the Go limit): %v, want accepted by SQL", what, limit, err)
		}
		if _, err := pool.Exec(ctx, sql, limit+time.Microsecond); pgerr.Code(err) != pgerr.CodeInvalid {
			t.Errorf("%s of %v: %v, want PF008 from SQL", what, limit+time.Microsecond, err)
		}
	}
	durations("retention", idempotency.MaxRetention,
		`SELECT pgfence.idempotency_check_args('s', 'k', `+fp+`, $1)`)
	durations("lease", idempotency.MaxLease,
		`SELECT pgfence.idempotency_heartbeat('s', 'rp', '`+owner+`', $1)`)
}

// TestLimitsCheckedBeforeRoundTrip: every over-limit argument is refused
// with an error naming the field and the limit, on a pool whose server does
// not exist, so nothing was sent.
func TestLimitsCheckedBeforeRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store := newStore(t, nil)
	noop := func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }
	for _, c := range []struct {
		req  idempotency.Request
		want string
	}{
		{idempotency.Request{Scope: strings.Repeat("s", idempotency.MaxScopeBytes+1), Key: "k"}, "Request.Scope must be 1 to 512 bytes, got 513"},
		{idempotency.Request{Scope: "s", Key: strings.Repeat("k", idempotency.MaxKeyBytes+1)}, "Request.Key must be 1 to 512 bytes, got 513"},
		{idempotency.Request{Scope: "", Key: "k"}, "Request.Scope"},
		{idempotency.Request{Scope: "s", Key: ""}, "Request.Key"},
		{idempotency.Request{Scope: "s\x00", Key: "k"}, "Request.Scope must be valid UTF-8 without NUL bytes"},
		{idempotency.Request{Scope: "\xff", Key: "k"}, "Request.Scope must be valid UTF-8 without NUL bytes"},
		{idempotency.Request{Scope: "s", Key: "k\x00"}, "Request.Key must be valid UTF-8 without NUL bytes"},
		{idempotency.Request{Scope: "s", Key: "\xc3"}, "Request.Key must be valid UTF-8 without NUL bytes"},
		{idempotency.Request{Scope: "s", Key: "k", Retention: idempotency.MaxRetention + time.Microsecond}, "Request.Retention must be 1µs to 8784h0m0s"},
	} {
		for name, call := range map[string]func() error{
			"Do":    func() error { _, err := store.Do(ctx, pool, c.req, noop); return err },
			"Claim": func() error { _, err := store.Claim(ctx, pool, c.req); return err },
		} {
			if err := call(); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s(scope %d bytes, key %d bytes): %v, want ErrInvalid with %q", name, len(c.req.Scope), len(c.req.Key), err, c.want)
			}
		}
	}
}

// TestOversizedResultWritesNothing: a result over the limit is refused and
// leaves the key exactly as it was: Do rolls the claim back (the key is free
// for the next attempt); an attempt of Begin or Claim stays open with the
// same owner, who can still complete it; and the SQL function refuses it for
// any client without touching the row.
func TestOversizedResultWritesNothing(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	big := bytes.Repeat([]byte{'x'}, idempotency.MaxResultBytes+1)

	req := idempotency.Request{Scope: "orders", Key: "big-1", Payload: []byte("p")}
	_, err := store.Do(ctx, pool, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if _, err := charge("big-1", 5)(ctx, tx); err != nil {
			return nil, err
		}
		return big, nil
	})
	if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "at most 16777216 bytes") {
		t.Fatalf("Do with an oversized result: %v, want ErrInvalid naming the limit", err)
	}
	if n := countCharges(t, pool, "big-1"); n != 0 {
		t.Fatalf("the refused attempt's business write committed: %d charges", n)
	}
	assertRows(t, pool, "orders", "big-1", 0)
	out, err := store.Do(ctx, pool, req, charge("big-1", 5))
	if err != nil || out.Replayed || countCharges(t, pool, "big-1") != 1 {
		t.Fatalf("retry after the refused result: %+v, %v; want New and one charge", out, err)
	}

	// Begin: bad input to Complete or Fail is refused before anything is
	// sent, and the attempt stays open with its writes: completing it with
	// a result that fits commits them.
	breq := idempotency.Request{Scope: "orders", Key: "big-3", Payload: []byte("p")}
	begun, err := store.Begin(ctx, pool, breq)
	if err != nil || begun.Replayed {
		t.Fatalf("Begin: %+v, %v", begun, err)
	}
	aa := begun.Attempt
	defer func() { _ = aa.Release(ctx) }()
	if _, err := charge("big-3", 5)(ctx, aa.Tx()); err != nil {
		t.Fatal(err)
	}
	if _, err := aa.Complete(ctx, big); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("AtomicAttempt.Complete with an oversized result: %v, want ErrInvalid", err)
	}
	if _, err := aa.Fail(ctx, nil); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("AtomicAttempt.Fail(nil): %v, want ErrInvalid", err)
	}
	if _, err := aa.Fail(ctx, &idempotency.Failure{Code: strings.Repeat("c", idempotency.MaxFailureCodeBytes+1)}); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("AtomicAttempt.Fail with an oversized code: %v, want ErrInvalid", err)
	}
	if _, err := aa.Complete(ctx, []byte("ok")); err != nil {
		t.Fatalf("completing the attempt after the refusals: %v", err)
	}
	if n := countCharges(t, pool, "big-3"); n != 1 {
		t.Fatalf("the attempt's write after its completion: %d charges, want 1", n)
	}
	if replay, err := store.Claim(ctx, pool, breq); err != nil || !replay.Replayed || string(replay.Result) != "ok" {
		t.Fatalf("replay of big-3: %+v, %v", replay, err)
	}

	// Leased: refused before the round trip; the owner still holds the key.
	lreq := idempotency.Request{Scope: "orders", Key: "big-2", Payload: []byte("p")}
	claimed, err := store.Claim(ctx, pool, lreq)
	if err != nil || claimed.Replayed {
		t.Fatalf("Claim: %+v, %v", claimed, err)
	}
	a := claimed.Attempt
	if _, err := a.Complete(ctx, big); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("Complete with an oversized result: %v, want ErrInvalid", err)
	}
	if _, err := a.Fail(ctx, &idempotency.Failure{Code: strings.Repeat("c", idempotency.MaxFailureCodeBytes+1)}); !errors.Is(err, idempotency.ErrInvalid) ||
		!strings.Contains(err.Error(), "Failure.Code") {
		t.Fatalf("Fail with an oversized code: %v, want ErrInvalid naming Failure.Code", err)
	}
	if err := a.Advance(ctx, strings.Repeat("p", idempotency.MaxRecoveryPointBytes+1), nil); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("Advance with an oversized point: %v, want ErrInvalid", err)
	}
	// Another client sends the oversized result straight to SQL.
	var owner string
	var epoch int64
	if err := pool.QueryRow(ctx, `SELECT owner::text, epoch FROM pgfence.idempotency_keys WHERE scope = 'orders' AND key = 'big-2'`).Scan(&owner, &epoch); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pgfence.idempotency_complete('orders', 'big-2', $1::uuid, $2, NULL, NULL)`, owner, big); pgerr.Code(err) != pgerr.CodeInvalid {
		t.Fatalf("SQL complete with an oversized result: %v, want PF008", err)
	}
	var status string
	var result []byte
	var owner2 string
	var epoch2 int64
	if err := pool.QueryRow(ctx, `SELECT status, result, owner::text, epoch FROM pgfence.idempotency_keys WHERE scope = 'orders' AND key = 'big-2'`).
		Scan(&status, &result, &owner2, &epoch2); err != nil {
		t.Fatal(err)
	}
	if status != "in_progress" || result != nil || owner2 != owner || epoch2 != epoch {
		t.Fatalf("after refused completions: status %s, result %d bytes, owner %s epoch %d; want in_progress, none, %s %d", status, len(result), owner2, epoch2, owner, epoch)
	}
	if _, err := a.Complete(ctx, []byte("ok")); err != nil {
		t.Fatalf("the owner completes with a small result: %v", err)
	}
	replay, err := store.Claim(ctx, pool, lreq)
	if err != nil || !replay.Replayed || string(replay.Result) != "ok" {
		t.Fatalf("replay: %+v, %v", replay, err)
	}
	assertRows(t, pool, "orders", "big-2", 1)
}

func assertRows(t *testing.T, pool *pgxpool.Pool, scope, key string, want int) {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pgfence.idempotency_keys WHERE scope = $1 AND key = $2`, scope, key).Scan(&n); err != nil || n != want {
		t.Fatalf("%s/%s: %d rows, %v; want %d", scope, key, n, err, want)
	}
}

// TestTextCheckedBeforeRoundTrip: failure codes and messages and recovery
// points with NUL or invalid UTF-8 are refused with ErrInvalid naming the
// field, like the other limits, not with the server's encoding error; the
// refused call writes nothing.
func TestTextCheckedBeforeRoundTrip(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	store := newStore(t, nil)
	bad := map[string]string{"NUL": "a\x00b", "invalid UTF-8": "a\xffb"}
	for name, text := range bad {
		for _, c := range []struct {
			field   string
			failure *idempotency.Failure
		}{
			{"Failure.Code", &idempotency.Failure{Code: text}},
			{"Failure.Message", &idempotency.Failure{Code: "c", Message: text}},
		} {
			req := idempotency.Request{Scope: "text", Key: "do-" + c.field + "-" + name, Payload: []byte("p")}
			_, err := store.Do(ctx, pool, req, func(context.Context, pgx.Tx) ([]byte, error) { return nil, c.failure })
			if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
				t.Errorf("Do failing with %s in %s: %v, want ErrInvalid naming %s", name, c.field, err, c.field)
			}
			assertRows(t, pool, req.Scope, req.Key, 0)

			lreq := idempotency.Request{Scope: "text", Key: "fail-" + c.field + "-" + name, Payload: []byte("p")}
			a := claimNew(t, store, pool, lreq)
			if _, err := a.Fail(ctx, c.failure); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
				t.Errorf("Attempt.Fail with %s in %s: %v, want ErrInvalid naming %s", name, c.field, err, c.field)
			}
			if _, err := a.Complete(ctx, []byte("ok")); err != nil {
				t.Errorf("the owner completes after the refused Fail: %v", err)
			}
		}
		lreq := idempotency.Request{Scope: "text", Key: "advance-" + name, Payload: []byte("p")}
		a := claimNew(t, store, pool, lreq)
		if err := a.Advance(ctx, text, nil); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "recovery point") {
			t.Errorf("Advance to a recovery point with %s: %v, want ErrInvalid naming the recovery point", name, err)
		}
		if a.RecoveryPoint() != "" {
			t.Errorf("after the refused Advance the recovery point is %q, want none", a.RecoveryPoint())
		}
		if _, err := a.Complete(ctx, []byte("ok")); err != nil {
			t.Errorf("the owner completes after the refused Advance: %v", err)
		}
	}
}

// TestStoreDurationsWithinSQL: a Store whose Retention or Lease the SQL
// functions would refuse is refused by NewStore, naming the field and the
// limit, instead of failing every claim with ErrInvalid; at the limits the
// store works against the server.
func TestStoreDurationsWithinSQL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  idempotency.Config
		want string
	}{
		{idempotency.Config{Retention: idempotency.MaxRetention + time.Microsecond}, "Config.Retention must be 1µs to 8784h0m0s"},
		{idempotency.Config{Retention: 10 * 365 * 24 * time.Hour}, "Config.Retention must be 1µs to 8784h0m0s"},
		{idempotency.Config{Lease: idempotency.MaxLease + time.Millisecond}, "Config.Lease must be 1ms to 24h0m0s"},
	} {
		if _, err := idempotency.NewStore(&c.cfg); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewStore(%+v): %v, want ErrInvalid with %q", c.cfg, err, c.want)
		}
	}
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	store := newStore(t, &idempotency.Config{Retention: idempotency.MaxRetention, Lease: idempotency.MaxLease})
	noop := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil }
	if out, err := store.Do(ctx, pool, idempotency.Request{Scope: "limits", Key: "atomic"}, noop); err != nil || out.Replayed {
		t.Fatalf("Do at the longest retention: %+v, %v", out, err)
	}
	out, err := store.Claim(ctx, pool, idempotency.Request{Scope: "limits", Key: "leased"})
	if err != nil || out.Replayed {
		t.Fatalf("Claim at the longest retention and lease: %+v, %v", out, err)
	}
	if _, err := out.Attempt.Complete(ctx, []byte("ok")); err != nil {
		t.Fatalf("Complete: %v", err)
	}
}

// Every entry point that takes a DB refuses a nil one, or a nil pool in the
// interface, with ErrInvalid instead of a nil dereference.
func TestNilDBRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "s", Key: "k"}
	noop := func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }
	for _, db := range []idempotency.DB{nil, (*pgxpool.Pool)(nil)} {
		for name, call := range map[string]func() error{
			"Do":        func() error { _, err := store.Do(ctx, db, req, noop); return err },
			"Begin":     func() error { _, err := store.Begin(ctx, db, req); return err },
			"Claim":     func() error { _, err := store.Claim(ctx, db, req); return err },
			"LookupKey": func() error { _, _, err := idempotency.LookupKey(ctx, db, "s", "k"); return err },
			"Keys":      func() error { _, err := idempotency.Keys(ctx, db, "s", 0); return err },
			"GC":        func() error { _, err := gcStore.GC(ctx, db, nil); return err },
			"Abandoned": func() error { _, err := store.Abandoned(ctx, db, nil); return err },
			"Recover": func() error {
				_, err := store.Recover(ctx, db, nil, func(context.Context, *idempotency.Attempt) error { return nil })
				return err
			},
		} {
			if err := call(); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "db is") {
				t.Errorf("%s with db %#v: %v, want ErrInvalid naming db", name, db, err)
			}
		}
	}
}

// An attempt claimed on a transaction cannot outlive it: after the caller's
// COMMIT its methods say so (ErrInvalid), not that an outcome is unknown,
// since nothing was sent.
func TestAttemptOnEndedTx(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	store := newStore(t, nil)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := store.Claim(ctx, tx, idempotency.Request{Scope: "tx", Key: "k"})
	if err != nil || out.Replayed {
		t.Fatalf("Claim in a transaction: %+v, %v", out, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := out.Attempt.Complete(ctx, []byte("ok")); !errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, idempotency.ErrOutcomeUnknown) {
		t.Fatalf("Complete after the claim's transaction ended: %v, want ErrInvalid, not an unknown outcome", err)
	}
}
