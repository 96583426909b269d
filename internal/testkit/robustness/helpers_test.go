package robustness

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
)

// local returns an in-process actor connected directly (p == nil) or through
// the proxy p; it is closed when the test ends.
func (e *env) local(client int, p *faultproxy.Proxy) *actor {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := newActor(ctx, actorConfig{URL: e.url(p), App: fmt.Sprintf("pf-local-%d", client), MaxConns: 4})
	if err != nil {
		e.t.Fatalf("actor %d: %v", client, err)
	}
	e.t.Cleanup(a.close)
	return a
}

// backdateSQL makes the lease on key ($1) expire now by the database clock,
// as if its TTL had run out: time is moved in the row, not slept through.
const backdateSQL = `UPDATE pgfence.leases
	SET granted_at = granted_at - interval '1 hour',
	    renewed_at = renewed_at - interval '1 hour',
	    expires_at = clock_timestamp() - interval '1 second'
	WHERE key = $1`

// backdate makes the lease on key expire now by the database clock (backdateSQL).
func (e *env) backdate(key string) {
	e.t.Helper()
	tag, err := e.admin().Exec(context.Background(), backdateSQL, key)
	if err != nil || tag.RowsAffected() != 1 {
		e.t.Fatalf("backdate lease %q: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

// leaseRow is a lease row as the database has it.
type leaseRow struct {
	Holder    string
	Token     int64
	ExpiresAt time.Time
	Renewed   bool
	Live      bool
}

func (e *env) leaseRow(key string) leaseRow {
	e.t.Helper()
	var r leaseRow
	err := e.admin().QueryRow(context.Background(), `SELECT holder::text, token, expires_at, renewed_at IS NOT NULL,
		released_at IS NULL AND expires_at > clock_timestamp() FROM pgfence.leases WHERE key = $1`, key).
		Scan(&r.Holder, &r.Token, &r.ExpiresAt, &r.Renewed, &r.Live)
	if err != nil {
		e.t.Fatalf("lease row %q: %v", key, err)
	}
	return r
}

// events lists the lease events of key as "event:token", oldest first.
func (e *env) events(key string) []string {
	e.t.Helper()
	rows, err := e.admin().Query(context.Background(), `SELECT event || ':' || token FROM pgfence.lease_events WHERE key = $1 ORDER BY id`, key)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.admin().QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// want fails the test unless op ended with outcome.
func want(t *testing.T, op Op, outcome Outcome) Op {
	t.Helper()
	if op.Outcome != outcome {
		t.Fatalf("%s: outcome %s, want %s (err: %s)", op, op.Outcome, outcome, op.Err)
	}
	return op
}

// bounded returns a context that ends after d, cancelled when the test ends.
func bounded(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// noLeakedGoroutines fails t if goroutines started after this call (lease
// clients, keep-alives, listeners, pools, proxies) outlive the clients the
// test closes in its cleanups. Call it after newEnv, before the clients are
// made, and only in tests that do not run in parallel.
func noLeakedGoroutines(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	// A restarted test server's postmaster is waited for by the cluster.
	server := goleak.IgnoreAnyFunction("github.com/pgfence/pgfence/internal/testkit/pgcluster.(*Cluster).startLocked.func1")
	t.Cleanup(func() { goleak.VerifyNone(t, ignore, server) })
}
