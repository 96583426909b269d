package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// queries records what a connection sends with Query and Exec (a batch is
// not traced: pgx.QueryTracer sees it only through pgx.BatchTracer).
type queries struct {
	mu   sync.Mutex
	sent []sentQuery
}

type sentQuery struct {
	sql  string
	args []any
}

func (q *queries) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sent = append(q.sent, sentQuery{data.SQL, data.Args})
	return ctx
}

func (q *queries) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns what was sent since the last take.
func (q *queries) take() []sentQuery {
	q.mu.Lock()
	defer q.mu.Unlock()
	sent := q.sent
	q.sent = nil
	return sent
}

// onePool is a pool of one connection on db whose queries are recorded.
func onePool(t *testing.T, db *pgfencetest.Database) (*pgxpool.Pool, *queries) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	q := &queries{}
	cfg.ConnConfig.Tracer = q
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, q
}

const (
	foldedClaim = "begin isolation level read committed; select pgfence.idempotency_claim_atomic_new("
	aloneClaim  = "pgfence.idempotency_claim_atomic($1"
)

func sqls(sent []sentQuery) []string {
	var out []string
	for _, s := range sent {
		out = append(out, s.sql)
	}
	return out
}

// On a pool, a new key's claim travels in the BEGIN's message: one round
// trip, not two. Every other outcome rolls that transaction back and asks
// again, on the same connection, which the pool keeps.
func TestAtomicClaimTravelsWithBegin(t *testing.T) {
	verifyNoLeaks(t)
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	pool, q := onePool(t, db)
	ctx := context.Background()
	store := newStore(t, &idempotency.Config{WaitTimeout: 200 * time.Millisecond, RetryAfter: 3 * time.Second})
	req := idempotency.Request{Scope: "charges", Key: "order-7:charge", Payload: []byte(`{"amount":5}`)}
	q.take() // the pool's connect

	// New: BEGIN with the claim, then the work; the answer and COMMIT go in
	// one batch (not traced here).
	out, err := store.Do(ctx, pool, req, charge("order-7", 5))
	if err != nil || out.Replayed {
		t.Fatalf("first: %+v, %v", out, err)
	}
	sent := sqls(q.take())
	if len(sent) != 2 || !strings.HasPrefix(sent[0], foldedClaim) || !strings.Contains(sent[1], "INSERT INTO charges") {
		t.Fatalf("a new key sent %q, want the BEGIN with the claim, then the insert", sent)
	}

	// Replayed: the folded claim is refused (PF015), then rolled back and
	// asked again alone, with the store's wait.
	out, err = store.Do(ctx, pool, req, charge("order-7", 5))
	if err != nil || !out.Replayed || string(out.Result) != "1" {
		t.Fatalf("duplicate: %+v, %v, want the stored result 1", out, err)
	}
	got := q.take()
	sent = sqls(got)
	if len(sent) != 4 || !strings.HasPrefix(sent[0], foldedClaim) || sent[1] != "rollback; begin isolation level read committed" ||
		!strings.Contains(sent[2], aloneClaim) || sent[3] != "rollback" {
		t.Fatalf("a duplicate sent %q, want the folded claim, rollback+begin, the claim alone, rollback", sent)
	}
	if wait := got[2].args[3]; wait != int64(200_000) {
		t.Fatalf("the claim after a refused fold waited %v µs, want the store's 200000", wait)
	}

	// Another payload: refused (PF004 in the fold, mismatch alone).
	other := req
	other.Payload = []byte(`{"amount":6}`)
	if out, err := store.Do(ctx, pool, other, charge("order-7", 6)); !errors.Is(err, idempotency.ErrMismatch) || out != nil {
		t.Fatalf("other payload: %+v, %v, want ErrMismatch", out, err)
	}
	q.take()

	// In progress: the fold waited WaitTimeout already (PF007); the claim
	// sent alone afterwards waits the least the SQL accepts, 1 ms, not a
	// second WaitTimeout.
	busy := idempotency.Request{Scope: "charges", Key: "order-8:charge", Payload: []byte("x")}
	first := holdClaim(newStore(t, nil), db.Pool, busy, charge("order-8", 1), nil)
	<-first.claimed
	out, err = store.Do(ctx, pool, busy, charge("order-8", 1))
	var ip *idempotency.InProgressError
	if !errors.As(err, &ip) || out != nil || ip.RetryAfter != 3*time.Second {
		t.Fatalf("in progress: %+v, %v, want InProgress with RetryAfter 3s", out, err)
	}
	got = q.take()
	if len(got) != 4 || !strings.Contains(got[2].sql, aloneClaim) || got[2].args[3] != int64(1000) {
		t.Fatalf("in progress sent %q (args %v), want the claim alone waiting 1000 µs", sqls(got), got)
	}
	close(first.release)
	<-first.done
	if first.err != nil || first.out.Replayed {
		t.Fatalf("the holder: %+v, %v", first.out, first.err)
	}
	if out, err := store.Do(ctx, pool, busy, charge("order-8", 1)); err != nil || !out.Replayed {
		t.Fatalf("after the holder committed: %+v, %v, want Replayed", out, err)
	}

	if n := pool.Stat().NewConnsCount(); n != 1 {
		t.Fatalf("the pool opened %d connections, want 1: a refused fold must leave its connection usable", n)
	}
	if got := countCharges(t, db.Pool, "order-7") + countCharges(t, db.Pool, "order-8"); got != 2 {
		t.Fatalf("%d charges, want 2", got)
	}
}

// The claim sent with BEGIN spells its values in hex: no key, scope or trace
// id can change the statement, and each is stored exactly.
func TestAtomicClaimWithBeginKeepsKeysExact(t *testing.T) {
	verifyNoLeaks(t)
	db := pgfencetest.NewDatabase(t)
	createCharges(t, db.Pool)
	ctx := context.Background()
	store := newStore(t, nil)
	for i, key := range []string{
		`it's`, `back\slash`, `$$dollar$$`, `'); DROP TABLE charges; --`, "E'\\x00'", "键🔑", "line\nbreak", strings.Repeat("k", idempotency.MaxKeyBytes),
	} {
		scope := `sc'ope` + string(rune('a'+i))
		req := idempotency.Request{Scope: scope, Key: key, Payload: []byte("x")}
		for _, want := range []bool{false, true} {
			out, err := store.Do(ctx, db.Pool, req, charge(key, 1))
			if err != nil || out.Replayed != want {
				t.Fatalf("key %q: %+v, %v, want %v", key, out, err, want)
			}
		}
		var stored string
		if err := db.Pool.QueryRow(ctx, `SELECT key FROM pgfence.idempotency_keys WHERE scope = $1`, scope).Scan(&stored); err != nil || stored != key {
			t.Fatalf("stored key %q (%v), want %q", stored, err, key)
		}
		if got := countCharges(t, db.Pool, key); got != 1 {
			t.Fatalf("key %q: %d charges, want 1", key, got)
		}
	}
}

// From SQL: idempotency_claim_atomic_new returns nothing for a new key and
// raises for every other outcome, so a client can send it with its BEGIN.
func TestClaimAtomicNewSQL(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	claim := func(key, payload string) error {
		_, err := conn.Exec(ctx, `BEGIN; SELECT pgfence.idempotency_claim_atomic_new('s', '`+key+`', sha256('`+payload+`'), '100ms', '1h')`)
		return err
	}
	end := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := claim("k", "x"); err != nil {
		t.Fatalf("new key: %v", err)
	}
	end(`SELECT pgfence.idempotency_complete_atomic('s', 'k', 'done'); COMMIT`)
	for _, c := range []struct{ payload, code string }{{"x", pgerr.CodeKeyDone}, {"y", pgerr.CodeKeyMismatch}} {
		if err := claim("k", c.payload); pgerr.Code(err) != c.code {
			t.Fatalf("payload %s: %v, want SQLSTATE %s", c.payload, err, c.code)
		}
		end(`ROLLBACK`)
	}
	// In progress: another transaction's claim, not committed.
	other, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := other.Exec(ctx, `SELECT pgfence.idempotency_claim_atomic_new('s', 'busy', sha256('x'), '1s', '1h')`); err != nil {
		t.Fatal(err)
	}
	if err := claim("busy", "x"); pgerr.Code(err) != pgerr.CodeKeyInProgress {
		t.Fatalf("busy key: %v, want SQLSTATE %s", err, pgerr.CodeKeyInProgress)
	}
	end(`ROLLBACK`)
	// A claim committed without its answer is refused at COMMIT, as for
	// idempotency_claim_atomic.
	if err := claim("k2", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `COMMIT`); pgerr.Code(err) != pgerr.CodeInvalid {
		t.Fatalf("commit without the answer: %v, want PF008", err)
	}
}
