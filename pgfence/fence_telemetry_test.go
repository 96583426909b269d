package pgfence_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The writes report to the global OpenTelemetry providers. Their
// instruments are made once per process, from the global providers, which
// delegate to the first providers set and to no later ones; so this test
// binary sets one pair of SDK providers, once, and each telemetry test reads
// what the writes reported while it ran. Between those tests the tracer
// records nothing and starts no trace (as with no provider set), so that the
// other tests' writes carry no trace id of it.
var global struct {
	once      sync.Once
	providers *telemetrytest.Providers
	tracer    trace.TracerProvider // providers.Tracer while recording
	recording atomic.Bool
}

// observation is what one telemetry test reads: the spans ended and the
// metrics recorded since it began.
type observation struct {
	*telemetrytest.Providers
	spans  int                   // spans ended before the test
	before telemetrytest.Metrics // metrics before the test
}

// observe installs the SDK providers as the global providers for the rest of
// t, restoring the previous ones when t ends, and returns what the writes
// report from now on. Tests that call it must not be parallel (nor run
// beside parallel ones): metrics are read as differences.
func observe(t testing.TB) *observation {
	t.Helper()
	global.once.Do(func() {
		p := &telemetrytest.Providers{Reader: sdkmetric.NewManualReader(), Spans: tracetest.NewSpanRecorder()}
		p.Meter = sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.Reader))
		p.Tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p.Spans))
		global.providers = p
		global.tracer = gatedTracerProvider{sdk: p.Tracer}
	})
	prevMeter, prevTracer := otel.GetMeterProvider(), otel.GetTracerProvider()
	otel.SetMeterProvider(global.providers.Meter)
	otel.SetTracerProvider(global.tracer)
	global.recording.Store(true)
	t.Cleanup(func() {
		global.recording.Store(false)
		otel.SetMeterProvider(prevMeter)
		otel.SetTracerProvider(prevTracer)
	})
	return &observation{
		Providers: global.providers,
		spans:     len(global.providers.Spans.Ended()),
		before:    global.providers.Metrics(t),
	}
}

// untraced runs f as a process without a tracer provider would: its writes
// start no trace.
func untraced(f func()) {
	global.recording.Store(false)
	defer global.recording.Store(true)
	f()
}

// Sum is the increase of the counter name over the data points with attrs
// since the test began.
func (o *observation) Sum(t testing.TB, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	return o.Metrics(t).Sum(name, attrs...) - o.before.Sum(name, attrs...)
}

// Count is the increase of the histogram name's count since the test began.
func (o *observation) Count(t testing.TB, name string, attrs ...attribute.KeyValue) uint64 {
	t.Helper()
	now, _, _ := o.Metrics(t).Histogram(name, attrs...)
	before, _, _ := o.before.Histogram(name, attrs...)
	return now - before
}

// Ended returns the spans named name ended since the test began.
func (o *observation) Ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range o.Spans.Ended()[o.spans:] {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// gatedTracerProvider gives tracers that record through sdk while a
// telemetry test runs, and otherwise act as the tracers of the global
// provider before any is set: a span that records nothing and carries the
// context's span context on.
type gatedTracerProvider struct {
	embedded.TracerProvider
	sdk trace.TracerProvider
}

func (p gatedTracerProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return gatedTracer{sdk: p.sdk.Tracer(name, opts...)}
}

type gatedTracer struct {
	embedded.Tracer
	sdk trace.Tracer
}

func (t gatedTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if global.recording.Load() {
		return t.sdk.Start(ctx, name, opts...)
	}
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContextFromContext(ctx))
	return ctx, trace.SpanFromContext(ctx)
}

// TestWritesReportToGlobalProviders: the writes report to the global
// OpenTelemetry providers the application sets, even when they were first
// called before.
func TestWritesReportToGlobalProviders(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := testContext(t)
	issue(t, pool, "global/a")
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("global/a", "", 1), `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	o := observe(t)
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("global/a", "", 2), `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	if n := o.Sum(t, "pgfence.fence.operations", attribute.String("pgfence.operation", "exec"), attribute.String("pgfence.outcome", "accepted")); n != 1 {
		t.Errorf("writes{exec,accepted} on the global provider = %d, want 1", n)
	}
	if spans := o.Ended("pgfence.fence.exec"); len(spans) != 1 {
		t.Errorf("%d exec spans on the global provider, want 1", len(spans))
	}
}

// TestTelemetry checks the metrics and spans of every kind of write, and that
// one query joins the lease grant to the fenced write it protected through
// the trace id stored beside both.
func TestTelemetry(t *testing.T) {
	o := observe(t)
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	ctx, root := o.Tracer.Tracer("test").Start(testContext(t), "request")
	traceID := root.SpanContext().TraceID().String()

	c, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "kv:a", time.Minute, &leases.AcquireOptions{NoKeepAlive: true}) // expired below
	if err != nil {
		t.Fatal(err)
	}
	stale := pgfence.LeaseOf("kv:a", "", l.Token()-1)
	update := `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`
	if _, err := pgfence.Exec(ctx, pool, l, update, "one", l.Token()); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, pool, stale, update, "stale", l.Token()-1); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("stale Exec: %v", err)
	}
	if _, err := pgfence.Write(ctx, pool, stale, func(ctx context.Context, tx pgx.Tx) error {
		t.Error("fn ran for a stale token")
		return nil
	}); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("stale Write: %v", err)
	}
	if _, err := pgfence.Exec(ctx, pool, pgfence.Checked(l), update, "leased", l.Token()); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, expireSQL, "kv:a")
	if _, err := pgfence.Write(ctx, pool, pgfence.Checked(l), func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("lease-checked Write on an expired lease: %v", err)
	}
	root.End()

	kv := func(op, outcome string) []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("pgfence.operation", op), attribute.String("pgfence.outcome", outcome)}
	}
	for _, want := range []struct{ op, outcome string }{
		{"exec", "accepted"}, {"exec", "stale_token"}, {"write", "stale_token"}, {"exec_leased", "accepted"},
		{"write_leased", "lease_not_held"},
	} {
		if n := o.Sum(t, "pgfence.fence.operations", kv(want.op, want.outcome)...); n != 1 {
			t.Errorf("pgfence.fence.operations{%s,%s} = %d, want 1", want.op, want.outcome, n)
		}
	}
	if n := o.Sum(t, "pgfence.fence.operations"); n != 5 {
		t.Errorf("pgfence.fence.operations = %d, want 5", n)
	}
	if n := o.Count(t, "pgfence.fence.duration"); n != 5 || o.Metrics(t).Unit("pgfence.fence.duration") != "s" {
		t.Errorf("pgfence.fence.duration count %d unit %q", n, o.Metrics(t).Unit("pgfence.fence.duration"))
	}

	// Spans: children of the request; the rejected Write names its resource
	// and outcome; the lease-checked one names its lease's holder.
	writes := o.Ended("pgfence.fence.write")
	if len(writes) != 1 {
		t.Fatalf("%d write spans", len(writes))
	}
	if writes[0].Parent().SpanID() != root.SpanContext().SpanID() {
		t.Error("write span is not a child of the request")
	}
	if v, _ := telemetrytest.Attr(writes[0], "pgfence.outcome"); v.AsString() != "stale_token" {
		t.Errorf("stale write span outcome %q", v.AsString())
	}
	if v, _ := telemetrytest.Attr(writes[0], "pgfence.fence.resource"); v.AsString() != "kv:a" {
		t.Errorf("write span resource %q", v.AsString())
	}
	leased := o.Ended("pgfence.fence.exec_leased")
	if len(leased) != 1 {
		t.Fatalf("%d exec_leased spans", len(leased))
	}
	if v, _ := telemetrytest.Attr(leased[0], "pgfence.lease.holder"); v.AsString() != l.Holder() {
		t.Errorf("exec_leased span holder %q, want %q", v.AsString(), l.Holder())
	}
	if n := len(o.Ended("pgfence.fence.exec")) + len(o.Ended("pgfence.fence.write_leased")); n != 3 {
		t.Errorf("%d exec and write_leased spans, want 3", n)
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
	if _, err := pgfence.Exec(context.Background(), pool, next.lease(), update, "own trace", next.Token); err != nil {
		t.Fatal(err)
	}
	execs := o.Ended("pgfence.fence.exec")
	own := execs[len(execs)-1].SpanContext().TraceID().String()
	var id *string
	if err := pool.QueryRow(ctx, `SELECT trace_id FROM pgfence.fences WHERE resource = 'kv:a'`).Scan(&id); err != nil || id == nil || *id != own || own == traceID {
		t.Fatalf("trace id of a write in its own trace: %v %v, want %s", id, err, own)
	}

	// Without tracing, a later write clears the trace id: it names the last write.
	mustExec(t, pool, expireSQL, "kv:a")
	next = grant(t, pool, "kv:a")
	untraced(func() {
		if _, err := pgfence.Exec(context.Background(), pool, next.lease(), update, "untraced", next.Token); err != nil {
			t.Fatal(err)
		}
	})
	if err := pool.QueryRow(ctx, `SELECT trace_id FROM pgfence.fences WHERE resource = 'kv:a'`).Scan(&id); err != nil || id != nil {
		t.Fatalf("trace id after an untraced write: %v %v", id, err)
	}
	if n := o.Sum(t, "pgfence.fence.operations"); n != 7 {
		t.Errorf("pgfence.fence.operations = %d after the untraced writes, want 7", n)
	}
}

// TestTelemetryUnknownOutcome: a fenced write whose COMMIT reply is lost is
// counted as unknown.
func TestTelemetryUnknownOutcome(t *testing.T) {
	o := observe(t)
	db := pgfencetest.NewDatabase(t)
	setupKV(t, db.Pool)
	ctx := testContext(t)
	conn, proxy := proxied(t, db)
	trig := proxy.CutAfter(faultproxy.IsCommit)
	_, err := pgfence.Write(ctx, conn, pgfence.LeaseOf("kv:a", "", 1), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE kv SET v = 'x', token = 1 WHERE k = 'a'`)
		return err
	})
	if !errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("write with a lost COMMIT reply: %v", err)
	}
	<-trig.Done()
	if n := o.Sum(t, "pgfence.fence.operations", attribute.String("pgfence.operation", "write"), attribute.String("pgfence.outcome", "unknown")); n != 1 {
		t.Errorf("writes{write,unknown} = %d, want 1", n)
	}
	spans := o.Ended("pgfence.fence.write")
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

// BenchmarkTelemetryExec measures a fenced single-row UPDATE with the
// global providers unset, and with SDK providers and a span in the context
// (the trace id is set in the same pipeline and the fences trigger runs).
func BenchmarkTelemetryExec(b *testing.B) {
	pool := pgfencetest.NewPool(b)
	setupKV(b, pool)
	var token int64
	for _, mode := range []string{"off", "traced"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			if mode == "traced" {
				o := observe(b)
				var span trace.Span
				ctx, span = o.Tracer.Tracer("bench").Start(ctx, "bench")
				defer span.End()
			}
			for b.Loop() {
				token++
				if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", token), `UPDATE kv SET v = 'x', token = $1 WHERE k = 'a'`, token); err != nil {
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
	o := observe(t)
	pool := pgfencetest.NewPool(t)
	setupKV(t, pool)
	ctx := testContext(t)
	update := `UPDATE kv SET v = $1, token = $2 WHERE k = 'a'`
	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 5), update, "five", 5); err != nil {
		t.Fatal(err)
	}
	blockRejectionRecords(t, ctx, pool)

	if _, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:a", "", 4), update, "four", 4); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("stale Exec: %v", err)
	}
	returned := time.Now()
	spans := o.Ended("pgfence.fence.exec")
	if len(spans) != 2 {
		t.Fatalf("%d exec spans, want 2", len(spans))
	}
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
	o := observe(t)
	pool := pgfencetest.NewPool(t)
	ctx := testContext(t)
	issue(t, pool, "panic/t")
	mustPanic(t, func() {
		_, _ = pgfence.Write(ctx, pool, pgfence.LeaseOf("panic/t", "", 1), func(context.Context, pgx.Tx) error { panic("boom") })
	})
	if n := o.Sum(t, "pgfence.fence.operations", attribute.String("pgfence.operation", "write"), attribute.String("pgfence.outcome", "accepted")); n != 0 {
		t.Errorf("writes{write,accepted} = %d after fn panicked, want 0", n)
	}
	if n := o.Sum(t, "pgfence.fence.operations", attribute.String("pgfence.operation", "write"), attribute.String("pgfence.outcome", "error")); n != 1 {
		t.Errorf("writes{write,error} = %d after fn panicked, want 1", n)
	}
	spans := o.Ended("pgfence.fence.write")
	if len(spans) != 1 {
		t.Fatalf("%d write spans", len(spans))
	}
	if v, ok := telemetrytest.Attr(spans[0], "error.type"); !ok || v.AsString() == "" {
		t.Errorf("span of a write whose fn panicked has no error.type")
	}
}
