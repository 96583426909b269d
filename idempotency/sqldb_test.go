package idempotency_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "github.com/lib/pq"              // the "postgres" database/sql driver

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// An atomicConnector runs Store.Do (pgx) or Store.DoSQL (database/sql, over
// pgx's stdlib or lib/pq), on a pool or inside a transaction the test
// commits. The duplicate-intent tests are one body run for each.
type atomicConnector struct {
	name string
	inTx bool
	// do runs fn once for req; insert is fn's statement's runner.
	open func(t *testing.T, url string) atomicDo
}

// atomicDo runs one intent: fn is given insert, which runs one statement
// in the claim's transaction and returns the id it RETURNING-s.
type atomicDo func(ctx context.Context, store *idempotency.Store, req idempotency.Request, fn func(ctx context.Context, insert func(query string, args ...any) (int64, error)) ([]byte, error)) (*idempotency.Outcome, error)

var atomicConnectors = []atomicConnector{
	{name: "pgx/pool", open: pgxDo(false)},
	{name: "pgx/tx", inTx: true, open: pgxDo(true)},
	{name: "stdlib/db", open: sqlDo("pgx", false)},
	{name: "stdlib/tx", inTx: true, open: sqlDo("pgx", true)},
	{name: "pq/db", open: sqlDo("postgres", false)},
	{name: "pq/tx", inTx: true, open: sqlDo("postgres", true)},
}

func pgxDo(inTx bool) func(t *testing.T, url string) atomicDo {
	return func(t *testing.T, url string) atomicDo {
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return func(ctx context.Context, store *idempotency.Store, req idempotency.Request, fn func(context.Context, func(string, ...any) (int64, error)) ([]byte, error)) (*idempotency.Outcome, error) {
			run := func(db idempotency.DB) (*idempotency.Outcome, error) {
				return store.Do(ctx, db, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
					return fn(ctx, func(query string, args ...any) (id int64, err error) {
						err = tx.QueryRow(ctx, query, args...).Scan(&id)
						return id, err
					})
				})
			}
			if !inTx {
				return run(pool)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			out, err := run(tx)
			if err != nil {
				_ = tx.Rollback(ctx)
				return out, err
			}
			return out, tx.Commit(ctx)
		}
	}
}

func sqlDo(driverName string, inTx bool) func(t *testing.T, url string) atomicDo {
	return func(t *testing.T, url string) atomicDo {
		db, err := sql.Open(driverName, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return func(ctx context.Context, store *idempotency.Store, req idempotency.Request, fn func(context.Context, func(string, ...any) (int64, error)) ([]byte, error)) (*idempotency.Outcome, error) {
			run := func(h idempotency.SQLDB) (*idempotency.Outcome, error) {
				return store.DoSQL(ctx, h, req, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
					return fn(ctx, func(query string, args ...any) (id int64, err error) {
						err = tx.QueryRowContext(ctx, query, args...).Scan(&id)
						return id, err
					})
				})
			}
			if !inTx {
				return run(db)
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, err
			}
			out, err := run(tx)
			if err != nil {
				_ = tx.Rollback()
				return out, err
			}
			return out, tx.Commit()
		}
	}
}

// chargeOnce inserts one charge for orderID and returns its id as the
// result, counting its runs.
func chargeOnce(runs *atomic.Int32, orderID string) func(context.Context, func(string, ...any) (int64, error)) ([]byte, error) {
	return func(_ context.Context, insert func(string, ...any) (int64, error)) ([]byte, error) {
		runs.Add(1)
		id, err := insert(`INSERT INTO charges (order_id, amount) VALUES ($1, 5) RETURNING id`, orderID)
		if err != nil {
			return nil, err
		}
		return []byte(strconv.FormatInt(id, 10)), nil
	}
}

// One business intent takes effect once through every adapter and driver:
// concurrent duplicates and later retries get the first result and never run
// fn again; another payload is refused; a transient failure stores nothing;
// a permanent one is replayed.
// sqlDrivers are the database/sql drivers the DoSQL tests run with: pgx's
// stdlib driver and lib/pq.
var sqlDrivers = []string{"pgx", "postgres"}

// openSQLDB opens url with driverName, closed when t ends.
func openSQLDB(t *testing.T, driverName, url string) *sql.DB {
	t.Helper()
	sdb, err := sql.Open(driverName, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sdb.Close() })
	return sdb
}

func TestDuplicateIntentOnce(t *testing.T) {
	for _, c := range atomicConnectors {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgfencetest.NewDatabase(t)
			createCharges(t, db.Pool)
			store := newStore(t, nil)
			do := c.open(t, db.URL)

			var runs atomic.Int32
			req := idempotency.Request{Scope: "orders", Key: "order-1:charge", Payload: []byte(`{"amount":5}`)}
			const n = 8
			outs := make([]*idempotency.Outcome, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { outs[i], errs[i] = do(ctx, store, req, chargeOnce(&runs, "order-1")) })
			}
			wg.Wait()
			var first []byte
			news := 0
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("duplicate %d: %v", i, errs[i])
				}
				if !outs[i].Replayed {
					news++
				}
				if first == nil {
					first = outs[i].Result
				}
				if string(outs[i].Result) != string(first) {
					t.Errorf("duplicate %d got %q, another %q", i, outs[i].Result, first)
				}
			}
			if news != 1 || runs.Load() != 1 || countCharges(t, db.Pool, "order-1") != 1 {
				t.Fatalf("%d duplicates: %d new, fn ran %d times, %d charges; want 1 each", n, news, runs.Load(), countCharges(t, db.Pool, "order-1"))
			}
			out, err := do(ctx, store, req, chargeOnce(&runs, "order-1"))
			if err != nil || !out.Replayed || string(out.Result) != string(first) || runs.Load() != 1 {
				t.Fatalf("retry: %+v, %v (fn ran %d times)", out, err, runs.Load())
			}
			other := req
			other.Payload = []byte(`{"amount":6}`)
			if out, err := do(ctx, store, other, chargeOnce(&runs, "order-1")); !errors.Is(err, idempotency.ErrMismatch) || out != nil {
				t.Fatalf("another payload: %+v, %v; want Mismatch", out, err)
			}

			// Transient: nothing stored, the key is free.
			req2 := idempotency.Request{Scope: "orders", Key: "order-2:charge"}
			boom := errors.New("payment service down")
			if _, err := do(ctx, store, req2, func(ctx context.Context, insert func(string, ...any) (int64, error)) ([]byte, error) {
				if _, err := chargeOnce(&runs, "order-2")(ctx, insert); err != nil {
					return nil, err
				}
				return nil, boom
			}); !errors.Is(err, boom) {
				t.Fatalf("transient failure: %v", err)
			}
			if out, err := do(ctx, store, req2, chargeOnce(&runs, "order-2")); err != nil || out.Replayed {
				t.Fatalf("after a transient failure: %+v, %v; want New", out, err)
			}
			if got := countCharges(t, db.Pool, "order-2"); got != 1 {
				t.Fatalf("order-2: %d charges, want 1", got)
			}

			// Permanent: stored and replayed, its writes rolled back.
			req3 := idempotency.Request{Scope: "orders", Key: "order-3:charge"}
			declined := func(ctx context.Context, insert func(string, ...any) (int64, error)) ([]byte, error) {
				if _, err := chargeOnce(&runs, "order-3")(ctx, insert); err != nil {
					return nil, err
				}
				return nil, &idempotency.Failure{Code: "declined", Message: "card declined"}
			}
			if out, err := do(ctx, store, req3, declined); err != nil || out.Replayed || out.Failure == nil || out.Failure.Code != "declined" {
				t.Fatalf("permanent failure: %+v, %v", out, err)
			}
			if out, err := do(ctx, store, req3, declined); err != nil || !out.Replayed || out.Failure == nil || out.Failure.Code != "declined" {
				t.Fatalf("permanent failure replayed: %+v, %v", out, err)
			}
			if got := countCharges(t, db.Pool, "order-3"); got != 0 {
				t.Fatalf("order-3: %d charges after a permanent failure, want 0", got)
			}
		})
	}
}

// Inside the caller's database/sql transaction the key, the intent's writes
// and the caller's other writes commit together, or not at all: a caller that
// rolls back leaves the key free.
func TestDoSQLInCallerTransaction(t *testing.T) {
	for _, driverName := range sqlDrivers {
		t.Run(driverName, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgfencetest.NewDatabase(t)
			createCharges(t, db.Pool)
			store := newStore(t, nil)
			sdb := openSQLDB(t, driverName, db.URL)
			req := idempotency.Request{Scope: "orders", Key: "order-1:charge"}
			var runs atomic.Int32
			fn := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				runs.Add(1)
				_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES ('order-1', 5)`)
				return []byte("charged"), err
			}
			for _, commit := range []bool{false, true} {
				tx, err := sdb.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES ('caller', 1)`); err != nil {
					t.Fatal(err)
				}
				out, err := store.DoSQL(ctx, tx, req, fn)
				if err != nil || out.Replayed {
					t.Fatalf("DoSQL in the caller's transaction: %+v, %v", out, err)
				}
				if commit {
					err = tx.Commit()
				} else {
					err = tx.Rollback()
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if runs.Load() != 2 || countCharges(t, db.Pool, "order-1") != 1 || countCharges(t, db.Pool, "caller") != 1 || keyRows(t, db.Pool) != 1 {
				t.Fatalf("fn ran %d times, %d charges, %d caller rows, %d keys; want 2, 1, 1, 1 (the rolled-back attempt left nothing)",
					runs.Load(), countCharges(t, db.Pool, "order-1"), countCharges(t, db.Pool, "caller"), keyRows(t, db.Pool))
			}
			out, err := store.DoSQL(ctx, sdb, req, fn)
			if err != nil || !out.Replayed || string(out.Result) != "charged" || runs.Load() != 2 {
				t.Fatalf("retry after the commit: %+v, %v", out, err)
			}

			// A caller's transaction that is not READ COMMITTED is refused
			// before anything is written.
			tx, err := sdb.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := store.DoSQL(ctx, tx, idempotency.Request{Scope: "orders", Key: "rr"}, fn); !errors.Is(err, idempotency.ErrIsolation) {
				t.Fatalf("REPEATABLE READ caller: %v, want ErrIsolation", err)
			}
		})
	}
}

// A COMMIT whose answer is lost is an unknown outcome whichever driver sent
// it (lib/pq's driver.ErrBadConn included) and however the connection failed
// (closed, or answered by a pooler's FATAL 08P01), and the same request again
// resolves it: the committed result is replayed without running fn; a lost
// COMMIT leaves the key free and fn runs once more. One charge either way.
func TestDoSQLCommitLost(t *testing.T) {
	for _, driverName := range sqlDrivers {
		for _, fatal := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/pooler-fatal=%v", driverName, fatal), func(t *testing.T) {
				t.Parallel()
				doSQLCommitLost(t, driverName, fatal)
			})
		}
	}
}

func doSQLCommitLost(t *testing.T, driverName string, fatal bool) {
	ctx := context.Background()
	db, p, sdb := proxiedSQLDB(t, driverName)
	p.SetPoolerFatal(fatal)
	store := newStore(t, nil)
	for _, c := range []struct {
		cut     func(func(faultproxy.Message) bool) *faultproxy.Trigger
		replay  bool
		orderID string
	}{{p.CutAfter, true, "reply-lost"}, {p.CutBefore, false, "commit-lost"}} {
		var runs atomic.Int32
		fn := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
			runs.Add(1)
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES ($1, 5)`, c.orderID)
			return []byte("ok"), err
		}
		req := idempotency.Request{Scope: "orders", Key: c.orderID}
		trig := c.cut(faultproxy.IsCommit)
		_, err := store.DoSQL(ctx, sdb, req, fn)
		<-trig.Done()
		if !errors.Is(err, idempotency.ErrOutcomeUnknown) || errors.Is(err, idempotency.ErrUnavailable) {
			t.Fatalf("%s: %v, want ErrOutcomeUnknown", c.orderID, err)
		}
		out, err := store.DoSQL(ctx, sdb, req, fn)
		if err != nil || out.Replayed != c.replay || string(out.Result) != "ok" {
			t.Fatalf("%s, the same request again: %+v, %v; want replayed %v", c.orderID, out, err, c.replay)
		}
		if got := countCharges(t, db.Pool, c.orderID); got != 1 {
			t.Fatalf("%s: %d charges, want 1", c.orderID, got)
		}
	}
}

// A fenced write inside DoSQL, both in the caller's transaction (the HTTP
// handler of an API that owns its rows by lease): when the fence refuses the
// write, DoSQL's attempt rolls back entirely, the key stays free and the
// caller's transaction stays usable; when it accepts, the key, the write and
// the caller's work commit together.
func TestDoSQLWithFencedWriteInCallerTransaction(t *testing.T) {
	for _, driverName := range sqlDrivers {
		t.Run(driverName, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgfencetest.NewDatabase(t)
			createCharges(t, db.Pool)
			pgfencetest.IssueToken(t, db.Pool, "orders/order-1", 10)
			if _, err := db.Pool.Exec(ctx, `SELECT pgfence.fence('orders/order-1', 5)`); err != nil {
				t.Fatal(err)
			}
			store := newStore(t, nil)
			sdb := openSQLDB(t, driverName, db.URL)
			req := idempotency.Request{Scope: "orders", Key: "order-1:charge"}
			attempt := func(token int64) error {
				tx, err := sdb.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				_, err = store.DoSQL(ctx, tx, req, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
					_, err := pgfence.WriteSQL(ctx, tx, pgfence.LeaseOf("orders/order-1", "", token), func(ctx context.Context, tx *sql.Tx) error {
						_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES ('order-1', 5)`)
						return err
					})
					return []byte("charged"), err
				})
				// The caller's transaction is usable either way.
				if _, cerr := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES ('caller', 1)`); cerr != nil {
					return errors.Join(err, cerr)
				}
				if cerr := tx.Commit(); cerr != nil {
					return errors.Join(err, cerr)
				}
				return err
			}
			if err := attempt(4); !errors.Is(err, pgfence.ErrStaleToken) {
				t.Fatalf("stale attempt: %v, want ErrStaleToken", err)
			}
			if n := keyRows(t, db.Pool); n != 0 || countCharges(t, db.Pool, "order-1") != 0 || countCharges(t, db.Pool, "caller") != 1 {
				t.Fatalf("after the stale attempt: %d keys, %d charges, %d caller rows; want 0, 0, 1", n, countCharges(t, db.Pool, "order-1"), countCharges(t, db.Pool, "caller"))
			}
			if err := attempt(6); err != nil {
				t.Fatalf("current attempt: %v", err)
			}
			if n := keyRows(t, db.Pool); n != 1 || countCharges(t, db.Pool, "order-1") != 1 || countCharges(t, db.Pool, "caller") != 2 {
				t.Fatalf("after the current attempt: %d keys, %d charges, %d caller rows; want 1, 1, 2", n, countCharges(t, db.Pool, "order-1"), countCharges(t, db.Pool, "caller"))
			}
		})
	}
}

// Bad input and broken handles give a clear error and write nothing, with
// either driver: a closed *sql.DB, a transaction already aborted by a failed
// statement, an argument the driver cannot send (an error of the driver, not
// of PostgreSQL), a handle of another type. None is an unknown outcome, and
// the key stays free for a retry.
func TestDoSQLBadInputWritesNothing(t *testing.T) {
	for _, driverName := range sqlDrivers {
		t.Run(driverName, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgfencetest.NewDatabase(t)
			createCharges(t, db.Pool)
			store := newStore(t, nil)
			sdb := openSQLDB(t, driverName, db.URL)
			req := idempotency.Request{Scope: "orders", Key: "order-1:charge"}
			var runs atomic.Int32
			fn := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				runs.Add(1)
				_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES ('order-1', 5)`)
				return []byte("charged"), err
			}
			known := func(what string, err error) {
				t.Helper()
				if err == nil || errors.Is(err, idempotency.ErrOutcomeUnknown) {
					t.Errorf("%s: %v, want a known failure", what, err)
				}
			}

			// A closed *sql.DB: database/sql's error.
			closed, err := sql.Open(driverName, db.URL)
			if err != nil {
				t.Fatal(err)
			}
			_ = closed.Close()
			_, err = store.DoSQL(ctx, closed, req, fn)
			if known("closed *sql.DB", err); err != nil && !strings.Contains(err.Error(), "database is closed") {
				t.Errorf("closed *sql.DB: %v, want database/sql's error", err)
			}

			// A transaction already aborted: the server's 25P02.
			tx, err := sdb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, `SELECT 1 / 0`); err == nil {
				t.Fatal("1 / 0 succeeded")
			}
			_, err = store.DoSQL(ctx, tx, req, fn)
			if known("aborted transaction", err); pgerr.Code(err) != "25P02" {
				t.Errorf("aborted transaction: %v, want the server's 25P02", err)
			}
			_ = tx.Rollback()

			// An argument the driver cannot encode: the driver's error, on a
			// pool and inside the caller's transaction.
			bad := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES ($1, 5)`, make(chan int))
				return nil, err
			}
			_, err = store.DoSQL(ctx, sdb, req, bad)
			if known("unencodable argument on a *sql.DB", err); pgerr.Code(err) != "" {
				t.Errorf("unencodable argument on a *sql.DB: %v, want the driver's error", err)
			}
			tx, err = sdb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = store.DoSQL(ctx, tx, req, bad)
			if known("unencodable argument in the caller's transaction", err); pgerr.Code(err) != "" {
				t.Errorf("unencodable argument in the caller's transaction: %v, want the driver's error", err)
			}
			_ = tx.Rollback()

			// A handle that is not database/sql's, and a nil one.
			for name, h := range map[string]idempotency.SQLDB{"a wrapper type": fakeSQLDB{sdb}, "nil *sql.DB": (*sql.DB)(nil)} {
				if _, err := store.DoSQL(ctx, h, req, fn); !errors.Is(err, idempotency.ErrInvalid) {
					t.Errorf("%s: %v, want ErrInvalid", name, err)
				}
			}

			if runs.Load() != 0 || keyRows(t, db.Pool) != 0 || countCharges(t, db.Pool, "order-1") != 0 {
				t.Fatalf("fn ran %d times, %d keys, %d charges; want nothing", runs.Load(), keyRows(t, db.Pool), countCharges(t, db.Pool, "order-1"))
			}
			// The key is free: the same request succeeds once.
			if out, err := store.DoSQL(ctx, sdb, req, fn); err != nil || out.Replayed {
				t.Fatalf("the request after the failures: %+v, %v", out, err)
			}
		})
	}
}

// fakeSQLDB has the methods of an SQLDB but is no database/sql handle.
type fakeSQLDB struct{ db *sql.DB }

func (f fakeSQLDB) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return f.db.ExecContext(ctx, query, args...)
}

func (f fakeSQLDB) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return f.db.QueryRowContext(ctx, query, args...)
}

// In the caller's *sql.Tx the attempt is a savepoint; a connection that
// breaks before its RELEASE leaves the caller's transaction unable to
// commit: nothing was stored, and the error is not an unknown outcome.
func TestDoSQLSavepointReleaseLost(t *testing.T) {
	for _, driverName := range sqlDrivers {
		t.Run(driverName, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, p, sdb := proxiedSQLDB(t, driverName)
			store := newStore(t, nil)
			tx, err := sdb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			req := idempotency.Request{Scope: "orders", Key: "sp-lost"}
			trig := p.CutBefore(faultproxy.SQLContains("release savepoint"))
			_, err = store.DoSQL(ctx, tx, req, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES ('sp-lost', 5)`)
				return []byte("ok"), err
			})
			<-trig.Done()
			if !trig.Fired() {
				t.Fatal("the proxy did not cut before the savepoint's release")
			}
			if err == nil || errors.Is(err, idempotency.ErrOutcomeUnknown) {
				t.Fatalf("DoSQL whose savepoint release was lost: %v, want an error that is not ErrOutcomeUnknown", err)
			}
			if got := countCharges(t, db.Pool, "sp-lost"); got != 0 {
				t.Fatalf("%d charges, want 0", got)
			}
		})
	}
}

// proxiedSQLDB returns a database with the charges table, a fault proxy in
// front of it and a database/sql handle of driverName through the proxy.
func proxiedSQLDB(t *testing.T, driverName string) (*pgfencetest.Database, *faultproxy.Proxy, *sql.DB) {
	t.Helper()
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	p, _ := throughProxy(t, db)
	url, err := p.ConnString(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	return db, p, openSQLDB(t, driverName, url)
}
