package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

func newStore(t testing.TB, cfg *idempotency.Config) *idempotency.Store {
	t.Helper()
	s, err := idempotency.NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// charges is a business table WITHOUT a unique constraint: only the
// idempotency key stands between a duplicate request and a second row.
func createCharges(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(),
		`CREATE TABLE charges (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, order_id text NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// work is what Store.Do runs; resumer what Store.Recover does.
type (
	work    = func(context.Context, pgx.Tx) ([]byte, error)
	resumer = func(context.Context, *idempotency.Attempt) error
)

// charge inserts one charge row and returns its id as the result.
func charge(orderID string, amount int) work {
	return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO charges (order_id, amount) VALUES ($1, $2) RETURNING id`, orderID, amount).Scan(&id); err != nil {
			return nil, err
		}
		return []byte(strconv.FormatInt(id, 10)), nil
	}
}

func countCharges(t testing.TB, pool *pgxpool.Pool, orderID string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM charges WHERE order_id = $1`, orderID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// verifyNoLeaks checks, after the test's other cleanups (pools closed), that
// the test left no goroutine behind. Such tests are not parallel.
func verifyNoLeaks(t *testing.T) {
	t.Helper()
	opts := []goleak.Option{
		goleak.IgnoreCurrent(),
		// the shared test cluster's postmaster, started by the first test
		goleak.IgnoreAnyFunction("github.com/pgfence/pgfence/internal/testkit/pgcluster.(*Cluster).startLocked.func1"),
	}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// expireKeys moves every completed key's retention into the past.
func expireKeys(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE pgfence.idempotency_keys
   SET created_at = clock_timestamp() - interval '2 hours', updated_at = clock_timestamp() - interval '2 hours',
       completed_at = clock_timestamp() - interval '2 hours', expires_at = clock_timestamp() - interval '1 second'
 WHERE status <> 'in_progress'`); err != nil {
		t.Fatal(err)
	}
}

func keyRows(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pgfence.idempotency_keys`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestAtomicConcurrentDuplicatesApplyOnce(t *testing.T) {
	verifyNoLeaks(t)
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 64
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store := newStore(t, &idempotency.Config{WaitTimeout: time.Minute})
	req := idempotency.Request{Scope: "charges", Key: "order-1:charge", Payload: []byte(`{"amount":100}`)}

	const n = 64
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		outcomes = make([]*idempotency.Outcome, n)
		errs     = make([]error, n)
		calls    sync.Map
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range n {
		wg.Go(func() {
			<-start
			outcomes[i], errs[i] = store.Do(ctx, pool, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				calls.Store(i, true)
				time.Sleep(20 * time.Millisecond) // keep the claim open while duplicates pile up
				return charge("order-1", 100)(ctx, tx)
			})
		})
	}
	close(start)
	wg.Wait()

	var news int
	var first []byte
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if !outcomes[i].Replayed {
			news++
		}
		if first == nil {
			first = outcomes[i].Result
		}
		if string(outcomes[i].Result) != string(first) {
			t.Fatalf("caller %d got result %q, caller 0 got %q", i, outcomes[i].Result, first)
		}
	}
	if news != 1 {
		t.Fatalf("%d callers executed the intent, want 1", news)
	}
	if got := countCharges(t, db.Pool, "order-1"); got != 1 {
		t.Fatalf("%d charge rows, want 1", got)
	}
	var ncalls int
	calls.Range(func(any, any) bool { ncalls++; return true })
	t.Logf("fn ran %d time(s) (re-runs only after a rollback), 1 new + %d replayed", ncalls, n-1)
}

func TestAtomicReplayReturnsStoredResult(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	store := newStore(t, nil)
	ctx := context.Background()
	req := idempotency.Request{Scope: "charges", Key: "order-2:charge", Payload: []byte("a")}

	out, err := store.Do(ctx, pool, req, charge("order-2", 5))
	if err != nil || out.Replayed {
		t.Fatalf("first: %+v, %v", out, err)
	}
	if out.ExpiresAt.IsZero() {
		t.Fatal("first: no ExpiresAt")
	}
	again, err := store.Do(ctx, pool, req, func(context.Context, pgx.Tx) ([]byte, error) {
		t.Fatal("fn ran for a replay")
		return nil, nil
	})
	if err != nil || !again.Replayed || string(again.Result) != string(out.Result) {
		t.Fatalf("replay: %+v, %v (first result %q)", again, err, out.Result)
	}
	if got := countCharges(t, pool, "order-2"); got != 1 {
		t.Fatalf("%d charges, want 1", got)
	}

	// An empty result is stored and replayed as empty, not nil.
	empty := idempotency.Request{Scope: "charges", Key: "order-2:noop"}
	noop := func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }
	if out, err := store.Do(ctx, pool, empty, noop); err != nil || out.Result == nil || len(out.Result) != 0 {
		t.Fatalf("empty result: %+v, %v", out, err)
	}
	if out, err := store.Do(ctx, pool, empty, noop); err != nil || !out.Replayed || out.Result == nil {
		t.Fatalf("empty replay: %+v, %v", out, err)
	}
}

func TestAtomicPayloadMismatch(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	store := newStore(t, nil)
	ctx := context.Background()
	req := idempotency.Request{Scope: "charges", Key: "order-3:charge", Payload: []byte(`{"amount":100}`)}
	if _, err := store.Do(ctx, pool, req, charge("order-3", 100)); err != nil {
		t.Fatal(err)
	}
	other := req
	other.Payload = []byte(`{"amount":999}`)
	ran := false
	check := func(name string, db idempotency.DB) {
		out, err := store.Do(ctx, db, other, func(context.Context, pgx.Tx) ([]byte, error) { ran = true; return nil, nil })
		if !errors.Is(err, idempotency.ErrMismatch) {
			t.Fatalf("%s: err = %v, want ErrMismatch", name, err)
		}
		if out != nil {
			t.Fatalf("%s: outcome %+v shows more than a mismatch", name, out)
		}
	}
	check("pool", pool) // answered by the claim function in a transaction of its own
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check("caller tx", tx) // answered by the claim function
	// The caller's transaction is still usable after a mismatch.
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("caller tx broken after mismatch: %v", err)
	}
	_ = tx.Rollback(ctx)
	if ran {
		t.Fatal("fn ran on a mismatch")
	}
	if got := countCharges(t, pool, "order-3"); got != 1 {
		t.Fatalf("%d charges, want 1", got)
	}
}

// holdClaim runs Do in a goroutine whose fn blocks until release is closed (or
// returns failWith). claimed is closed once the claim is held; pid receives the
// backend pid of the claiming connection.
type heldClaim struct {
	claimed chan struct{}
	release chan struct{}
	pid     uint32
	done    chan struct{}
	out     *idempotency.Outcome
	err     error
}

func holdClaim(store *idempotency.Store, db idempotency.DB, req idempotency.Request, fn work, failWith error) *heldClaim {
	h := &heldClaim{claimed: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		h.out, h.err = store.Do(context.Background(), db, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&h.pid); err != nil {
				return nil, err
			}
			res, err := fn(ctx, tx)
			close(h.claimed)
			<-h.release
			if err == nil && failWith != nil {
				return nil, failWith
			}
			if err == nil {
				// a statement after the wait notices a killed backend
				_, err = tx.Exec(ctx, `SELECT 1`)
			}
			return res, err
		})
	}()
	return h
}

func TestAtomicDuplicateWhileInProgress(t *testing.T) {
	verifyNoLeaks(t)
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	req := idempotency.Request{Scope: "charges", Key: "order-4:charge", Payload: []byte("x")}
	first := holdClaim(newStore(t, nil), pool, req, charge("order-4", 1), nil)
	<-first.claimed

	// A duplicate that will not wait long reports in progress, with a hint.
	impatient := newStore(t, &idempotency.Config{WaitTimeout: 50 * time.Millisecond, RetryAfter: 3 * time.Second})
	out, err := impatient.Do(ctx, pool, req, charge("order-4", 1))
	var ip *idempotency.InProgressError
	if !errors.As(err, &ip) || !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("err = %v, want *InProgressError", err)
	}
	if out != nil || ip.RetryAfter != 3*time.Second {
		t.Fatalf("outcome %+v / %+v, want in progress with RetryAfter 3s", out, ip)
	}
	// In the caller's transaction the refusal leaves the transaction usable.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := impatient.Do(ctx, tx, req, charge("order-4", 1)); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("in tx: err = %v, want ErrInProgress", err)
	}
	var lockTimeout string
	if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lockTimeout); err != nil {
		t.Fatalf("caller tx broken after in progress: %v", err)
	}
	if lockTimeout != "0" {
		t.Fatalf("caller's lock_timeout changed to %s", lockTimeout)
	}
	_ = tx.Rollback(ctx)

	// A patient duplicate waits for the first to commit and replays it.
	patient := make(chan struct{})
	var pout *idempotency.Outcome
	var perr error
	go func() {
		defer close(patient)
		pout, perr = newStore(t, &idempotency.Config{WaitTimeout: time.Minute}).Do(ctx, pool, req, charge("order-4", 1))
	}()
	waitForLockWaiters(t, pool, 1)
	close(first.release)
	<-first.done
	<-patient
	if first.err != nil || first.out.Replayed {
		t.Fatalf("first: %+v, %v", first.out, first.err)
	}
	if perr != nil || !pout.Replayed || string(pout.Result) != string(first.out.Result) {
		t.Fatalf("patient duplicate: %+v, %v", pout, perr)
	}
	if got := countCharges(t, pool, "order-4"); got != 1 {
		t.Fatalf("%d charges, want 1", got)
	}
}

// waitForLockWaiters waits until n backends wait for a lock.
func waitForLockWaiters(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lock waiters after 30s, want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestAtomicAbortFreesKeyForWaiter(t *testing.T) {
	verifyNoLeaks(t)
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	req := idempotency.Request{Scope: "charges", Key: "order-5:charge", Payload: []byte("x")}
	transient := errors.New("payment gateway hiccup")
	first := holdClaim(newStore(t, nil), pool, req, charge("order-5", 1), transient)
	<-first.claimed

	second := make(chan struct{})
	var out *idempotency.Outcome
	var err error
	go func() {
		defer close(second)
		out, err = newStore(t, &idempotency.Config{WaitTimeout: time.Minute}).Do(ctx, pool, req, charge("order-5", 1))
	}()
	waitForLockWaiters(t, pool, 1)
	close(first.release)
	<-first.done
	<-second
	if !errors.Is(first.err, transient) {
		t.Fatalf("first: err = %v, want the transient error", first.err)
	}
	if err != nil || out.Replayed {
		t.Fatalf("waiter after abort: %+v, %v; want New", out, err)
	}
	if got := countCharges(t, pool, "order-5"); got != 1 {
		t.Fatalf("%d charges, want 1", got)
	}
}

func TestAtomicKilledBackendFreesKey(t *testing.T) {
	verifyNoLeaks(t)
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, &idempotency.Config{WaitTimeout: time.Minute})
	req := idempotency.Request{Scope: "charges", Key: "order-6:charge", Payload: []byte("x")}
	first := holdClaim(store, pool, req, charge("order-6", 1), nil)
	<-first.claimed

	second := make(chan struct{})
	var out *idempotency.Outcome
	var err error
	go func() {
		defer close(second)
		out, err = store.Do(ctx, pool, req, charge("order-6", 1))
	}()
	waitForLockWaiters(t, pool, 1)
	var killed bool
	if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, first.pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("pg_terminate_backend: %v, %v", killed, err)
	}
	<-second
	close(first.release)
	<-first.done
	if first.err == nil {
		t.Fatalf("killed attempt reported success: %+v", first.out)
	}
	if err != nil || out.Replayed {
		t.Fatalf("duplicate after kill: %+v, %v; want New", out, err)
	}
	if got := countCharges(t, pool, "order-6"); got != 1 {
		t.Fatalf("%d charges, want 1", got)
	}
	// And the key now replays.
	if out, err := store.Do(ctx, pool, req, charge("order-6", 1)); err != nil || !out.Replayed {
		t.Fatalf("after: %+v, %v", out, err)
	}
}

func TestAtomicIsolationRefused(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			ran := false
			_, err = store.Do(ctx, tx, idempotency.Request{Scope: "charges", Key: "iso", Payload: []byte("x")},
				func(context.Context, pgx.Tx) ([]byte, error) { ran = true; return nil, nil })
			if !errors.Is(err, idempotency.ErrIsolation) || pgerr.Code(err) != pgerr.CodeIsolation {
				t.Fatalf("err = %v, want ErrIsolation (PF010)", err)
			}
			if ran {
				t.Fatal("fn ran")
			}
			t.Logf("error: %v", err)
		})
	}
	if n := keyRows(t, pool); n != 0 {
		t.Fatalf("%d key rows left", n)
	}
	// A serialization failure (40001) maps to the same sentinel.
	if !errors.Is(fmt.Errorf("x: %w", pgerr.Classify(&pgconn.PgError{Code: "40001"}, false)), idempotency.ErrIsolation) {
		t.Fatal("40001 is not ErrIsolation")
	}
}

func TestAtomicPermanentFailureStoredAndReplayed(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "charges", Key: "order-7:charge", Payload: []byte("x")}
	out, err := store.Do(ctx, pool, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if _, err := charge("order-7", 1)(ctx, tx); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("checking stock: %w", &idempotency.Failure{Code: "out_of_stock", Message: "no widgets", Data: []byte("sku-9")})
	})
	if err != nil || out.Replayed || out.Failure == nil || out.Failure.Code != "out_of_stock" || out.Result != nil {
		t.Fatalf("first: %+v, %v", out, err)
	}
	if got := countCharges(t, pool, "order-7"); got != 0 {
		t.Fatalf("a failed attempt's writes committed: %d charges", got)
	}
	again, err := store.Do(ctx, pool, req, charge("order-7", 1))
	if err != nil || !again.Replayed || again.Failure == nil ||
		again.Failure.Code != "out_of_stock" || again.Failure.Message != "no widgets" || string(again.Failure.Data) != "sku-9" {
		t.Fatalf("replay: %+v (%+v), %v", again, again.Failure, err)
	}
	if got := countCharges(t, pool, "order-7"); got != 0 {
		t.Fatalf("replay executed: %d charges", got)
	}
}

func TestAtomicTransientErrorNotStored(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "charges", Key: "order-8:charge", Payload: []byte("x")}
	boom := errors.New("boom")
	if _, err := store.Do(ctx, pool, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if _, err := charge("order-8", 1)(ctx, tx); err != nil {
			return nil, err
		}
		return nil, boom
	}); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if n := keyRows(t, pool); n != 0 {
		t.Fatalf("a transient failure left %d key rows", n)
	}
	if out, err := store.Do(ctx, pool, req, charge("order-8", 1)); err != nil || out.Replayed {
		t.Fatalf("retry: %+v, %v", out, err)
	}
	if got := countCharges(t, pool, "order-8"); got != 1 {
		t.Fatalf("%d charges, want 1", got)
	}
}

func TestAtomicInCallerTransaction(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "charges", Key: "order-9:charge", Payload: []byte("x")}

	// Rolled back by the caller: nothing happened, the key is free.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := store.Do(ctx, tx, req, charge("order-9", 1)); err != nil || out.Replayed {
		t.Fatalf("in tx: %+v, %v", out, err)
	}
	// The same transaction asking again sees its own claim.
	if out, err := store.Do(ctx, tx, req, charge("order-9", 1)); err != nil || !out.Replayed {
		t.Fatalf("same tx again: %+v, %v", out, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := keyRows(t, pool); n != 0 {
		t.Fatalf("rolled-back claim left %d rows", n)
	}

	// A transient error inside the caller's transaction rolls back only the
	// savepoint: the caller's own writes survive and the key stays free.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ('caller', 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Do(ctx, tx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, _ = charge("order-9", 1)(ctx, tx)
		return nil, errors.New("transient")
	}); err == nil {
		t.Fatal("transient error lost")
	}
	out, err := store.Do(ctx, tx, req, charge("order-9", 1))
	if err != nil || out.Replayed {
		t.Fatalf("retry in tx: %+v, %v", out, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if countCharges(t, pool, "caller") != 1 || countCharges(t, pool, "order-9") != 1 {
		t.Fatal("caller's writes or the intent's write missing after commit")
	}
	if again, err := store.Do(ctx, pool, req, charge("order-9", 1)); err != nil || !again.Replayed ||
		string(again.Result) != string(out.Result) {
		t.Fatalf("after commit: %+v, %v", again, err)
	}
}

// TestAtomicClaimMustCompleteInItsTransaction: a client in another language
// that claims and commits without storing a result is refused at COMMIT, so a
// key is never left in progress by a finished transaction.
func TestAtomicClaimMustCompleteInItsTransaction(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var outcome string
	if err := tx.QueryRow(ctx, `SELECT outcome FROM pgfence.idempotency_claim_atomic('s', 'k', $1, '1s', '1h')`,
		idempotency.Fingerprint(nil)).Scan(&outcome); err != nil || outcome != "new" {
		t.Fatalf("claim: %q, %v", outcome, err)
	}
	err = tx.Commit(ctx)
	if pgerr.Code(err) != pgerr.CodeInvalid {
		t.Fatalf("commit without completion: %v, want PF008", err)
	}
	if n := keyRows(t, pool); n != 0 {
		t.Fatalf("%d key rows after refused commit", n)
	}
	// The same from psql-style SQL, completed: fine.
	if _, err := pool.Exec(ctx, `BEGIN;
SELECT pgfence.idempotency_claim_atomic('s', 'k', sha256('x'), '1s', '1h');
SELECT pgfence.idempotency_complete_atomic('s', 'k', 'done');
COMMIT;`); err != nil {
		t.Fatal(err)
	}
	var status string
	var result []byte
	if err := pool.QueryRow(ctx, `SELECT outcome, result FROM pgfence.idempotency_claim_atomic('s', 'k', sha256('x'), '1s', '1h')`).Scan(&status, &result); err != nil ||
		status != "replayed" || string(result) != "done" {
		t.Fatalf("replay from SQL: %q %q %v", status, result, err)
	}
}

func TestAtomicExpiredKeyStartsAfresh(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	ctx := context.Background()
	store := newStore(t, nil)
	req := idempotency.Request{Scope: "charges", Key: "order-10:charge", Payload: []byte("x"), Retention: time.Hour}
	if _, err := store.Do(ctx, pool, req, charge("order-10", 1)); err != nil {
		t.Fatal(err)
	}
	var retention time.Duration
	if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - completed_at)::bigint FROM pgfence.idempotency_keys`).Scan(&retention); err != nil {
		t.Fatal(err)
	}
	if retention != 3600 {
		t.Fatalf("per-key retention %d s, want 3600", retention)
	}
	expireKeys(t, pool)
	other := req
	other.Payload = []byte("y") // an expired key is forgotten, payload included
	if out, err := store.Do(ctx, pool, other, charge("order-10", 2)); err != nil || out.Replayed {
		t.Fatalf("after expiry: %+v, %v", out, err)
	}
	if got := countCharges(t, pool, "order-10"); got != 2 {
		t.Fatalf("%d charges, want 2", got)
	}
}

func TestInvalidArguments(t *testing.T) {
	for _, cfg := range []*idempotency.Config{{Retention: -1}, {Retention: time.Nanosecond}, {Lease: -1}, {Lease: time.Microsecond}, {RetryAfter: -1}, {WaitTimeout: time.Microsecond}} {
		if _, err := idempotency.NewStore(cfg); !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("NewStore(%+v): %v, want ErrInvalid", cfg, err)
		}
	}
	store := newStore(t, nil)
	noop := func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }
	long := string(make([]byte, idempotency.MaxKeyBytes+1))
	for _, req := range []idempotency.Request{{Key: "k"}, {Scope: "s"}, {Scope: "s", Key: long}, {Scope: "s", Key: "k", Retention: -1}, {Scope: "s", Key: "k", Retention: 999 * time.Nanosecond}} {
		// No database needed: refused before any round trip.
		if _, err := store.Do(context.Background(), nil, req, noop); !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("Do(%+v): %v, want ErrInvalid", req, err)
		}
	}
}

// TestWaitTimeoutWithinLockTimeout: the wait is a lock_timeout, an int32 of
// milliseconds. The longest accepted WaitTimeout works against the server;
// anything longer is refused by NewStore, naming the field and the maximum,
// instead of failing every Do with the server's 22023.
func TestWaitTimeoutWithinLockTimeout(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil }
	store := newStore(t, &idempotency.Config{WaitTimeout: idempotency.MaxWaitTimeout})
	out, err := store.Do(ctx, pool, idempotency.Request{Scope: "wait", Key: "max"}, noop)
	if err != nil || out.Replayed {
		t.Fatalf("Do with WaitTimeout %v: %+v, %v; want New", idempotency.MaxWaitTimeout, out, err)
	}
	for _, wait := range []time.Duration{idempotency.MaxWaitTimeout + time.Microsecond, idempotency.MaxWaitTimeout + time.Millisecond, 30 * 24 * time.Hour, math.MaxInt64} {
		_, err := idempotency.NewStore(&idempotency.Config{WaitTimeout: wait})
		if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "Config.WaitTimeout") ||
			!strings.Contains(err.Error(), idempotency.MaxWaitTimeout.String()) {
			t.Errorf("NewStore with WaitTimeout %v: %v, want ErrInvalid naming Config.WaitTimeout and %v", wait, err, idempotency.MaxWaitTimeout)
		}
	}
}

// TestAtomicWaitBoundedByContext: a duplicate waiting for an open first
// attempt gives up when its context ends, and the first attempt is unharmed.
func TestAtomicWaitBoundedByContext(t *testing.T) {
	verifyNoLeaks(t)
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	store := newStore(t, &idempotency.Config{WaitTimeout: time.Minute})
	req := idempotency.Request{Scope: "charges", Key: "order-11:charge", Payload: []byte("x")}
	first := holdClaim(store, pool, req, charge("order-11", 1), nil)
	<-first.claimed

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	out, err := store.Do(ctx, pool, req, charge("order-11", 1))
	if err == nil {
		t.Fatalf("duplicate did not give up: %+v", out)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Fatalf("duplicate returned after %v", elapsed)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, idempotency.ErrInProgress) && !errors.Is(err, pgerr.ErrStatementTimeout) {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
	t.Logf("duplicate gave up after %v with: %v", time.Since(start), err)
	close(first.release)
	<-first.done
	t.Logf("first done after %v", time.Since(start))
	if first.err != nil || first.out.Replayed || countCharges(t, pool, "order-11") != 1 {
		t.Fatalf("first: %+v, %v", first.out, first.err)
	}
}

// TestBeginLeavesTheClaimOpen: Store.Begin claims the key in a transaction
// that the caller ends. Complete commits the caller's writes with the
// result; Fail commits them with a stored failure (unlike a Failure
// returned from a Func, which rolls them back); Release leaves nothing and
// the key free. A duplicate of an open claim waits for it within
// WaitTimeout. An ended attempt cannot complete again. The calls of a leased
// attempt are refused.
func TestBeginLeavesTheClaimOpen(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	ctx := context.Background()
	store := newStore(t, &idempotency.Config{WaitTimeout: 50 * time.Millisecond})
	begin := func(key string) *idempotency.Attempt {
		t.Helper()
		out, err := store.Begin(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: key, Payload: []byte(key)})
		if err != nil || out.Replayed || out.Attempt == nil {
			t.Fatalf("begin %s: %+v, %v", key, out, err)
		}
		if _, err := charge(key, 1)(ctx, out.Attempt.Tx()); err != nil {
			t.Fatal(err)
		}
		return out.Attempt
	}

	a := begin("complete")
	// A duplicate waits for the open claim, then reports it in progress.
	if out, err := store.Begin(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: "complete", Payload: []byte("complete")}); !errors.Is(err, idempotency.ErrInProgress) || out != nil {
		t.Fatalf("duplicate of an open claim: %+v, %v", out, err)
	}
	if countCharges(t, db.Pool, "complete") != 0 {
		t.Fatal("the open claim's write is visible")
	}
	if _, err := a.Complete(ctx, []byte("r1")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Complete(ctx, []byte("r2")); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("second Complete: %v, want ErrTxClosed", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Errorf("Release after Complete: %v, want nil", err)
	}
	out, err := store.Begin(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: "complete", Payload: []byte("complete")})
	if err != nil || !out.Replayed || string(out.Result) != "r1" || out.Attempt != nil {
		t.Fatalf("after Complete: %+v, %v", out, err)
	}

	f := begin("fail")
	if _, err := f.Fail(ctx, &idempotency.Failure{Code: "declined", Data: []byte("d")}); err != nil {
		t.Fatal(err)
	}
	out, err = store.Begin(ctx, db.Pool, idempotency.Request{Scope: "orders", Key: "fail", Payload: []byte("fail")})
	if err != nil || !out.Replayed || out.Failure == nil || out.Failure.Code != "declined" {
		t.Fatalf("after Fail: %+v, %v", out, err)
	}

	r := begin("rollback")
	// An atomic attempt has no lease: the leased calls are refused and
	// leave it open.
	for name, call := range map[string]func() error{
		"Heartbeat":  func() error { return r.Heartbeat(ctx) },
		"Advance":    func() error { return r.Advance(ctx, "p", nil) },
		"AdvanceTx":  func() error { return r.AdvanceTx(ctx, r.Tx(), "p", nil) },
		"CompleteTx": func() error { _, err := r.CompleteTx(ctx, r.Tx(), nil); return err },
	} {
		if err := call(); !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("%s on an atomic attempt: %v, want ErrInvalid", name, err)
		}
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	again := begin("rollback")
	if _, err := again.Complete(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int{"complete": 1, "fail": 1, "rollback": 1} {
		if n := countCharges(t, db.Pool, key); n != want {
			t.Errorf("%s: %d charges, want %d", key, n, want)
		}
	}
	if n := keyRows(t, db.Pool); n != 3 {
		t.Errorf("%d keys, want 3", n)
	}
}

// TestBeginInCallerTransaction: with a pgx.Tx, Begin claims under a
// savepoint and Complete releases it; only the caller's COMMIT makes the
// claim, the write and the result durable.
func TestBeginInCallerTransaction(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	ctx := context.Background()
	store := newStore(t, nil)
	for _, commit := range []bool{false, true} {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out, err := store.Begin(ctx, tx, idempotency.Request{Scope: "orders", Key: "in-tx"})
		if err != nil || out.Replayed {
			t.Fatalf("begin: %+v, %v", out, err)
		}
		if _, err := charge("in-tx", 1)(ctx, out.Attempt.Tx()); err != nil {
			t.Fatal(err)
		}
		if _, err := out.Attempt.Complete(ctx, []byte("ok")); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := countCharges(t, db.Pool, "in-tx"); n != 1 || keyRows(t, db.Pool) != 1 {
		t.Fatalf("%d charges, %d keys; want the committed attempt only", n, keyRows(t, db.Pool))
	}
}
