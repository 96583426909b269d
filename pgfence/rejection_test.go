package pgfence_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// capture is a slog.Handler that keeps every record.
type capture struct {
	mu      sync.Mutex
	records []slog.Record
}

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }
func (c *capture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, r.Clone())
	return nil
}
func (c *capture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *capture) WithGroup(string) slog.Handler      { return c }

// auditQuery and winnerQuery are the README's audit queries (the test checks
// that the README shows them verbatim).
const auditQuery = `SELECT e.key, e.event, e.token AS lease_token,
       f.resource, f.token AS accepted_token,
       r.resource AS rejected_resource, r.presented_token, r.accepted_token AS rejected_by, r.reason
  FROM pgfence.lease_events e
  LEFT JOIN pgfence.fences f ON f.trace_id = e.trace_id
  LEFT JOIN pgfence.fence_rejections r ON r.trace_id = e.trace_id
 WHERE e.trace_id = $1 AND e.event IN ('acquired', 'taken_over')
 ORDER BY r.id`

const winnerQuery = `SELECT r.operation, r.presented_token, r.reason, coalesce(r.lease_reason, ''),
       w.event, w.token, w.trace_id
  FROM pgfence.fence_rejections r
  JOIN pgfence.lease_events w
    ON w.key = r.resource AND w.token = r.accepted_token AND w.event IN ('acquired', 'taken_over')
 WHERE r.resource = $1
 ORDER BY r.at DESC, r.id DESC`

// TestRejectionAudit: holder A's lease is taken over by B; A's late writes
// are refused, recorded in pgfence.fence_rejections with A's trace id (except
// inside a caller's transaction), and joined by the README's queries to A's
// grant and to B's grant and accepted write.
func TestRejectionAudit(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	const traceA, traceB = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2"
	ctxA := telemetrytest.RemoteTrace(t, testContext(t), traceA)
	ctxB := telemetrytest.RemoteTrace(t, testContext(t), traceB)

	c, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	update := `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`
	lA, err := c.TryAcquire(ctxA, "kv:a", time.Minute, &leases.AcquireOptions{NoKeepAlive: true}) // expired below
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctxA, pool, lA, update, "A", lA.Token()); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, expireSQL, "kv:a")
	lB, err := c.TryAcquire(ctxB, "kv:a", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctxB, pool, pgfence.LeaseOf("kv:a", "", lB.Token()), update, "B", lB.Token()); err != nil {
		t.Fatal(err)
	}

	// A's late writes.
	var stale *pgfence.StaleTokenError
	if _, err := pgfence.Exec(ctxA, pool, lA, update, "late A", lA.Token()); !errors.As(err, &stale) || stale.Accepted != lB.Token() {
		t.Fatalf("late Exec: %v", err)
	}
	if _, err := pgfence.Write(ctxA, pool, lA, func(context.Context, pgx.Tx) error {
		t.Error("fn ran for a stale token")
		return nil
	}); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("late Write: %v", err)
	}
	var lost *pgfence.LeaseLostError
	if _, err := pgfence.Exec(ctxA, pool, pgfence.Checked(lA), update, "late A", lA.Token()); !errors.As(err, &lost) || lost.Reason != "taken_over" {
		t.Fatalf("late lease-checked Exec: %v", err)
	}
	// Inside the caller's transaction: not recorded (it rolls back with the caller).
	tx, err := pool.Begin(ctxA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Write(ctxA, tx, lA, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("late Write in a transaction: %v", err)
	}
	if err := tx.Rollback(ctxA); err != nil {
		t.Fatal(err)
	}

	got, err := pgfence.Rejections(testContext(t), pool, "kv:a", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d rejections of kv:a, want 3 (exec, write, exec_leased): %+v", len(got), got)
	}
	for i, want := range []struct{ operation, reason, leaseReason string }{
		{"exec_leased", "lease_not_held", "taken_over"}, {"write", "stale_token", ""}, {"exec", "stale_token", ""},
	} {
		r := got[i] // newest first
		if r.Operation != want.operation || r.Reason != want.reason || r.LeaseReason != want.leaseReason ||
			r.PresentedToken != lA.Token() || r.AcceptedToken != lB.Token() || r.TraceID != traceA || r.Resource != "kv:a" {
			t.Errorf("rejection %d = %+v, want %s/%s/%s presented %d accepted %d trace %s",
				i, r, want.operation, want.reason, want.leaseReason, lA.Token(), lB.Token(), traceA)
		}
		if (r.Op == pgfence.OpID{}) != (want.operation == "exec_leased") {
			t.Errorf("rejection %d op id %s", i, r.Op)
		}
	}
	for _, bad := range []string{"", "kv\x00a", "kv\xffa", strings.Repeat("r", pgfence.MaxResourceLen+1)} {
		if _, err := pgfence.Rejections(testContext(t), pool, bad, 0); !errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("Rejections(%q): %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := pgfence.Rejections(testContext(t), pool, "kv:a", 1001); !errors.Is(err, pgfence.ErrInvalid) {
		t.Errorf("Rejections over the limit: %v", err)
	}

	// The audit join from A's grant: no accepted write of A's trace is left
	// (B's write replaced the fence row), its three recorded refusals are
	// there.
	type joined struct {
		key, event            string
		leaseToken            int64
		resource              *string
		acceptedToken         *int64
		rejectedResource      *string
		presented, rejectedBy *int64
		reason                *string
	}
	audit := func(traceID string) []joined {
		rows, err := pool.Query(testContext(t), auditQuery, traceID)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (joined, error) {
			var j joined
			err := row.Scan(&j.key, &j.event, &j.leaseToken, &j.resource, &j.acceptedToken, &j.rejectedResource, &j.presented, &j.rejectedBy, &j.reason)
			return j, err
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	rowsA := audit(traceA)
	if len(rowsA) != 3 {
		t.Fatalf("audit of trace A: %d rows, want 3", len(rowsA))
	}
	for _, j := range rowsA {
		if j.event != "acquired" || j.leaseToken != lA.Token() || j.resource != nil || j.presented == nil || *j.presented != lA.Token() ||
			j.rejectedBy == nil || *j.rejectedBy != lB.Token() {
			t.Errorf("audit row of trace A: %+v", j)
		}
	}
	if *rowsA[2].rejectedResource != "kv:a" || *rowsA[2].reason != "lease_not_held" {
		t.Errorf("audit of trace A, last row: %s %s", *rowsA[2].rejectedResource, *rowsA[2].reason)
	}
	rowsB := audit(traceB)
	if len(rowsB) != 1 || rowsB[0].event != "taken_over" || rowsB[0].leaseToken != lB.Token() ||
		rowsB[0].acceptedToken == nil || *rowsB[0].acceptedToken != lB.Token() || rowsB[0].rejectedResource != nil {
		t.Fatalf("audit of trace B: %+v", rowsB)
	}

	// Which grant beat each refusal: B's takeover, in B's trace.
	rows, err := pool.Query(testContext(t), winnerQuery, "kv:a")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var op, reason, leaseReason, event, trace string
		var presented, token int64
		if err := rows.Scan(&op, &presented, &reason, &leaseReason, &event, &token, &trace); err != nil {
			t.Fatal(err)
		}
		if event != "taken_over" || token != lB.Token() || trace != traceB || presented != lA.Token() {
			t.Errorf("winner of %s: %s %d %s", op, event, token, trace)
		}
		n++
	}
	if rows.Err() != nil || n != 3 {
		t.Errorf("winner query: %d rows, %v", n, rows.Err())
	}

	readme, err := os.ReadFile("README.md") // the package reference shows them
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{auditQuery, winnerQuery} {
		if !strings.Contains(string(readme), q) {
			t.Errorf("README.md does not show the query:\n%s", q)
		}
	}
}

// TestRejectionRecordFailure: a rejection whose record fails (here a trigger
// refuses it, after counting the attempt in a sequence, which does not roll
// back) returns the same error.
func TestRejectionRecordFailure(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	mustExec(t, pool, `CREATE SEQUENCE record_attempts`)
	mustExec(t, pool, `CREATE FUNCTION refuse_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('public.record_attempts');
  RAISE check_violation USING MESSAGE = 'records refused by the test';
END $$`)
	mustExec(t, pool, `CREATE TRIGGER refuse_all BEFORE INSERT ON pgfence.fence_rejections FOR EACH ROW EXECUTE FUNCTION refuse_record()`)
	ctx := testContext(t)
	update := `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 5), update, "five", 5); err != nil {
		t.Fatal(err)
	}
	var stale *pgfence.StaleTokenError
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 4), update, "four", 4); !errors.As(err, &stale) || stale.Accepted != 5 || stale.Presented != 4 {
		t.Fatalf("stale Exec with a failing record: %v", err)
	}
	var attempted bool
	if err := pool.QueryRow(ctx, `SELECT is_called FROM record_attempts`).Scan(&attempted); err != nil || !attempted {
		t.Fatalf("the rejection was not recorded, nor attempted (%v)", err)
	}
	if rows, err := pgfence.Rejections(ctx, pool, "kv:a", 0); err != nil || len(rows) != 0 {
		t.Fatalf("rejections: %v %v", rows, err)
	}
}

// The writes stay quiet: they do not log, not through slog's default logger
// either. Not parallel: it swaps
// that default for the test, while no parallel test runs.
func TestPackageFunctionsDoNotLog(t *testing.T) {
	logs := &capture{}
	prev := slog.Default()
	slog.SetDefault(slog.New(logs))
	t.Cleanup(func() { slog.SetDefault(prev) })
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	ctx := testContext(t)
	update := `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 5), update, "five", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 3), update, "three", 3); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("stale Exec: %v", err)
	}
	logs.mu.Lock()
	n := len(logs.records)
	logs.mu.Unlock()
	if n != 0 {
		t.Errorf("the writes logged %d records through slog's default logger, want none", n)
	}
}

// blockRejectionRecords holds a lock on pgfence.fence_rejections, in a
// transaction of another session, until the test ends: every rejection
// record waits for it.
func blockRejectionRecords(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Rollback(context.Background()) })
	mustExec(t, locker, `LOCK TABLE pgfence.fence_rejections IN ACCESS EXCLUSIVE MODE`)
}

// TestRejectionRecordBounded: a record that cannot get its lock (another
// session holds pgfence.fence_rejections) gives up after its own short
// timeout, long before the caller's deadline, and the caller still gets the
// rejection. Without that bound the stale Exec would wait as long as the lock
// is held, up to the caller's whole deadline.
func TestRejectionRecordBounded(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	ctx := testContext(t)
	update := `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 5), update, "five", 5); err != nil {
		t.Fatal(err)
	}
	blockRejectionRecords(t, ctx, pool)

	start := time.Now()
	var stale *pgfence.StaleTokenError
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 4), update, "four", 4); !errors.As(err, &stale) || stale.Accepted != 5 || stale.Presented != 4 {
		t.Fatalf("stale Exec while the record is blocked: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the stale Exec returned only after the caller's deadline: %v", ctx.Err())
	}
	// It did wait for its record: the lock held it up to the record's own
	// timeout (a second).
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Fatalf("the stale Exec returned after %v: its record did not wait for the lock", waited)
	}
}

// TestRecordFenceRejectionSQL: the SQL function stores a bad trace id as
// NULL, commits with synchronous_commit off only in a transaction that wrote
// nothing before, and prunes rows older than 7 days every 128th row.
func TestRecordFenceRejectionSQL(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := testContext(t)
	record := `SELECT pgfence.record_fence_rejection('r', 3, 4, 'stale_token', NULL, 'exec', NULL, $1)`
	count := func() (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.fence_rejections`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	mustExec(t, pool, record, "not a trace id")
	var traceID *string
	if err := pool.QueryRow(ctx, `SELECT trace_id FROM pgfence.fence_rejections`).Scan(&traceID); err != nil || traceID != nil {
		t.Fatalf("bad trace id stored as %v (%v), want NULL", traceID, err)
	}

	syncCommit := func(writeFirst bool) string {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if writeFirst {
			mustExec(t, tx, `CREATE TEMP TABLE w (x int)`)
		}
		mustExec(t, tx, record, "")
		var s string
		if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := syncCommit(false); s != "off" {
		t.Errorf("synchronous_commit in its own transaction: %s, want off", s)
	}
	if s := syncCommit(true); s != "on" {
		t.Errorf("synchronous_commit after another write: %s, want on", s)
	}

	// Three rows of last week, one of today.
	mustExec(t, pool, `INSERT INTO pgfence.fence_rejections (resource, presented_token, reason, at)
SELECT 'old', g, 'stale_token', clock_timestamp() - interval '8 days' FROM generate_series(1, 3) g`)
	if n := count(); n != 4 {
		t.Fatalf("%d rows before pruning", n)
	}
	mustExec(t, pool, `ALTER TABLE pgfence.fence_rejections ALTER COLUMN id RESTART WITH 127`)
	mustExec(t, pool, record, "")
	if n := count(); n != 5 {
		t.Fatalf("row 127 pruned: %d rows, want 5", n)
	}
	mustExec(t, pool, record, "")
	if n := count(); n != 3 {
		t.Fatalf("row 128 did not prune the old rows: %d rows, want 3", n)
	}
	var deleted int64
	if err := pool.QueryRow(ctx, `SELECT pgfence.prune_fence_rejections(interval '0')`).Scan(&deleted); err != nil || deleted != 3 {
		t.Fatalf("prune_fence_rejections(0) = %d, %v; want 3", deleted, err)
	}
}

// BenchmarkRejectedExec compares an accepted Exec with a rejected one, which
// also records the rejection (one more statement, synchronous_commit off).
func BenchmarkRejectedExec(b *testing.B) {
	pool := pgfencetest.NewPool(b)
	ctx := context.Background()
	pgfencetest.IssueToken(b, pool, "bench", 1<<40)
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("bench", "", 1<<40), `SELECT 1`); err != nil {
		b.Fatal(err)
	}
	b.Run("accepted", func(b *testing.B) {
		for b.Loop() {
			if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("bench", "", 1<<40), `SELECT 1`); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("rejected", func(b *testing.B) {
		for b.Loop() {
			if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("bench", "", 1), `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) {
				b.Fatal(err)
			}
		}
	})
}
