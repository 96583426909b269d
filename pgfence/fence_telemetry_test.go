package pgfence_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// globalProvidersSet tells whether TestDefaultFencerUsesGlobalProviders ran.
var globalProvidersSet atomic.Bool

// observedFencer returns fresh SDK providers and a Fencer that reports to
// them.
func observedFencer(t testing.TB) (*telemetrytest.Providers, *pgfence.Fencer) {
	p := telemetrytest.New(t)
	return p, pgfence.New(&pgfence.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer})
}

// TestDefaultFencerUsesGlobalProviders: the package-level functions report to
// the global OpenTelemetry providers the application sets, even when they
// were first called before. It is the only test that sets the global
// providers (they delegate to the first ones set, once), so it runs once per
// test binary: with -count=2 the second run has nothing left to check.
func TestDefaultFencerUsesGlobalProviders(t *testing.T) {
	if globalProvidersSet.Swap(true) {
		t.Skip("the global OpenTelemetry providers delegate to the first ones set, once per process; this ran already (-count > 1)")
	}
	pool := pgfencetest.NewPool(t)
	ctx := testContext(t)
	issue(t, pool, "global/a")
	if _, err := pgfence.ExecToken(ctx, pool, "global/a", 1, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	p := telemetrytest.New(t)
	otel.SetMeterProvider(p.Meter)
	otel.SetTracerProvider(p.Tracer)
	if _, err := pgfence.ExecToken(ctx, pool, "global/a", 2, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	if n := p.Metrics(t).Sum("pgfence.fence.writes", attribute.String("pgfence.operation", "exec"), attribute.String("pgfence.outcome", "accepted")); n != 1 {
		t.Errorf("writes{exec,accepted} on the global provider = %d, want 1", n)
	}
	if spans := p.Ended("pgfence.fence.exec"); len(spans) != 1 {
		t.Errorf("%d exec spans on the global provider, want 1", len(spans))
	}
}

// TestTelemetry checks the metrics and spans of every kind of write, and that
// one query joins the lease grant to the fenced write it protected through
// the trace id stored beside both.
func TestTelemetry(t *testing.T) {
	p, f := observedFencer(t)
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	ctx, root := p.Tracer.Tracer("test").Start(testContext(t), "request")
	traceID := root.SpanContext().TraceID().String()

	c, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "kv:a", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	update := `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`
	if _, err := f.ExecToken(ctx, pool, "kv:a", l.Token(), update, "one", l.Token()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ExecToken(ctx, pool, "kv:a", l.Token()-1, update, "stale", l.Token()-1); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("stale Exec: %v", err)
	}
	if _, err := f.WriteToken(ctx, pool, "kv:a", l.Token()-1, func(ctx context.Context, tx pgx.Tx) error {
		t.Error("fn ran for a stale token")
		return nil
	}); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("stale Write: %v", err)
	}
	lease := l
	if _, err := f.ExecLeased(ctx, pool, lease, update, "leased", l.Token()); err != nil {
		t.Fatal(err)
	}
	table := pgfence.Table{Name: pgx.Identifier{"kv"}, Key: "k", Fence: "token"}
	if err := f.UpdateRow(ctx, pool, table, "a", l.Token(), map[string]any{"v": "row"}); err != nil {
		t.Fatal(err)
	}
	if err := f.UpdateRow(ctx, pool, table, "a", l.Token()-1, map[string]any{"v": "stale row"}); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("stale UpdateRow: %v", err)
	}
	mustExec(t, pool, expireSQL, "kv:a")
	if err := f.WriteLeased(ctx, pool, lease, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, pgfence.ErrLeaseNotHeld) {
		t.Fatalf("WriteLeased on an expired lease: %v", err)
	}
	root.End()

	m := p.Metrics(t)
	kv := func(op, outcome string) []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("pgfence.operation", op), attribute.String("pgfence.outcome", outcome)}
	}
	for _, want := range []struct{ op, outcome string }{
		{"exec", "accepted"}, {"exec", "stale_token"}, {"write", "stale_token"}, {"exec_leased", "accepted"},
		{"update_row", "accepted"}, {"update_row", "stale_token"}, {"write_leased", "lease_not_held"},
	} {
		if n := m.Sum("pgfence.fence.writes", kv(want.op, want.outcome)...); n != 1 {
			t.Errorf("pgfence.fence.writes{%s,%s} = %d, want 1", want.op, want.outcome, n)
		}
	}
	if n := m.Sum("pgfence.fence.writes"); n != 7 {
		t.Errorf("pgfence.fence.writes = %d, want 7", n)
	}
	if n, _, _ := m.Histogram("pgfence.fence.duration"); n != 7 || m.Unit("pgfence.fence.duration") != "s" {
		t.Errorf("pgfence.fence.duration count %d unit %q", n, m.Unit("pgfence.fence.duration"))
	}

	// Spans: children of the request; the rejected Write names the token
	// that beat it; the lease-checked one names its lease.
	writes := p.Ended("pgfence.fence.write")
	if len(writes) != 1 {
		t.Fatalf("%d write spans", len(writes))
	}
	if writes[0].Parent().SpanID() != root.SpanContext().SpanID() {
		t.Error("write span is not a child of the request")
	}
	var rejected bool
	for _, e := range writes[0].Events() {
		for _, a := range e.Attributes {
			if e.Name == "pgfence.rejected" && a.Key == "pgfence.fence.accepted_token" && a.Value.AsInt64() == l.Token() {
				rejected = true
			}
		}
	}
	if !rejected {
		t.Errorf("stale write span events %+v", writes[0].Events())
	}
	if v, _ := telemetrytest.Attr(writes[0], "pgfence.fence.resource"); v.AsString() != "kv:a" {
		t.Errorf("write span resource %q", v.AsString())
	}
	leased := p.Ended("pgfence.fence.exec_leased")
	if len(leased) != 1 {
		t.Fatalf("%d exec_leased spans", len(leased))
	}
	if v, _ := telemetrytest.Attr(leased[0], "pgfence.lease.holder"); v.AsString() != l.Holder() {
		t.Errorf("exec_leased span holder %q, want %q", v.AsString(), l.Holder())
	}
	if n := len(p.Ended("pgfence.fence.exec")) + len(p.Ended("pgfence.fence.update_row")) + len(p.Ended("pgfence.fence.write_leased")); n != 5 {
		t.Errorf("%d exec, update_row and write_leased spans, want 5", n)
	}

	// Audit: the grant and the write it protected, joined by trace id.
	var (
		event              string
		leaseTok, fenceTok int64
	)
	err = pool.QueryRow(ctx, `SELECT e.event, e.token, f.token
  FROM pgfence.lease_events e JOIN pgfence.fences f USING (trace_id)
 WHERE e.trace_id = $1 AND e.event IN ('acquired', 'taken_over')`, traceID).Scan(&event, &leaseTok, &fenceTok)
	if err != nil || event != "acquired" || leaseTok != l.Token() || fenceTok != l.Token() {
		t.Fatalf("join: %s %d %d %v", event, leaseTok, fenceTok, err)
	}

	// A write outside the request is its own trace (its span is a root). It
	// presents the token of the expired lease's successor.
	next := grant(t, pool, "kv:a")
	if _, err := f.ExecToken(context.Background(), pool, "kv:a", next.Token, update, "own trace", next.Token); err != nil {
		t.Fatal(err)
	}
	execs := p.Ended("pgfence.fence.exec")
	own := execs[len(execs)-1].SpanContext().TraceID().String()
	var id *string
	if err := pool.QueryRow(ctx, `SELECT trace_id FROM pgfence.fences WHERE resource = 'kv:a'`).Scan(&id); err != nil || id == nil || *id != own || own == traceID {
		t.Fatalf("trace id of a write in its own trace: %v %v, want %s", id, err, own)
	}

	// Without tracing, a later write clears the trace id: it names the last write.
	untraced := pgfence.New(&pgfence.Config{MeterProvider: p.Meter, TracerProvider: tracenoop.NewTracerProvider()})
	mustExec(t, pool, expireSQL, "kv:a")
	next = grant(t, pool, "kv:a")
	if _, err := untraced.ExecToken(context.Background(), pool, "kv:a", next.Token, update, "untraced", next.Token); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT trace_id FROM pgfence.fences WHERE resource = 'kv:a'`).Scan(&id); err != nil || id != nil {
		t.Fatalf("trace id after an untraced write: %v %v", id, err)
	}
	if n := p.Metrics(t).Sum("pgfence.fence.writes"); n != 9 {
		t.Errorf("pgfence.fence.writes = %d after the untraced writes, want 9", n)
	}
}

// TestTelemetryUnknownOutcome: a fenced write whose COMMIT reply is lost is
// counted as unknown.
func TestTelemetryUnknownOutcome(t *testing.T) {
	p, f := observedFencer(t)
	db := pgfencetest.NewDatabase(t)
	setupKV(t, db.Pool)
	ctx := testContext(t)
	conn, proxy := proxied(t, db)
	trig := proxy.CutAfter(faultproxy.IsCommit)
	_, err := f.WriteToken(ctx, conn, "kv:a", 1, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE kv SET v = 'x', token = 1 WHERE k = 'a'`)
		return err
	})
	if !errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("write with a lost COMMIT reply: %v", err)
	}
	<-trig.Done()
	m := p.Metrics(t)
	if n := m.Sum("pgfence.fence.writes", attribute.String("pgfence.operation", "write"), attribute.String("pgfence.outcome", "unknown")); n != 1 {
		t.Errorf("writes{write,unknown} = %d, want 1", n)
	}
	spans := p.Ended("pgfence.fence.write")
	if len(spans) != 1 {
		t.Fatalf("%d write spans", len(spans))
	}
	if v, _ := telemetrytest.Attr(spans[0], "error.type"); v.AsString() != "outcome_unknown" {
		t.Errorf("error.type %q", v.AsString())
	}
	if v, _ := telemetrytest.Attr(spans[0], "pgfence.fence.op"); len(v.AsString()) != 36 {
		t.Errorf("op id %q", v.AsString())
	}
}

// BenchmarkTelemetryExec measures a fenced single-row UPDATE with the default
// (no-op) providers, and with SDK providers and a span in the context (the
// trace id is set in the same pipeline and the fences trigger runs).
func BenchmarkTelemetryExec(b *testing.B) {
	pool := pgfencetest.NewPool(b)
	setupKV(b, pool)
	var token int64
	for _, mode := range []string{"off", "traced"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			f := pgfence.New(nil)
			if mode == "traced" {
				var p *telemetrytest.Providers
				p, f = observedFencer(b)
				var span trace.Span
				ctx, span = p.Tracer.Tracer("bench").Start(ctx, "bench")
				defer span.End()
			}
			for b.Loop() {
				token++
				if _, err := f.ExecToken(ctx, pool, "kv:a", token, `UPDATE kv SET v = 'x', token = $1 WHERE k = 'a'`, token); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestTelemetryRejectionSpanExcludesRecord: a rejected write's span is the
// write alone; it ends before the best-effort audit insert, which here waits
// its whole timeout (a second) for a table another session has locked.
func TestTelemetryRejectionSpanExcludesRecord(t *testing.T) {
	p, f := observedFencer(t)
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	ctx := testContext(t)
	update := `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`
	if _, err := f.ExecToken(ctx, pool, "kv:a", 5, update, "five", 5); err != nil {
		t.Fatal(err)
	}
	blockRejectionRecords(t, ctx, pool)

	if _, err := f.ExecToken(ctx, pool, "kv:a", 4, update, "four", 4); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("stale Exec: %v", err)
	}
	returned := time.Now()
	spans := p.Ended("pgfence.fence.exec")
	last := spans[len(spans)-1]
	if v, _ := telemetrytest.Attr(last, "pgfence.outcome"); v.AsString() != "stale_token" {
		t.Fatalf("last exec span's outcome %q, want stale_token", v.AsString())
	}
	// The record blocked for about a second after the write was decided.
	if gap := returned.Sub(last.EndTime()); gap < 500*time.Millisecond {
		t.Errorf("the span ended %v before Exec returned: it includes the blocked audit record", gap)
	}
}

// A write whose fn panicked is recorded as a failed write, not an accepted
// one, while the panic goes on to the caller.
func TestTelemetryPanicInFn(t *testing.T) {
	p, f := observedFencer(t)
	pool := pgfencetest.NewPool(t)
	ctx := testContext(t)
	issue(t, pool, "panic/t")
	mustPanic(t, func() {
		_, _ = f.WriteToken(ctx, pool, "panic/t", 1, func(context.Context, pgx.Tx) error { panic("boom") })
	})
	m := p.Metrics(t)
	if n := m.Sum("pgfence.fence.writes", attribute.String("pgfence.operation", "write"), attribute.String("pgfence.outcome", "accepted")); n != 0 {
		t.Errorf("writes{write,accepted} = %d after fn panicked, want 0", n)
	}
	spans := p.Ended("pgfence.fence.write")
	if len(spans) != 1 {
		t.Fatalf("%d write spans", len(spans))
	}
	if v, ok := telemetrytest.Attr(spans[0], "error.type"); !ok || v.AsString() == "" {
		t.Errorf("span of a write whose fn panicked has no error.type")
	}
}
