package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The completer's tests work on a three-phase intent with an external call:
// "charge" (a payment provider, keyed by the attempt's derived key), then
// "record" (the payment in the database), then "notify"; each phase writes
// one effects row and moves to its recovery point in the same transaction
// (AdvanceTx), and the last completes the key in it (CompleteTx).

var phases = []struct{ from, name, to string }{
	{"", "charge", "charged"},
	{"charged", "record", "recorded"},
	{"recorded", "notify", ""}, // the last phase completes the key
}

func createEffects(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(),
		`CREATE TABLE effects (key text NOT NULL, phase text NOT NULL, derived text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// runPhase runs phase i of a's intent in one transaction.
func runPhase(ctx context.Context, pool *pgxpool.Pool, a *idempotency.Attempt, i int) error {
	p := phases[i]
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2, $3)`, a.Key(), p.name, a.DerivedKey(p.name)); err != nil {
			return err
		}
		if p.to == "" {
			_, err := a.CompleteTx(ctx, tx, []byte("done "+a.Key()))
			return err
		}
		return a.AdvanceTx(ctx, tx, p.to, []byte(p.name+" of "+a.Key()))
	})
}

// resume runs the phases of a from its recovery point on.
func resume(ctx context.Context, pool *pgxpool.Pool, a *idempotency.Attempt) error {
	for i, p := range phases {
		if p.from != a.RecoveryPoint() {
			continue
		}
		for j := i; j < len(phases); j++ {
			if err := runPhase(ctx, pool, a, j); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown recovery point %q", a.RecoveryPoint())
}

// abandon claims key, runs its first done phases and leaves it in progress
// with its lease in the past: a crashed owner.
func abandon(t testing.TB, store *idempotency.Store, pool *pgxpool.Pool, scope, key string, done int) {
	t.Helper()
	ctx := context.Background()
	a := claimNew(t, store, pool, idempotency.Request{Scope: scope, Key: key, Payload: []byte("pay " + key)})
	for i := range done {
		if err := runPhase(ctx, pool, a, i); err != nil {
			t.Fatal(err)
		}
	}
	expireLease(t, pool, key)
}

// effects returns the phases done per key, in order.
func effects(t testing.TB, pool *pgxpool.Pool) map[string][]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key, phase FROM effects ORDER BY key, ctid`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	var key, phase string
	_, err = pgx.ForEachRow(rows, []any{&key, &phase}, func() error {
		got[key] = append(got[key], phase)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestRecoverTwoCompletersResumeEachKeyOnce: six keys abandoned at every
// recovery point; two completers run at once. Each key is resumed from its
// recovery point by exactly one of them, each phase takes effect once, and
// the completer that comes second to a key skips it. Completer A takes the
// first key and holds it until B has finished: B resumes all the others
// (A's lease hides the first from B's list), and A then finds them
// completed (the claim replays) and skips them.
func TestRecoverTwoCompletersResumeEachKeyOnce(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createEffects(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	const keys = 6
	for i := range keys {
		abandon(t, store, pool, "payments", fmt.Sprintf("order-%d", i), i%len(phases))
	}

	var mu sync.Mutex
	runs := map[string][]string{} // key -> "completer@point" per run of fn
	bDone := make(chan struct{})
	completer := func(name string) resumer {
		return func(ctx context.Context, a *idempotency.Attempt) error {
			mu.Lock()
			runs[a.Key()] = append(runs[a.Key()], name+"@"+a.RecoveryPoint())
			mu.Unlock()
			if name == "A" {
				<-bDone
			}
			return resume(ctx, pool, a)
		}
	}
	var resA, resB idempotency.RecoverResult
	var errA, errB error
	aStarted := make(chan struct{})
	var startOnce sync.Once
	var wg sync.WaitGroup
	wg.Go(func() {
		resA, errA = store.Recover(ctx, pool, &idempotency.RecoverOptions{Limit: keys}, func(ctx context.Context, a *idempotency.Attempt) error {
			startOnce.Do(func() { close(aStarted) })
			return completer("A")(ctx, a)
		})
	})
	<-aStarted
	resB, errB = store.Recover(ctx, pool, nil, completer("B"))
	close(bDone)
	wg.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("A: %v, B: %v", errA, errB)
	}
	t.Logf("A %+v, B %+v, runs %v", resA, resB, runs)

	for i := range keys {
		key := fmt.Sprintf("order-%d", i)
		want := phases[i%len(phases)].from
		if r := runs[key]; len(r) != 1 || !strings.HasSuffix(r[0], "@"+want) {
			t.Errorf("%s resumed %v, want once from recovery point %q", key, r, want)
		}
		if got := effects(t, pool)[key]; strings.Join(got, ",") != "charge,record,notify" {
			t.Errorf("%s: phases %v, want each once", key, got)
		}
		out, err := store.Claim(ctx, pool, idempotency.Request{Scope: "payments", Key: key, Payload: []byte("pay " + key)})
		if err != nil || !out.Replayed || string(out.Result) != "done "+key {
			t.Errorf("%s afterwards: %+v, %v; want the stored result", key, out, err)
		}
	}
	if resA.Found != keys || resA.Resumed != 1 || resA.Skipped != keys-1 {
		t.Errorf("A: %+v; want %d found, 1 resumed, %d skipped", resA, keys, keys-1)
	}
	if resB.Found != keys-1 || resB.Resumed != keys-1 || resB.Skipped != 0 {
		t.Errorf("B: %+v; want %d found and resumed", resB, keys-1)
	}
	if left, err := store.Abandoned(ctx, pool, nil); err != nil || len(left) != 0 {
		t.Errorf("abandoned afterwards: %v, %v", left, err)
	}
}

// TestRecoverMarksFailed: without a RecoverFunc, Recover marks each
// abandoned key failed with CodeAbandoned and a message naming its recovery
// point; every later duplicate gets that failure instead of a second
// execution. Keys whose lease is live, keys of other scopes, keys completed,
// and leases that ended less than ExpiredFor ago are left alone.
func TestRecoverMarksFailed(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createEffects(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	abandon(t, store, pool, "payments/a", "crashed", 1)
	if _, err := pool.Exec(ctx, `UPDATE pgfence.idempotency_keys SET lease_expires_at = clock_timestamp() - interval '2 hours' WHERE key = 'crashed'`); err != nil {
		t.Fatal(err)
	}
	released := claimNew(t, store, pool, idempotency.Request{Scope: "payments/b", Key: "released"})
	if err := released.Release(ctx); err != nil {
		t.Fatal(err)
	}
	claimNew(t, store, pool, idempotency.Request{Scope: "payments/a", Key: "live"})
	abandon(t, store, pool, "mail", "other-scope", 0)
	done := claimNew(t, store, pool, idempotency.Request{Scope: "payments/a", Key: "done"})
	if _, err := done.Complete(ctx, []byte("ok")); err != nil {
		t.Fatal(err)
	}

	list, err := store.Abandoned(ctx, pool, &idempotency.RecoverOptions{ScopePrefix: "payments/"})
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, k := range list {
		listed = append(listed, fmt.Sprintf("%s/%s@%q epoch=%d released=%v", k.Scope, k.Key, k.RecoveryPoint, k.Epoch, k.Released))
		if k.LeaseExpiresAt.IsZero() || k.CreatedAt.IsZero() {
			t.Errorf("%s: times not read: %+v", k.Key, k)
		}
	}
	if want := `payments/a/crashed@"charged" epoch=1 released=false,payments/b/released@"" epoch=1 released=true`; strings.Join(listed, ",") != want {
		t.Fatalf("abandoned: %v\nwant %s", listed, want)
	}
	// The released key's lease ended just now: an hour's grace leaves it.
	if list, err := store.Abandoned(ctx, pool, &idempotency.RecoverOptions{ScopePrefix: "payments/", ExpiredFor: time.Hour}); err != nil || len(list) != 1 || list[0].Key != "crashed" {
		t.Fatalf("abandoned an hour ago: %+v, %v", list, err)
	}

	res, err := store.Recover(ctx, pool, &idempotency.RecoverOptions{ScopePrefix: "payments/"}, nil)
	if err != nil || res != (idempotency.RecoverResult{Found: 2, Failed: 2}) {
		t.Fatalf("recover: %+v, %v", res, err)
	}
	out, err := store.Claim(ctx, pool, idempotency.Request{Scope: "payments/a", Key: "crashed", Payload: []byte("pay crashed")})
	if err != nil || !out.Replayed || out.Failure == nil || out.Failure.Code != idempotency.CodeAbandoned ||
		!strings.Contains(out.Failure.Message, `"charged"`) {
		t.Fatalf("duplicate of the failed key: %+v, %v", out, err)
	}
	var epoch int64
	if err := pool.QueryRow(ctx, `SELECT epoch FROM pgfence.idempotency_keys WHERE key = 'crashed'`).Scan(&epoch); err != nil || epoch != 2 {
		t.Errorf("the completer's takeover is not in the row: epoch %d, %v", epoch, err)
	}
	if got := effects(t, pool)["crashed"]; len(got) != 1 {
		t.Errorf("phases of the failed key: %v, want the one done before the crash", got)
	}
	if list, err := store.Abandoned(ctx, pool, nil); err != nil || len(list) != 1 || list[0].Key != "other-scope" {
		t.Errorf("left: %+v, %v; want only the other scope's key", list, err)
	}
}

// TestRecoverSkipsKeysHeldElsewhere: a key that another transaction holds
// (its owner completing in a long transaction, or a retry taking it over)
// is skipped after WaitTimeout, not waited for or taken twice.
func TestRecoverSkipsKeysHeldElsewhere(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createEffects(t, pool)
	ctx := context.Background()
	store := newStore(t, &idempotency.Config{WaitTimeout: 50 * time.Millisecond})
	abandon(t, store, pool, "payments", "held", 0)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT FROM pgfence.idempotency_keys WHERE key = 'held' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	ran := false
	res, err := store.Recover(ctx, pool, nil, func(context.Context, *idempotency.Attempt) error { ran = true; return nil })
	if err != nil || res != (idempotency.RecoverResult{Found: 1, Skipped: 1}) || ran {
		t.Fatalf("recover: %+v, %v, fn ran %v; want the key skipped", res, err, ran)
	}
}

// TestRecoverFuncErrors: what a RecoverFunc leaves decides the key. A
// transient error releases it with its recovery point for the next
// completer; a *Failure is stored; returning without completing releases
// it; a panic releases it and goes on.
func TestRecoverFuncErrors(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createEffects(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	abandon(t, store, pool, "payments", "k", 1)
	recoverOnce := func(fn resumer) idempotency.RecoverResult {
		t.Helper()
		res, err := store.Recover(ctx, pool, nil, fn)
		if err != nil {
			t.Fatal(err)
		}
		expireLeases(t, pool)
		return res
	}

	if res := recoverOnce(func(context.Context, *idempotency.Attempt) error { return errors.New("provider down") }); res.Released != 1 {
		t.Errorf("transient error: %+v, want released", res)
	}
	if res := recoverOnce(func(context.Context, *idempotency.Attempt) error { return nil }); res.Released != 1 {
		t.Errorf("nothing done: %+v, want released", res)
	}
	func() {
		defer func() {
			if p := recover(); p != "bug" {
				t.Errorf("panic: %v, want it to go on", p)
			}
		}()
		recoverOnce(func(context.Context, *idempotency.Attempt) error { panic("bug") })
	}()
	expireLeases(t, pool)
	list, err := store.Abandoned(ctx, pool, nil)
	if err != nil || len(list) != 1 || list[0].RecoveryPoint != "charged" || !list[0].Released || list[0].Epoch != 4 {
		t.Fatalf("after three failed resumptions: %+v, %v; want released at \"charged\", epoch 4", list, err)
	}
	if res := recoverOnce(func(context.Context, *idempotency.Attempt) error {
		return &idempotency.Failure{Code: "card_declined", Message: "declined"}
	}); res.Resumed != 1 {
		t.Errorf("failure: %+v, want resumed (and failed for good)", res)
	}
	out, err := store.Claim(ctx, pool, idempotency.Request{Scope: "payments", Key: "k", Payload: []byte("pay k")})
	if err != nil || out.Failure == nil || out.Failure.Code != "card_declined" {
		t.Fatalf("duplicate: %+v, %v; want the stored failure", out, err)
	}
}

// A key taken over while the RecoverFunc ran (its lease ran out, a retry
// of the request claimed it) is counted skipped, not resumed, though fn
// returned nil; and a key whose failure cannot be stored (the completer's
// context ended) is released, not held for a lease.
func TestRecoverCountsWhatItDid(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createEffects(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	abandon(t, store, pool, "payments", "taken", 1)
	res, err := store.Recover(ctx, pool, nil, func(ctx context.Context, a *idempotency.Attempt) error {
		// Somebody else's takeover, as the database records one.
		_, err := pool.Exec(ctx, `UPDATE pgfence.idempotency_keys SET owner = gen_random_uuid(), epoch = epoch + 1,
       lease_expires_at = clock_timestamp() + interval '1 minute' WHERE key = 'taken'`)
		return err
	})
	if err != nil || res.Resumed != 0 || res.Skipped != 1 {
		t.Errorf("Recover of a key taken over meanwhile: %+v, %v; want skipped, not resumed", res, err)
	}

	abandon(t, store, pool, "payments", "held", 1)
	ended, cancel := context.WithCancel(ctx)
	res, err = store.Recover(ended, pool, nil, func(context.Context, *idempotency.Attempt) error {
		cancel() // the failure below is stored with this context
		return &idempotency.Failure{Code: "declined"}
	})
	if err == nil {
		t.Fatalf("Recover whose failure could not be stored: %+v, want its error", res)
	}
	var inProgress, owned bool
	if err := pool.QueryRow(ctx, `SELECT status = 'in_progress', owner IS NOT NULL FROM pgfence.idempotency_keys WHERE key = 'held'`).
		Scan(&inProgress, &owned); err != nil {
		t.Fatal(err)
	}
	if !inProgress || owned {
		t.Fatalf("the key after a failure that could not be stored: in progress %v, owned %v; want released (in progress, no owner)", inProgress, owned)
	}
}

// expireLeases moves every leased key's lease into the past.
func expireLeases(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE pgfence.idempotency_keys
   SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE status = 'in_progress' AND mode = 'leased'`); err != nil {
		t.Fatal(err)
	}
}

func TestRecoverOptionsRefused(t *testing.T) {
	t.Parallel()
	store := newStore(t, nil)
	for _, o := range []idempotency.RecoverOptions{
		{ScopePrefix: strings.Repeat("s", idempotency.MaxScopeBytes+1)},
		{ScopePrefix: "a\x00"},
		{ExpiredFor: -time.Second},
		{Limit: -1},
	} {
		if _, err := store.Abandoned(context.Background(), nil, &o); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "RecoverOptions.") {
			t.Errorf("%+v: %v, want ErrInvalid naming the field", o, err)
		}
		if _, err := store.Recover(context.Background(), nil, &o, nil); !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("Recover %+v: %v, want ErrInvalid", o, err)
		}
	}
}
