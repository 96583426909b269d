package pgfence_test

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

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// proxied returns a connection to db through a fault proxy.
func proxied(t *testing.T, db *pgfencetest.Database) (*pgx.Conn, *faultproxy.Proxy) {
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
	conn, err := pgx.Connect(testContext(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn, p
}

func kvValue(t *testing.T, db pgfence.DB) string {
	t.Helper()
	var v string
	if err := db.QueryRow(context.Background(), `SELECT v FROM kv WHERE k = 'a'`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// A write whose COMMIT reaches the server but whose answer is lost returns
// ErrOutcomeUnknown; Resolve reads back that it was applied. A COMMIT that
// never reaches the server is resolved as not applied; a resolved write that a
// newer token overwrote is superseded.
func TestOutcomeUnknown(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	setupKV(t, db.Pool)
	set := func(v string, token int64) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`, v, token)
			return err
		}
	}
	resolve := func(err error) pgfence.Outcome {
		t.Helper()
		var unknown *pgfence.OutcomeUnknownError
		if !errors.As(err, &unknown) || !errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Fatalf("want *OutcomeUnknownError, got %v", err)
		}
		o, rerr := pgfence.Resolve(ctx, db.Pool, unknown)
		if rerr != nil {
			t.Fatal(rerr)
		}
		return o
	}

	// Reply lost: the server committed.
	conn, p := proxied(t, db)
	trig := p.CutAfter(faultproxy.IsCommit)
	_, err := pgfence.Write(ctx, conn, pgfence.LeaseOf("kv:a", "", 10), set("lost reply", 10))
	<-trig.Done()
	if !trig.Fired() || !trig.Replied() {
		t.Fatalf("the proxy did not forward COMMIT and drop its answer (fired %v replied %v)", trig.Fired(), trig.Replied())
	}
	if o := resolve(err); o != pgfence.Applied {
		t.Fatalf("lost reply: resolved %v, want applied", o)
	}
	if v := kvValue(t, db.Pool); v != "lost reply" {
		t.Fatalf("row %q", v)
	}
	unknownApplied := err

	// Request lost: COMMIT never reached the server.
	conn, p = proxied(t, db)
	trig = p.CutBefore(faultproxy.IsCommit)
	_, err = pgfence.Write(ctx, conn, pgfence.LeaseOf("kv:a", "", 11), set("lost commit", 11))
	<-trig.Done()
	if o := resolve(err); o != pgfence.NotApplied {
		t.Fatalf("lost commit: resolved %v, want not applied", o)
	}
	if v := kvValue(t, db.Pool); v != "lost reply" {
		t.Fatalf("row %q after a lost commit", v)
	}

	// Exec: one pipeline, committed at its Sync; the connection is cut right
	// after the Sync is forwarded, and the proxy waits until the server has
	// finished it. Resolve must say applied, and the business row agree.
	for i := range 5 {
		token := int64(12 + i)
		conn, p = proxied(t, db)
		trig = p.CutAfter(faultproxy.SQLContains("UPDATE kv"))
		_, err = pgfence.Exec(ctx, conn, pgfence.LeaseOf("kv:a", "", token), `UPDATE kv SET v = 'exec', token = $1 WHERE k = 'a'`, token)
		<-trig.Done()
		o := resolve(err)
		var rowToken int64
		if err := db.Pool.QueryRow(ctx, `SELECT token FROM kv WHERE k = 'a'`).Scan(&rowToken); err != nil {
			t.Fatal(err)
		}
		if !trig.Replied() || o != pgfence.Applied || rowToken != token {
			t.Fatalf("Exec with a lost reply: server finished %v, resolved %v, the row carries token %d (write had %d)",
				trig.Replied(), o, rowToken, token)
		}
	}

	// The first write is overwritten by a newer token.
	if _, err := pgfence.Exec(ctx, db.Pool, pgfence.LeaseOf("kv:a", "", 20), `UPDATE kv SET v = 'newer', token = 20 WHERE k = 'a'`); err != nil {
		t.Fatal(err)
	}
	if o := resolve(unknownApplied); o != pgfence.Superseded {
		t.Fatalf("overwritten write: resolved %v, want superseded", o)
	}
	// Never fenced at all.
	never := &pgfence.OutcomeUnknownError{Resource: "never", Token: 1, Op: pgfence.OpID{1}}
	if o, err := pgfence.Resolve(ctx, db.Pool, never); err != nil || o != pgfence.NotApplied {
		t.Fatalf("unknown resource: %v %v", o, err)
	}
	// Without the write's operation id nothing can be abandoned, so no
	// answer would be final.
	if o, err := pgfence.Resolve(ctx, db.Pool, &pgfence.OutcomeUnknownError{Resource: "never", Token: 1}); !errors.Is(err, pgfence.ErrInvalid) {
		t.Fatalf("write without an operation id: %v %v, want ErrInvalid", o, err)
	}
}

// Resolve waits for a transaction that still holds the fence row, so it never
// answers "not applied" for a write that commits a moment later.
func TestResolveWaitsForWriter(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	issue(t, pool, "new", "existing")
	for i, resource := range []string{"new", "existing"} {
		if resource == "existing" {
			mustExec(t, pool, `SELECT pgfence.fence('existing', 1)`)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Each write has its own operation id: Resolve abandons the one it
		// resolves.
		op := pgfence.OpID{1, 2, 3, byte(i)}
		if _, err := tx.Exec(ctx, `SELECT pgfence.fence($1, 5, $2)`, resource, op); err != nil {
			_ = tx.Rollback(ctx)
			t.Fatalf("%s: fence: %v", resource, err)
		}
		got := make(chan pgfence.Outcome, 1)
		go func() {
			o, err := pgfence.Resolve(ctx, pool, &pgfence.OutcomeUnknownError{Resource: resource, Token: 5, Op: op})
			if err != nil {
				t.Error(err)
			}
			got <- o
		}()
		select {
		case o := <-got:
			t.Fatalf("%s: Resolve answered %v while the writer was still open", resource, o)
		case <-time.After(150 * time.Millisecond):
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if o := <-got; o != pgfence.Applied {
			t.Fatalf("%s: resolved %v, want applied", resource, o)
		}
	}
}

// Exec, fenced and lease-checked, is one round trip: once the statements are prepared on
// the connection, the client sends a single pipeline ending in one Sync and
// no simple Query (no BEGIN/COMMIT).
func TestExecIsOneRoundTrip(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	setupKV(t, db.Pool)
	l := grant(t, db.Pool, "job")
	conn, p := proxied(t, db)
	var syncs, queries atomic.Int64
	count := p.CutBefore(func(m faultproxy.Message) bool {
		switch m.Type {
		case 'S':
			syncs.Add(1)
		case 'Q':
			queries.Add(1)
		}
		return false
	})
	defer count.Cancel()
	for i, op := range []func(int64) error{
		func(token int64) error {
			_, err := pgfence.Exec(ctx, conn, pgfence.LeaseOf("kv:a", "", token), `UPDATE kv SET token = $1 WHERE k = 'a'`, token)
			return err
		},
		func(token int64) error {
			_, err := pgfence.Exec(ctx, conn, pgfence.Checked(l.lease()), `UPDATE kv SET token = $1 WHERE k = 'a'`, token)
			return err
		},
	} {
		if err := op(1); err != nil { // prepares the statements
			t.Fatal(err)
		}
		syncs.Store(0)
		queries.Store(0)
		if err := op(2); err != nil {
			t.Fatal(err)
		}
		if syncs.Load() != 1 || queries.Load() != 0 {
			t.Fatalf("op %d: %d Syncs and %d Queries, want one pipeline", i, syncs.Load(), queries.Load())
		}
	}
}

// RaiseTokenFloor, Protect and Unprotect each run one statement
// that commits on its own: a reply lost after the statement reached the
// server is an unknown outcome, never "unavailable" (which says nothing
// happened). In each case here the server committed it.
func TestAutocommitLostReplyIsUnknown(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	setupKV(t, db.Pool)
	var floor int64
	if err := db.Pool.QueryRow(ctx, `SELECT pgfence.max_stored_token() + 1000`).Scan(&floor); err != nil {
		t.Fatal(err)
	}
	protected := func() bool {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.protected_tables() WHERE relation = 'kv'::regclass`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	for _, c := range []struct {
		name, sql string
		call      func(conn *pgx.Conn) error
		applied   func() bool
	}{
		{"RaiseTokenFloor", "raise_token_floor", func(conn *pgx.Conn) error {
			_, err := pgfence.RaiseTokenFloor(ctx, conn, floor, "restore drill")
			return err
		}, func() bool {
			var token int64
			if err := db.Pool.QueryRow(ctx, `SELECT pgfence.next_token(NULL)`).Scan(&token); err != nil {
				t.Fatal(err)
			}
			return token > floor
		}},
		{"Protect", "pgfence.protect", func(conn *pgx.Conn) error {
			return pgfence.Protect(ctx, conn, pgx.Identifier{"kv"}, "k", "kv:")
		}, protected},
		{"Unprotect", "pgfence.unprotect", func(conn *pgx.Conn) error {
			_, err := pgfence.Unprotect(ctx, conn, pgx.Identifier{"kv"})
			return err
		}, func() bool { return !protected() }},
	} {
		conn, p := proxied(t, db)
		trig := p.CutAfter(faultproxy.SQLContains(c.sql))
		err := c.call(conn)
		<-trig.Done()
		if !trig.Fired() || !trig.Replied() {
			t.Fatalf("%s: the proxy did not forward the statement and drop its answer (fired %v replied %v)", c.name, trig.Fired(), trig.Replied())
		}
		if !errors.Is(err, pgfence.ErrOutcomeUnknown) || errors.Is(err, pgfence.ErrUnavailable) {
			t.Errorf("%s with a lost reply: %v, want ErrOutcomeUnknown", c.name, err)
		}
		if !c.applied() {
			t.Fatalf("%s: the server did not commit the statement the proxy forwarded", c.name)
		}
	}
}

// MapError does not guess about the caller's own statement: lost after it
// was sent (here it committed), it is an unknown outcome, not "unavailable".
func TestMapErrorLostReplyIsUnknown(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	setupKV(t, db.Pool)
	conn, p := proxied(t, db)
	trig := p.CutAfter(faultproxy.SQLContains("UPDATE kv"))
	_, err := conn.Exec(ctx, `UPDATE kv SET v = 'own statement' WHERE k = 'a'`)
	<-trig.Done()
	if !trig.Fired() || !trig.Replied() {
		t.Fatalf("the proxy did not forward the UPDATE and drop its answer (fired %v replied %v)", trig.Fired(), trig.Replied())
	}
	if err := pgfence.MapError(err); !errors.Is(err, pgfence.ErrOutcomeUnknown) || errors.Is(err, pgfence.ErrUnavailable) {
		t.Fatalf("MapError of a lost reply: %v, want ErrOutcomeUnknown", err)
	}
	if v := kvValue(t, db.Pool); v != "own statement" {
		t.Fatalf("row %q: the server did not commit the UPDATE the proxy forwarded", v)
	}
}

// A call on a pool that cannot get a connection (the pool is exhausted until
// the caller's deadline, or the context ended before the call) sent nothing:
// it returns the context's error, never ErrOutcomeUnknown, which would send
// the caller to Resolve or re-read a write that was never attempted.
func TestPoolAcquireFailureIsNotUnknown(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	setupKV(t, db.Pool)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	held, err := pool.Acquire(ctx) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	lease := leaseRow{Key: "acquire", Holder: newHolder(), Token: 1}
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Exec", func(ctx context.Context) error {
			_, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 1), `UPDATE kv SET v = 'x' WHERE k = 'a'`)
			return err
		}},
		{"Exec checked", func(ctx context.Context) error {
			_, err := pgfence.Exec(ctx, pool, pgfence.Checked(lease.lease()), `UPDATE kv SET v = 'x' WHERE k = 'a'`)
			return err
		}},
		{"RaiseTokenFloor", func(ctx context.Context) error {
			_, err := pgfence.RaiseTokenFloor(ctx, pool, 1, "drill")
			return err
		}},
		{"Protect", func(ctx context.Context) error {
			return pgfence.Protect(ctx, pool, pgx.Identifier{"kv"}, "k", "kv:")
		}},
		{"Unprotect", func(ctx context.Context) error {
			_, err := pgfence.Unprotect(ctx, pool, pgx.Identifier{"kv"})
			return err
		}},
	}
	for _, c := range calls {
		// The pool stays exhausted until the deadline.
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := c.call(dctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Errorf("%s on an exhausted pool: %v, want the deadline, not ErrOutcomeUnknown", c.name, err)
		}
		// The context ended before the call.
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		err = c.call(cctx)
		if !errors.Is(err, context.Canceled) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Errorf("%s with a cancelled context: %v, want context.Canceled, not ErrOutcomeUnknown", c.name, err)
		}
	}
	held.Release()
	if v := kvValue(t, db.Pool); v != "init" {
		t.Fatalf("row %q: a call that got no connection wrote", v)
	}
}

// pgx prepares the statements of a batch it has not seen on the connection
// in a round trip of their own, before it sends any of them: a connection
// lost then ran nothing. Exec on a connection whose session was terminated
// is unavailable, not an unknown outcome.
func TestExecPrepareFailureIsNotUnknown(t *testing.T) {
	ctx := testContext(t)
	db := pgfencetest.NewDatabase(t)
	setupKV(t, db.Pool)
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	pid := conn.PgConn().PID()
	var gone bool
	if err := db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 30000)`, pid).Scan(&gone); err != nil || !gone {
		t.Fatalf("terminating the session: %v %v", gone, err)
	}
	_, err = pgfence.Exec(ctx, conn, pgfence.LeaseOf("kv:a", "", 1), `UPDATE kv SET v = 'x' WHERE k = 'a'`)
	if !errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("Exec on a terminated session: %v, want ErrUnavailable, not ErrOutcomeUnknown", err)
	}
	if v := kvValue(t, db.Pool); v != "init" {
		t.Fatalf("row %q", v)
	}
}
