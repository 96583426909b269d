package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// withTrace returns a context carrying a remote trace id id.
func withTrace(t *testing.T, id string) context.Context {
	return telemetrytest.RemoteTrace(t, context.Background(), id)
}

// TestKeyTraceID: a key stores the trace id of the claim that created it or
// last took it over (or reused it), in both modes; heartbeats, recovery
// points and completions keep it; an untraced reuse clears it.
func TestKeyTraceID(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	store := newStore(t, nil)
	const t1, t2, t3 = "11111111111111111111111111111111", "22222222222222222222222222222222", "33333333333333333333333333333333"
	traceOf := func(key string) string {
		t.Helper()
		var id *string
		if err := pool.QueryRow(context.Background(), `SELECT trace_id FROM pgfence.idempotency_keys WHERE key = $1`, key).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if id == nil {
			return "NULL"
		}
		return *id
	}
	ok := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil }

	// Atomic, traced and untraced, then a reuse after expiry.
	if _, err := store.Do(withTrace(t, t1), pool, idempotency.Request{Scope: "s", Key: "atomic"}, ok); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Do(context.Background(), pool, idempotency.Request{Scope: "s", Key: "plain"}, ok); err != nil {
		t.Fatal(err)
	}
	if got := traceOf("atomic"); got != t1 {
		t.Errorf("atomic key trace %s, want %s", got, t1)
	}
	if got := traceOf("plain"); got != "NULL" {
		t.Errorf("untraced key trace %s, want NULL", got)
	}
	// Inside a caller's transaction (a savepoint), the claim takes the trace too.
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Do(withTrace(t, t2), tx, idempotency.Request{Scope: "s", Key: "in-tx"}, ok); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := traceOf("in-tx"); got != t2 {
		t.Errorf("key claimed in a caller's transaction: trace %s, want %s", got, t2)
	}
	expireKeys(t, pool)
	if _, err := store.Do(context.Background(), pool, idempotency.Request{Scope: "s", Key: "atomic"}, ok); err != nil {
		t.Fatal(err)
	}
	if got := traceOf("atomic"); got != "NULL" {
		t.Errorf("atomic key reused untraced: trace %s, want NULL", got)
	}

	// Leased: the claim's trace survives heartbeats and recovery points; a
	// takeover replaces it.
	req := idempotency.Request{Scope: "s", Key: "leased"}
	out, err := store.Claim(withTrace(t, t1), pool, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := out.Attempt.Heartbeat(withTrace(t, t3)); err != nil {
		t.Fatal(err)
	}
	if err := out.Attempt.Advance(withTrace(t, t3), "charged", nil); err != nil {
		t.Fatal(err)
	}
	if got := traceOf("leased"); got != t1 {
		t.Errorf("leased key after heartbeat and recovery point: trace %s, want %s", got, t1)
	}
	expireLease(t, pool, "leased")
	out, err = store.Claim(withTrace(t, t2), pool, req)
	if err != nil || out.Attempt.Epoch() < 2 {
		t.Fatalf("takeover: %+v %v", out, err)
	}
	if _, err := out.Attempt.Complete(withTrace(t, t3), []byte("done")); err != nil {
		t.Fatal(err)
	}
	if got := traceOf("leased"); got != t2 {
		t.Errorf("leased key after takeover and completion: trace %s, want %s", got, t2)
	}
}

// TestGCTelemetry: GC counts the keys it deleted, and records a span and a
// log event per call.
func TestGCTelemetry(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	store := newStore(t, nil)
	for _, key := range []string{"a", "b", "c"} {
		if _, err := store.Do(context.Background(), pool, idempotency.Request{Scope: "gc", Key: key},
			func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
	}
	expireKeys(t, pool)
	p := telemetrytest.New(t)
	var logs bytes.Buffer
	gcStore := newStore(t, &idempotency.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	for range 2 { // the second run finds nothing
		if _, err := gcStore.GC(context.Background(), pool, &idempotency.GCOptions{BatchSize: 2}); err != nil {
			t.Fatal(err)
		}
	}
	m := p.Metrics(t)
	if n := m.Sum("pgfence.idempotency.operations", attribute.String("pgfence.operation", "gc_deleted")); n != 3 {
		t.Errorf("gc_deleted = %d, want 3", n)
	}
	if n := m.Sum("pgfence.idempotency.operations", attribute.String("pgfence.operation", "gc"), attribute.String("pgfence.outcome", "ok")); n != 2 {
		t.Errorf("gc operations = %d, want 2", n)
	}
	if spans := p.Ended("pgfence.idempotency.gc"); len(spans) != 2 {
		t.Fatalf("%d gc spans, want 2", len(spans))
	}
	if !strings.Contains(logs.String(), "deleted=3 batches=2") || !strings.Contains(logs.String(), "deleted=0 batches=1") {
		t.Errorf("gc log:\n%s", logs.String())
	}
}

// TestLeaseExtensionTelemetry: heartbeats and recovery points are counted
// by outcome and traced; a replaced owner's late heartbeat is not_owner.
func TestLeaseExtensionTelemetry(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	p := telemetrytest.New(t)
	store := newStore(t, &idempotency.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer})
	ctx := context.Background()
	req := idempotency.Request{Scope: "ext", Key: "k"}
	a := claimNew(t, store, pool, req)
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Advance(ctx, "step-1", []byte("provider-id")); err != nil {
		t.Fatal(err)
	}
	expireLease(t, pool, "k")
	claimNew(t, store, pool, req) // takes the key over
	if err := a.Heartbeat(ctx); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("late heartbeat: %v", err)
	}
	m := p.Metrics(t)
	for _, want := range []struct{ op, outcome string }{{"heartbeat", "ok"}, {"advance", "ok"}, {"heartbeat", "not_owner"}} {
		if n := m.Sum("pgfence.idempotency.operations", attribute.String("pgfence.operation", want.op),
			attribute.String("pgfence.outcome", want.outcome)); n != 1 {
			t.Errorf("operations{%s,%s} = %d, want 1", want.op, want.outcome, n)
		}
	}
	beats := p.Ended("pgfence.idempotency.heartbeat")
	if len(beats) != 2 || len(p.Ended("pgfence.idempotency.advance")) != 1 {
		t.Fatalf("%d heartbeat spans, %d advance spans", len(beats), len(p.Ended("pgfence.idempotency.advance")))
	}
	if v, _ := telemetrytest.Attr(beats[1], "pgfence.outcome"); v.AsString() != "not_owner" {
		t.Errorf("late heartbeat span outcome %q", v.AsString())
	}
	for _, s := range p.Spans.Ended() {
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), "provider-id") {
				t.Errorf("span %s carries the recovery data", s.Name())
			}
		}
	}
}
