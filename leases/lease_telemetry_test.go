package leases_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func outcome(v string) attribute.KeyValue { return attribute.String("pgfence.outcome", v) }

// ops is the count of operation op with outcome in m.
func ops(m telemetrytest.Metrics, op, result string) int64 {
	return m.Sum("pgfence.lease.operations", attribute.String("pgfence.operation", op), outcome(result))
}

// durations is the count of durations recorded for operation op (with
// outcome, unless it is "") in m, and their largest.
func durations(m telemetrytest.Metrics, op, result string) (uint64, float64, float64) {
	attrs := []attribute.KeyValue{attribute.String("pgfence.operation", op)}
	if result != "" {
		attrs = append(attrs, outcome(result))
	}
	return m.Histogram("pgfence.lease.duration", attrs...)
}

// TestTelemetry drives one key through a grant, a refused try, a renewal, an
// expiry, a takeover, a stale release and a timed-out wait, and checks every
// metric, the spans and the trace ids stored in the lease history.
func TestTelemetry(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	p := telemetrytest.New(t)
	c := newClient(t, pool, &leases.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer, DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)
	ctx, root := p.Tracer.Tracer("test").Start(ctx, "request")
	traceID := root.SpanContext().TraceID().String()
	const key = "telemetry"
	// No keep-alive: the renewals counted are the test's, each a child of
	// the request.

	l1, err := c.TryAcquire(ctx, key, 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(ctx, key, 10*time.Second, nil); !errors.Is(err, pgfence.ErrLeaseHeld) {
		t.Fatalf("second TryAcquire: %v", err)
	}
	if err := l1.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	backdate(t, pool, key, -time.Second)
	if err := l1.Renew(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("renewal of an expired lease: %v", err)
	}
	l2, err := c.Acquire(ctx, key, 10*time.Second, manual()) // takes over the expired grant
	if err != nil {
		t.Fatal(err)
	}
	if err := l1.Release(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("stale release: %v", err)
	}
	if _, err := c.Acquire(ctx, key, 10*time.Second, &leases.AcquireOptions{MaxWait: 30 * time.Millisecond}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire of a held key with MaxWait: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	root.End()

	m := p.Metrics(t)
	for _, want := range []struct {
		op, outcome string
		n           int64
	}{
		{"attempt", "acquired", 1},
		{"attempt", "taken_over", 1},
		{"renew", "renewed", 1},
		{"renew", "lost", 1},
		{"release", "not_held", 1},
		{"release", "released", 1},
		{"acquire", "unknown", 0},
		{"renew", "unknown", 0},
		{"release", "unknown", 0},
	} {
		if got := ops(m, want.op, want.outcome); got != want.n {
			t.Errorf("operations{%s, %s} = %d, want %d", want.op, want.outcome, got, want.n)
		}
	}
	// The refused TryAcquire, and at least one refused poll of the waiting Acquire.
	if n := ops(m, "attempt", "held"); n < 2 {
		t.Errorf("held attempts = %d, want >= 2", n)
	}
	for _, want := range []struct {
		outcome string
		n       uint64
	}{{"acquired", 2}, {"held", 1}, {"timeout", 1}} {
		if n, _, _ := durations(m, "acquire", want.outcome); n != want.n {
			t.Errorf("duration{acquire, %s} count = %d, want %d", want.outcome, n, want.n)
		}
	}
	if n, sum, _ := durations(m, "acquire", "timeout"); n != 1 || sum < 0.025 {
		t.Errorf("timed-out wait: count %d, %.3fs, want 1 and >= 0.025s", n, sum)
	}
	if n, _, maxv := durations(m, "trust_left", ""); n != 2 || maxv <= 5 || maxv > 9 {
		t.Errorf("duration{trust_left}: count %d max %.3fs, want 2 and a trust window of up to 9s", n, maxv)
	}
	for _, o := range []string{"lost", "released"} {
		if n, _, _ := durations(m, "hold", o); n != 1 {
			t.Errorf("duration{hold, %s} count = %d, want 1", o, n)
		}
	}
	if u := m.Unit("pgfence.lease.duration"); u != "s" {
		t.Errorf("duration unit %q", u)
	}

	// Spans: one per call, children of the request, with key, holder and token.
	acquires := p.Ended("pgfence.lease.acquire")
	if len(acquires) != 4 {
		t.Fatalf("%d acquire spans, want 4", len(acquires))
	}
	for _, s := range append(acquires, append(p.Ended("pgfence.lease.renew"), p.Ended("pgfence.lease.release")...)...) {
		if s.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("span %s is not a child of the request", s.Name())
		}
		if v, _ := telemetrytest.Attr(s, "pgfence.lease.key"); v.AsString() != key {
			t.Errorf("span %s key %q", s.Name(), v.AsString())
		}
	}
	if v, _ := telemetrytest.Attr(acquires[0], "pgfence.lease.token"); v.AsInt64() != l1.Token() {
		t.Errorf("acquire span token %d, want %d", v.AsInt64(), l1.Token())
	}
	if v, _ := telemetrytest.Attr(acquires[0], "pgfence.lease.holder"); v.AsString() != l1.Holder() {
		t.Errorf("acquire span holder %q, want %q", v.AsString(), l1.Holder())
	}
	if acquires[1].Status().Code == codes.Error {
		t.Error("a refused TryAcquire is marked as an error")
	}
	if v, _ := telemetrytest.Attr(acquires[3], "pgfence.outcome"); v.AsString() != "timeout" || acquires[3].Status().Code != codes.Error {
		t.Errorf("timed-out Acquire span: outcome %q status %v", v.AsString(), acquires[3].Status())
	}
	var events int
	for _, e := range acquires[2].Events() {
		if e.Name == "attempt" {
			events++
		}
	}
	if events != 1 {
		t.Errorf("takeover Acquire span has %d attempt events, want 1", events)
	}
	renews := p.Ended("pgfence.lease.renew")
	if len(renews) != 2 || renews[1].Status().Code != codes.Error {
		t.Errorf("renew spans: %d, the refused one must be an error", len(renews))
	}

	// Audit: every event of the key carries the request's trace id.
	rows, err := pool.Query(ctx, `SELECT event, coalesce(trace_id, '') FROM pgfence.lease_events WHERE key = $1 ORDER BY id`, key)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var event, id string
		if err := rows.Scan(&event, &id); err != nil {
			t.Fatal(err)
		}
		if id != traceID {
			t.Errorf("event %s has trace id %q, want %q", event, id, traceID)
		}
		got = append(got, event)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := "acquired taken_over released"; strings.Join(got, " ") != want {
		t.Errorf("events %q, want %q", strings.Join(got, " "), want)
	}
}

// TestTelemetryOff checks that without a span context nothing is stored and
// without providers nothing breaks.
func TestTelemetryOff(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, nil)
	ctx := ctxTimeout(t, 30*time.Second)
	l, err := c.Acquire(ctx, "plain", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_events WHERE key = 'plain' AND trace_id IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d events without trace id, want 2", n)
	}
}

// TestTelemetryUnknownOutcome: a renewal whose reply is lost is a failed
// renewal with an unknown outcome; the lease is kept.
func TestTelemetryUnknownOutcome(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	proxy := newProxy(t, db.URL)
	p := telemetrytest.New(t)
	c := newClient(t, proxiedPool(t, db.URL, proxy), &leases.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer, DisableWakeups: true})
	ctx := ctxTimeout(t, 30*time.Second)

	l, err := c.TryAcquire(ctx, "k", 10*time.Second, manual()) // the renewal counted is the test's
	if err != nil {
		t.Fatal(err)
	}
	trig := proxy.CutAfter(faultproxy.SQLContains("pgfence.renew"))
	if err := l.Renew(ctx); !errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("renewal with a lost reply: %v", err)
	}
	<-trig.Done()
	if !trig.Fired() || l.Err() != nil {
		t.Fatalf("cut fired %v, lease err %v", trig.Fired(), l.Err())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	m := p.Metrics(t)
	if n := ops(m, "renew", "unknown"); n != 1 {
		t.Errorf("operations{renew, unknown} = %d, want 1", n)
	}
	if n := ops(m, "release", "released"); n != 1 {
		t.Errorf("operations{release, released} = %d, want 1", n)
	}
}

// BenchmarkTelemetryAcquireRelease measures one acquire + release on one key
// without telemetry, with an SDK meter (the takeover read-back joins the
// grant's pipeline) and with a span in the context as well (the trace id is
// set in the grant's and the release's pipelines).
func BenchmarkTelemetryAcquireRelease(b *testing.B) {
	pool := pgfencetest.NewPool(b)
	for _, mode := range []string{"off", "metrics", "traced"} {
		b.Run(mode, func(b *testing.B) {
			cfg := &leases.Config{DisableWakeups: true}
			ctx := context.Background()
			if mode != "off" {
				p := telemetrytest.New(b)
				cfg.MeterProvider = p.Meter
				if mode == "traced" {
					cfg.TracerProvider = p.Tracer
					var span trace.Span
					ctx, span = p.Tracer.Tracer("bench").Start(ctx, "bench")
					defer span.End()
				}
			}
			c := newClient(b, pool, cfg)
			for b.Loop() {
				l, err := c.TryAcquire(ctx, "bench-"+mode, time.Minute, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
