package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	if err != nil || !out.Attempt.TakenOver() {
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
	opts := &idempotency.GCOptions{BatchSize: 2, MeterProvider: p.Meter, TracerProvider: p.Tracer,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for range 2 { // the second run finds nothing
		if _, err := idempotency.GC(context.Background(), pool, opts); err != nil {
			t.Fatal(err)
		}
	}
	m := p.Metrics(t)
	if n := m.Sum("pgfence.idempotency.gc.deleted"); n != 3 || m.Unit("pgfence.idempotency.gc.deleted") != "{key}" {
		t.Errorf("gc.deleted = %d (unit %q), want 3", n, m.Unit("pgfence.idempotency.gc.deleted"))
	}
	spans := p.Ended("pgfence.idempotency.gc")
	if len(spans) != 2 {
		t.Fatalf("%d gc spans, want 2", len(spans))
	}
	if v, _ := telemetrytest.Attr(spans[0], "pgfence.idempotency.gc.deleted"); v.AsInt64() != 3 {
		t.Errorf("first gc span deleted %d, want 3", v.AsInt64())
	}
	if v, _ := telemetrytest.Attr(spans[0], "pgfence.idempotency.gc.batches"); v.AsInt64() != 2 {
		t.Errorf("first gc span batches %d, want 2", v.AsInt64())
	}
	if !strings.Contains(logs.String(), "deleted=3 batches=2") || !strings.Contains(logs.String(), "deleted=0 batches=1") {
		t.Errorf("gc log:\n%s", logs.String())
	}
}

// TestHTTPTelemetry: the middleware counts each covered request by outcome
// and logs it; uncovered methods are not counted.
func TestHTTPTelemetry(t *testing.T) {
	t.Parallel()
	p := telemetrytest.New(t)
	var logs bytes.Buffer
	f := newHTTPFixture(t, &idempotency.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}, nil)
	for _, r := range []struct {
		method, key, body string
		status            int
	}{
		{http.MethodPost, "k-1", `{"n":1}`, http.StatusCreated},             // executed
		{http.MethodPost, "k-1", `{"n":1}`, http.StatusCreated},             // replayed
		{http.MethodPost, "k-1", `{"n":2}`, http.StatusUnprocessableEntity}, // mismatch
		{http.MethodPost, "", `{"n":3}`, http.StatusCreated},                // unprotected
		{http.MethodPost, "a,b", `{}`, http.StatusBadRequest},               // bad_key
		{http.MethodGet, "k-2", "", http.StatusCreated},                     // not covered
	} {
		if got := f.do(t, r.method, "/orders/1", r.key, r.body); got.status != r.status {
			t.Fatalf("%s key %q: status %d, want %d", r.method, r.key, got.status, r.status)
		}
	}
	m := p.Metrics(t)
	for _, want := range []struct {
		outcome string
		n       int64
	}{{"executed", 1}, {"replayed", 1}, {"mismatch", 1}, {"unprotected", 1}, {"bad_key", 1}} {
		if n := m.Sum("pgfence.idempotency.http.requests", attribute.String("pgfence.outcome", want.outcome)); n != want.n {
			t.Errorf("http.requests{%s} = %d, want %d", want.outcome, n, want.n)
		}
	}
	if n := m.Sum("pgfence.idempotency.http.requests"); n != 5 {
		t.Errorf("http.requests = %d, want 5 (GET is not covered)", n)
	}
	if !strings.Contains(logs.String(), `msg="idempotency: http request" outcome=mismatch key=k-1 status=422`) {
		t.Errorf("http log:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), `{"n":`) {
		t.Errorf("the log shows a request body:\n%s", logs.String())
	}
}

// TestHTTPTelemetryOutcomes: the outcomes TestHTTPTelemetry cannot reach
// through its fixture (a duplicate in flight, a body too large, a store that
// is down, a store that fails otherwise, a handler that panics) are counted
// too, and every outcome is set on the request's own span.
func TestHTTPTelemetryOutcomes(t *testing.T) {
	t.Parallel()
	p := telemetrytest.New(t)
	storeCfg := &idempotency.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer}
	entered, release := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		w.WriteHeader(http.StatusNoContent)
	})
	up, err := idempotency.NewMiddleware(newStore(t, storeCfg), pgfencetest.NewPool(t), &idempotency.HTTPConfig{MaxBodyBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	down, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	unreachable, err := idempotency.NewMiddleware(newStore(t, storeCfg), down, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A database without the pgfence schema: the claim fails, not with an
	// outage.
	broken := pgfencetest.NewPool(t)
	if _, err := broken.Exec(context.Background(), `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	failing, err := idempotency.NewMiddleware(newStore(t, storeCfg), broken, nil)
	if err != nil {
		t.Fatal(err)
	}
	panics := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") })
	// serve sends one POST inside a span of its own and returns the status
	// and the outcome set on that span.
	serve := func(h http.Handler, key, body string) (int, string) {
		ctx, span := p.Tracer.Tracer("test").Start(context.Background(), "request "+key)
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/jobs", strings.NewReader(body))
		req.Header.Set(idempotency.HeaderKey, key)
		rec := httptest.NewRecorder()
		func() {
			defer func() {
				if v := recover(); v != nil && v != "handler bug" {
					panic(v)
				}
			}()
			h.ServeHTTP(rec, req)
		}()
		span.End()
		ended := p.Ended("request " + key)
		v, _ := telemetrytest.Attr(ended[len(ended)-1], "pgfence.idempotency.http.outcome")
		return rec.Code, v.AsString()
	}
	first := make(chan string)
	go func() {
		_, outcome := serve(up.Wrap(slow), "job-1", "{}")
		first <- outcome
	}()
	<-entered
	for _, c := range []struct {
		h         http.Handler
		key, body string
		status    int
		outcome   string
	}{
		{up.Wrap(slow), "job-1", "{}", http.StatusConflict, "in_progress"},
		{up.Wrap(slow), "job-2", "{\"too\":\"long\"}", http.StatusRequestEntityTooLarge, "bad_body"},
		{unreachable.Wrap(slow), "job-3", "{}", http.StatusServiceUnavailable, "unavailable"},
		{failing.Wrap(slow), "job-4", "{}", http.StatusInternalServerError, "error"},
		{up.Wrap(panics), "job-5", "{}", http.StatusOK, "panicked"}, // nothing written: the recorder's default
	} {
		if status, outcome := serve(c.h, c.key, c.body); status != c.status || outcome != c.outcome {
			t.Errorf("%s: status %d, span outcome %q; want %d and %q", c.key, status, outcome, c.status, c.outcome)
		}
	}
	close(release)
	if outcome := <-first; outcome != "executed" {
		t.Errorf("job-1: span outcome %q, want executed", outcome)
	}
	m := p.Metrics(t)
	for _, outcome := range []string{"executed", "in_progress", "bad_body", "unavailable", "error", "panicked"} {
		if n := m.Sum("pgfence.idempotency.http.requests", attribute.String("pgfence.outcome", outcome)); n != 1 {
			t.Errorf("http.requests{%s} = %d, want 1", outcome, n)
		}
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
	if err := a.Heartbeat(ctx); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Fatalf("late heartbeat: %v", err)
	}
	m := p.Metrics(t)
	for _, want := range []struct{ op, outcome string }{{"heartbeat", "ok"}, {"advance", "ok"}, {"heartbeat", "not_owner"}} {
		if n := m.Sum("pgfence.idempotency.lease_extensions", attribute.String("pgfence.operation", want.op),
			attribute.String("pgfence.outcome", want.outcome)); n != 1 {
			t.Errorf("lease_extensions{%s,%s} = %d, want 1", want.op, want.outcome, n)
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
