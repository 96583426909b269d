package pgfence_test

import (
	"context"
	"database/sql"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "github.com/lib/pq"              // the "postgres" database/sql driver

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A connector is one way to reach the database that the guarantee tests run
// through: the writes on pgx (Write, Exec, Resolve) or on database/sql
// (WriteSQL, ExecSQL, ResolveSQL), over a driver (pgx, pgx's stdlib, lib/pq),
// on a pool, on one connection, or inside the caller's transaction. Every
// guarantee test is one body run for each connector.
type connector struct {
	name     string
	driver   string // pgx, pgx/stdlib, lib/pq
	inTx     bool   // the helpers run inside a transaction the test commits
	pipeline bool   // Exec sends the fence and the statement in one round trip (else BEGIN, both, COMMIT)
	open     func(t *testing.T, url string) fencer
}

// connectors are the drivers × handles.
var connectors = []connector{
	{name: "pgx/pool", driver: "pgx", pipeline: true, open: openPgx(false)},
	{name: "pgx/tx", driver: "pgx", inTx: true, open: openPgx(true)},
	{name: "stdlib/db", driver: "pgx/stdlib", pipeline: true, open: openSQL("pgx", handleDB)},
	{name: "stdlib/conn", driver: "pgx/stdlib", pipeline: true, open: openSQL("pgx", handleConn)},
	{name: "stdlib/tx", driver: "pgx/stdlib", inTx: true, open: openSQL("pgx", handleTx)},
	{name: "pq/db", driver: "lib/pq", open: openSQL("postgres", handleDB)},
	{name: "pq/conn", driver: "lib/pq", open: openSQL("postgres", handleConn)},
	{name: "pq/tx", driver: "lib/pq", inTx: true, open: openSQL("postgres", handleTx)},
}

// forEach runs body once per connector, each on a fresh database.
func forEach(t *testing.T, body func(t *testing.T, c connector, db *pgfencetest.Database, f fencer)) {
	for _, c := range connectors {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := pgfencetest.NewDatabase(t)
			body(t, c, db, c.open(t, db.URL))
		})
	}
}

// fencer is the writes as one connector runs them. A lease-checked write is
// a write of pgfence.Checked(lease), a bare token's a write of
// pgfence.LeaseOf(resource, "", token).
type fencer interface {
	write(ctx context.Context, lease pgfence.Lease, fn func(ctx context.Context, tx stmts) error) (pgfence.Receipt, error)
	exec(ctx context.Context, lease pgfence.Lease, query string, args ...any) (int64, error)
	resolve(ctx context.Context, e *pgfence.OutcomeUnknownError) (pgfence.Outcome, error)
}

// stmts is the transaction fn is given.
type stmts interface {
	exec(ctx context.Context, query string, args ...any) error
	queryInt(ctx context.Context, query string, args ...any) (int64, error)
}

// pgx: Write and Exec on a pool, or inside a pgx.Tx.

type pgxFencer struct {
	pool *pgxpool.Pool
	inTx bool
}

func openPgx(inTx bool) func(t *testing.T, url string) fencer {
	return func(t *testing.T, url string) fencer {
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pgxFencer{pool: pool, inTx: inTx}
	}
}

// run calls call on the pool, or in a transaction that it commits when call
// succeeded.
func (f pgxFencer) run(ctx context.Context, call func(db pgfence.DB) error) error {
	if !f.inTx {
		return call(f.pool)
	}
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		return err
	}
	if err := call(tx); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}

type pgxStmts struct{ tx pgx.Tx }

func (s pgxStmts) exec(ctx context.Context, query string, args ...any) error {
	_, err := s.tx.Exec(ctx, query, args...)
	return err
}

func (s pgxStmts) queryInt(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := s.tx.QueryRow(ctx, query, args...).Scan(&n)
	return n, err
}

func pgxFn(fn func(ctx context.Context, tx stmts) error) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, pgxStmts{tx}) }
}

func (f pgxFencer) write(ctx context.Context, lease pgfence.Lease, fn func(ctx context.Context, tx stmts) error) (r pgfence.Receipt, err error) {
	err = f.run(ctx, func(db pgfence.DB) error {
		r, err = pgfence.Write(ctx, db, lease, pgxFn(fn))
		return err
	})
	return r, err
}

func (f pgxFencer) exec(ctx context.Context, lease pgfence.Lease, query string, args ...any) (n int64, err error) {
	err = f.run(ctx, func(db pgfence.DB) error {
		n, err = pgfence.Exec(ctx, db, lease, query, args...)
		return err
	})
	return n, err
}

func (f pgxFencer) resolve(ctx context.Context, e *pgfence.OutcomeUnknownError) (pgfence.Outcome, error) {
	return pgfence.Resolve(ctx, f.pool, e)
}

// database/sql: WriteSQL and ExecSQL on a *sql.DB, a *sql.Conn or inside a
// *sql.Tx.

type handle int

const (
	handleDB handle = iota
	handleConn
	handleTx
)

type sqlFencer struct {
	db     *sql.DB
	handle handle
}

func openSQL(driverName string, h handle) func(t *testing.T, url string) fencer {
	return func(t *testing.T, url string) fencer {
		return sqlFencer{db: openDB(t, driverName, url), handle: h}
	}
}

// openDB opens a *sql.DB with the driver, closed when the test ends.
func openDB(t testing.TB, driverName, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// run calls call on the handle of the connector: the *sql.DB, a *sql.Conn it
// closes afterwards, or a *sql.Tx that it commits when call succeeded.
func (f sqlFencer) run(ctx context.Context, call func(db pgfence.SQLDB) error) error {
	switch f.handle {
	case handleConn:
		c, err := f.db.Conn(ctx)
		if err != nil {
			return err
		}
		defer c.Close()
		return call(c)
	case handleTx:
		tx, err := f.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := call(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	return call(f.db)
}

type sqlStmts struct{ tx *sql.Tx }

func (s sqlStmts) exec(ctx context.Context, query string, args ...any) error {
	_, err := s.tx.ExecContext(ctx, query, args...)
	return err
}

func (s sqlStmts) queryInt(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := s.tx.QueryRowContext(ctx, query, args...).Scan(&n)
	return n, err
}

func sqlFn(fn func(ctx context.Context, tx stmts) error) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, sqlStmts{tx}) }
}

func (f sqlFencer) write(ctx context.Context, lease pgfence.Lease, fn func(ctx context.Context, tx stmts) error) (r pgfence.Receipt, err error) {
	err = f.run(ctx, func(db pgfence.SQLDB) error {
		r, err = pgfence.WriteSQL(ctx, db, lease, sqlFn(fn))
		return err
	})
	return r, err
}

func (f sqlFencer) exec(ctx context.Context, lease pgfence.Lease, query string, args ...any) (n int64, err error) {
	err = f.run(ctx, func(db pgfence.SQLDB) error {
		n, err = pgfence.ExecSQL(ctx, db, lease, query, args...)
		return err
	})
	return n, err
}

func (f sqlFencer) resolve(ctx context.Context, e *pgfence.OutcomeUnknownError) (pgfence.Outcome, error) {
	return pgfence.ResolveSQL(ctx, f.db, e)
}

// Shared helpers.

// acquire takes lease key through SQL, as a service without the leases
// package does, and returns it.
func acquire(t testing.TB, db *pgxpool.Pool, key string) pgfence.Lease {
	t.Helper()
	var holder string
	var token int64
	if err := db.QueryRow(context.Background(), `SELECT holder::text, token FROM pgfence.acquire($1, interval '1 minute')`, key).Scan(&holder, &token); err != nil {
		t.Fatalf("grant %s: %v", key, err)
	}
	return pgfence.LeaseOf(key, holder, token)
}

// expire moves lease key's expiry into the past: the database clock decides.
func expire(t testing.TB, db *pgxpool.Pool, key string) {
	t.Helper()
	mustExec(t, db, `UPDATE pgfence.leases SET expires_at = pg_catalog.clock_timestamp() - interval '1 second',
		granted_at = pg_catalog.clock_timestamp() - interval '1 minute' WHERE key = $1`, key)
}

// newKV creates the business table the guarantee tests write: one row per
// key, with the token of its last write. Unlike setupKV, it lets kv:a's
// lease issue no token: a test issues those it needs.
func newKV(t testing.TB, db *pgxpool.Pool) {
	t.Helper()
	mustExec(t, db, `CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL, token bigint)`)
	mustExec(t, db, `INSERT INTO kv VALUES ('a', 'initial', 0)`)
}

// kvRow reads row a.
func kvRow(t testing.TB, db *pgxpool.Pool) (v string, token int64) {
	t.Helper()
	if err := db.QueryRow(context.Background(), `SELECT v, token FROM kv WHERE k = 'a'`).Scan(&v, &token); err != nil {
		t.Fatal(err)
	}
	return v, token
}

// set is a fn that writes v and token to row a.
func set(v string, token int64) func(ctx context.Context, tx stmts) error {
	return func(ctx context.Context, tx stmts) error {
		return tx.exec(ctx, `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`, v, token)
	}
}

// proxiedURL starts a fault proxy in front of db and returns its URL.
func proxiedURL(t *testing.T, db *pgfencetest.Database) (string, *faultproxy.Proxy) {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), &faultproxy.Config{CutGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	url, err := p.ConnString(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	return url, p
}
