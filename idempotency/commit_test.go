package idempotency_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// These tests cover every way the pipeline that stores an atomic attempt's
// result and commits it (Store.Do on a pool or connection) can fail, and
// check the promise of each: ErrOutcomeUnknown only when the COMMIT may have
// run, and then the same request again tells what happened; any other error
// means nothing was stored and the key is free. Either way the business write
// happens exactly once.

// throughProxy returns a connection and a pool to db through one fault proxy.
func throughProxy(t *testing.T, db *pgfencetest.Database) (*faultproxy.Proxy, map[string]idempotency.DB) {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), &faultproxy.Config{CutGrace: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	url, err := p.ConnString(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return p, map[string]idempotency.DB{"conn": conn, "pool": pool}
}

// counted wraps charge and counts its runs.
func counted(runs *atomic.Int32, orderID string) work {
	return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		runs.Add(1)
		return charge(orderID, 5)(ctx, tx)
	}
}

// TestAtomicCommitReplyLost: the connection breaks right after the result
// and COMMIT were sent, dropping the server's answer (the proxy waits until
// the server has finished the COMMIT); or a pooler answers the COMMIT it
// forwarded with its FATAL 08P01, as PgBouncer does when its server
// connection breaks. Do says the outcome is unknown; the same request again
// resolves it: it replays the committed result without running fn, and there
// is exactly one charge.
func TestAtomicCommitReplyLost(t *testing.T) {
	t.Run("closed", func(t *testing.T) { atomicCommitReplyLost(t, false) })
	t.Run("pooler-fatal", func(t *testing.T) { atomicCommitReplyLost(t, true) })
}

func atomicCommitReplyLost(t *testing.T, fatal bool) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	store := newStore(t, nil)
	ctx := context.Background()
	p, dbs := throughProxy(t, db)
	p.SetPoolerFatal(fatal)
	for name, via := range dbs {
		var runs atomic.Int32
		req := idempotency.Request{Scope: "orders", Key: "reply-lost-" + name, Payload: []byte("p")}
		trig := p.CutAfter(faultproxy.IsCommit)
		_, err := store.Do(ctx, via, req, counted(&runs, req.Key))
		<-trig.Done()
		if !trig.Fired() || !trig.Replied() {
			t.Fatalf("%s: the proxy did not forward COMMIT and drop its answer (fired %v, replied %v)", name, trig.Fired(), trig.Replied())
		}
		if !errors.Is(err, idempotency.ErrOutcomeUnknown) {
			t.Fatalf("%s: Do with a lost COMMIT answer: %v, want ErrOutcomeUnknown", name, err)
		}
		out, err := store.Do(ctx, db.Pool, req, counted(&runs, req.Key))
		if err != nil {
			t.Fatalf("%s: the same request again: %v", name, err)
		}
		if !out.Replayed || len(out.Result) == 0 || runs.Load() != 1 {
			t.Fatalf("%s: the same request again: %+v after %d runs; want the stored result replayed after 1", name, out, runs.Load())
		}
		if n := countCharges(t, db.Pool, req.Key); n != 1 {
			t.Fatalf("%s: %d charges, want exactly 1", name, n)
		}
	}
}

// TestPoolerFatalBeforeCommit: a pooler's FATAL 08P01 in answer to the
// claim (BEGIN travels with it), before anything that could commit was sent,
// means nothing happened: ErrUnavailable, never an unknown outcome, fn did
// not run and the key is free.
func TestPoolerFatalBeforeCommit(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	store := newStore(t, nil)
	ctx := context.Background()
	p, dbs := throughProxy(t, db)
	p.SetPoolerFatal(true)
	for name, via := range dbs {
		var runs atomic.Int32
		req := idempotency.Request{Scope: "orders", Key: "claim-refused-" + name, Payload: []byte("p")}
		trig := p.CutBefore(faultproxy.SQLContains("idempotency_claim_atomic"))
		_, err := store.Do(ctx, via, req, counted(&runs, req.Key))
		<-trig.Done()
		if !trig.Fired() || !errors.Is(err, idempotency.ErrUnavailable) || errors.Is(err, idempotency.ErrOutcomeUnknown) {
			t.Fatalf("%s: Do whose claim the pooler refused (cut %v): %v, want ErrUnavailable", name, trig.Fired(), err)
		}
		out, err := store.Do(ctx, db.Pool, req, counted(&runs, req.Key))
		if err != nil || out.Replayed || runs.Load() != 1 || countCharges(t, db.Pool, req.Key) != 1 {
			t.Fatalf("%s: the same request again: %+v, %v after %d runs; want New, run once", name, out, err, runs.Load())
		}
	}
}

// TestAtomicCommitRequestLost: the connection breaks after the result was
// sent but before the COMMIT reached the server. Do cannot know which, so the
// outcome is unknown; the same request again finds the key free and applies
// the intent (once).
func TestAtomicCommitRequestLost(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	store := newStore(t, nil)
	ctx := context.Background()
	p, dbs := throughProxy(t, db)
	for name, via := range dbs {
		var runs atomic.Int32
		req := idempotency.Request{Scope: "orders", Key: "commit-lost-" + name, Payload: []byte("p")}
		trig := p.CutBefore(faultproxy.IsCommit)
		_, err := store.Do(ctx, via, req, counted(&runs, req.Key))
		<-trig.Done()
		if !trig.Fired() {
			t.Fatalf("%s: the proxy did not cut before COMMIT", name)
		}
		if !errors.Is(err, idempotency.ErrOutcomeUnknown) {
			t.Fatalf("%s: Do with a lost COMMIT: %v, want ErrOutcomeUnknown", name, err)
		}
		out, err := store.Do(ctx, db.Pool, req, counted(&runs, req.Key))
		if err != nil || out.Replayed {
			t.Fatalf("%s: the same request again: %+v, %v; want New (nothing had committed)", name, out, err)
		}
		if runs.Load() != 2 || countCharges(t, db.Pool, req.Key) != 1 {
			t.Fatalf("%s: fn ran %d times, %d charges; want 2 and 1", name, runs.Load(), countCharges(t, db.Pool, req.Key))
		}
	}
}

// TestAtomicCancelledWhileCommitting: the caller's context ends while Do
// waits for the answer to a COMMIT the server has run. The outcome is unknown
// (not context.Canceled alone, which would read as "not applied"); the same
// request again replays.
func TestAtomicCancelledWhileCommitting(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	store := newStore(t, nil)
	p, dbs := throughProxy(t, db)
	for name, via := range dbs {
		// A first Do prepares the statements on the connection, so the
		// next one sends its result and COMMIT without asking first.
		if _, err := store.Do(context.Background(), via, idempotency.Request{Scope: "orders", Key: "warm-" + name}, charge("warm", 1)); err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		req := idempotency.Request{Scope: "orders", Key: "cancelled-" + name, Payload: []byte("p")}
		ctx, cancel := context.WithCancel(context.Background())
		committed := make(chan error, 1)
		_, err := store.Do(ctx, via, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			res, err := counted(&runs, req.Key)(ctx, tx)
			// From now on the server's answers are swallowed; once the
			// backend has committed (idle, no transaction), cancel.
			pid := tx.Conn().PgConn().PID()
			p.SetBlackhole(faultproxy.ServerToClient, true)
			go func() {
				defer cancel()
				committed <- waitIdle(db.Pool, pid)
			}()
			return res, err
		})
		if werr := <-committed; werr != nil {
			t.Fatal(werr)
		}
		p.SetBlackhole(faultproxy.ServerToClient, false)
		if !errors.Is(err, idempotency.ErrOutcomeUnknown) {
			t.Fatalf("%s: Do cancelled during its COMMIT: %v, want ErrOutcomeUnknown", name, err)
		}
		out, err := store.Do(context.Background(), db.Pool, req, counted(&runs, req.Key))
		if err != nil || !out.Replayed {
			t.Fatalf("%s: the same request again: %+v, %v; want Replayed", name, out, err)
		}
		if runs.Load() != 1 || countCharges(t, db.Pool, req.Key) != 1 {
			t.Fatalf("%s: fn ran %d times, %d charges; want 1 and 1", name, runs.Load(), countCharges(t, db.Pool, req.Key))
		}
	}
}

// waitIdle waits until backend pid has no open transaction.
func waitIdle(pool *pgxpool.Pool, pid uint32) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		var idle bool
		err := pool.QueryRow(ctx, `SELECT state = 'idle' AND xact_start IS NULL FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&idle)
		if err != nil || idle {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAtomicCancelledBeforeCommit: a context that ends before the pipeline is
// sent returns the context's error, stores nothing and leaves the key free.
func TestAtomicCancelledBeforeCommit(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	store := newStore(t, nil)
	var runs atomic.Int32
	req := idempotency.Request{Scope: "orders", Key: "cancelled-early", Payload: []byte("p")}
	ctx, cancel := context.WithCancel(context.Background())
	_, err := store.Do(ctx, pool, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		defer cancel()
		return counted(&runs, req.Key)(ctx, tx)
	})
	if !errors.Is(err, context.Canceled) || errors.Is(err, idempotency.ErrOutcomeUnknown) {
		t.Fatalf("Do cancelled before its COMMIT: %v, want context.Canceled and not ErrOutcomeUnknown", err)
	}
	if n := keyRows(t, pool); n != 0 || countCharges(t, pool, req.Key) != 0 {
		t.Fatalf("after a cancelled attempt: %d keys, %d charges; want none", n, countCharges(t, pool, req.Key))
	}
	out, err := store.Do(context.Background(), pool, req, counted(&runs, req.Key))
	if err != nil || out.Replayed || countCharges(t, pool, req.Key) != 1 {
		t.Fatalf("retry: %+v, %v, %d charges; want New and one charge", out, err, countCharges(t, pool, req.Key))
	}
}

// TestAtomicCompletionRefused: the server refuses the statement that stores
// the result (here: fn swallowed an error, so the transaction is aborted).
// The COMMIT in the same pipeline is skipped; Do returns the server's error,
// not ErrOutcomeUnknown, and nothing is stored.
func TestAtomicCompletionRefused(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	store := newStore(t, nil)
	ctx := context.Background()
	req := idempotency.Request{Scope: "orders", Key: "aborted", Payload: []byte("p")}
	_, err := store.Do(ctx, pool, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		res, err := charge(req.Key, 5)(ctx, tx)
		_, _ = tx.Exec(ctx, `SELECT 1/0`) // a bug: the error is dropped
		return res, err
	})
	if errors.Is(err, idempotency.ErrOutcomeUnknown) || pgerr.Code(err) != "25P02" {
		t.Fatalf("Do whose transaction was aborted: %v, want the server's 25P02", err)
	}
	if n := keyRows(t, pool); n != 0 || countCharges(t, pool, req.Key) != 0 {
		t.Fatalf("after a refused completion: %d keys, %d charges; want none", n, countCharges(t, pool, req.Key))
	}
	if out, err := store.Do(ctx, pool, req, charge(req.Key, 5)); err != nil || out.Replayed {
		t.Fatalf("retry: %+v, %v; want New", out, err)
	}
}

// TestAtomicCommitRefused: the server refuses the COMMIT itself (a deferred
// constraint). Do returns the server's error, not ErrOutcomeUnknown, and the
// stored result is rolled back with fn's writes.
func TestAtomicCommitRefused(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	store := newStore(t, nil)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id int, CONSTRAINT ledger_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED);
INSERT INTO ledger VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	book := func(id int) work {
		return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, id)
			return []byte("booked"), err
		}
	}
	req := idempotency.Request{Scope: "ledger", Key: "deferred", Payload: []byte("p")}
	_, err := store.Do(ctx, pool, req, book(1))
	if errors.Is(err, idempotency.ErrOutcomeUnknown) || pgerr.Code(err) != pgerr.CodeUniqueViolation {
		t.Fatalf("Do whose COMMIT fails a deferred constraint: %v, want the server's 23505", err)
	}
	if n := keyRows(t, pool); n != 0 {
		t.Fatalf("after a refused COMMIT: %d keys; want none", n)
	}
	if out, err := store.Do(ctx, pool, req, book(2)); err != nil || out.Replayed {
		t.Fatalf("retry: %+v, %v; want New", out, err)
	}
}

// TestAtomicCompletionNotPrepared: on a connection new to the completion,
// pgx prepares it in a round trip of its own before it sends the completion
// and the COMMIT. The caller's deadline passes while that round trip waits
// for its reply: nothing was executed, so Do reports the deadline (not
// ErrOutcomeUnknown), and the key is free.
func TestAtomicCompletionNotPrepared(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	store := newStore(t, nil)
	p, dbs := throughProxy(t, db) // new connections: nothing prepared yet
	for name, via := range dbs {
		req := idempotency.Request{Scope: "orders", Key: "unprepared-" + name, Payload: []byte("p")}
		out, err := store.Begin(context.Background(), via, req)
		if err != nil || out.Attempt == nil {
			t.Fatalf("%s: Begin: %+v, %v", name, out, err)
		}
		if _, err := charge(req.Key, 5)(context.Background(), out.Attempt.Tx()); err != nil {
			t.Fatal(err)
		}
		p.SetHold(faultproxy.ServerToClient, true)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err = out.Attempt.Complete(ctx, []byte("r"))
		cancel()
		p.SetHold(faultproxy.ServerToClient, false)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, idempotency.ErrOutcomeUnknown) {
			t.Fatalf("%s: Complete whose deadline passed in the completion's preparation: %v, want context.DeadlineExceeded and not ErrOutcomeUnknown", name, err)
		}
		again, err := store.Do(context.Background(), db.Pool, req, charge(req.Key, 5))
		if err != nil || again.Replayed || countCharges(t, db.Pool, req.Key) != 1 {
			t.Fatalf("%s: the same request again: %+v, %v, %d charges; want New and one charge", name, again, err, countCharges(t, db.Pool, req.Key))
		}
	}
}

// TestAtomicSavepointReleaseLost: in the caller's transaction the attempt is
// a savepoint, released by Complete. The connection breaks before the
// RELEASE reaches the server: the caller's transaction can no longer commit,
// so nothing was stored and the error is not an unknown outcome.
func TestAtomicSavepointReleaseLost(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	store := newStore(t, nil)
	ctx := context.Background()
	p, dbs := throughProxy(t, db)
	tx, err := dbs["pool"].Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	req := idempotency.Request{Scope: "orders", Key: "savepoint-lost", Payload: []byte("p")}
	out, err := store.Begin(ctx, tx, req)
	if err != nil || out.Attempt == nil {
		t.Fatalf("Begin in the caller's transaction: %+v, %v", out, err)
	}
	if _, err := charge(req.Key, 5)(ctx, out.Attempt.Tx()); err != nil {
		t.Fatal(err)
	}
	trig := p.CutBefore(faultproxy.SQLContains("release savepoint"))
	_, err = out.Attempt.Complete(ctx, []byte("r"))
	<-trig.Done()
	if !trig.Fired() {
		t.Fatal("the proxy did not cut before the savepoint's release")
	}
	if err == nil || errors.Is(err, idempotency.ErrOutcomeUnknown) {
		t.Fatalf("Complete whose savepoint release was lost: %v, want an error that is not ErrOutcomeUnknown", err)
	}
	again, err := store.Do(ctx, db.Pool, req, charge(req.Key, 5))
	if err != nil || again.Replayed || countCharges(t, db.Pool, req.Key) != 1 {
		t.Fatalf("the same request again: %+v, %v, %d charges; want New and one charge", again, err, countCharges(t, db.Pool, req.Key))
	}
}
