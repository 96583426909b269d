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
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestTelemetry walks both modes through every outcome and checks the
// metrics, the spans and the transition logs.
func TestTelemetry(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createCharges(t, pool)
	p := telemetrytest.New(t)
	var logs bytes.Buffer
	store := newStore(t, &idempotency.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx, root := p.Tracer.Tracer("test").Start(context.Background(), "request")

	// Atomic: new, replayed, mismatch.
	req := idempotency.Request{Scope: "charges", Key: "order-1", Payload: []byte(`{"amount":5}`)}
	var fnSpan trace.SpanContext
	work := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		fnSpan = trace.SpanContextFromContext(ctx)
		return charge("order-1", 5)(ctx, tx)
	}
	for i, want := range []bool{false, true} {
		if out, err := store.Do(ctx, pool, req, work); err != nil || out.Replayed != want {
			t.Fatalf("Do #%d: %v %v", i, out, err)
		}
	}
	other := req
	other.Payload = []byte(`{"amount":6}`)
	if _, err := store.Do(ctx, pool, other, work); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("Do with another payload: %v", err)
	}

	// Leased: new, in progress, takeover after the lease expired, a late
	// completion by the replaced owner, replayed.
	lreq := idempotency.Request{Scope: "mail", Key: "welcome-7"}
	first, err := store.Claim(ctx, pool, lreq)
	if err != nil || first.Replayed {
		t.Fatalf("first claim: %v %v", first, err)
	}
	if _, err := store.Claim(ctx, pool, lreq); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("claim while held: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgfence.idempotency_keys SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE key = 'welcome-7'`); err != nil {
		t.Fatal(err)
	}
	second, err := store.Claim(ctx, pool, lreq)
	if err != nil || second.Replayed || second.Attempt.Epoch() != 2 {
		t.Fatalf("takeover claim: %v %v", second, err)
	}
	if _, err := first.Attempt.Complete(ctx, []byte("late")); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("late completion: %v", err)
	}
	if _, err := second.Attempt.Complete(ctx, []byte("sent")); err != nil {
		t.Fatal(err)
	}
	if out, err := store.Claim(ctx, pool, lreq); err != nil || !out.Replayed {
		t.Fatalf("claim after completion: %v %v", out, err)
	}
	root.End()

	m := p.Metrics(t)
	attrs := func(op, outcome string) []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("pgfence.operation", op), attribute.String("pgfence.outcome", outcome)}
	}
	for _, want := range []struct {
		op, outcome string
		n           int64
	}{
		{"atomic", "new", 1}, {"atomic", "replayed", 1}, {"atomic", "mismatch", 1},
		{"leased", "new", 1}, {"leased", "taken_over", 1}, {"leased", "in_progress", 1}, {"leased", "replayed", 1},
		{"complete", "ok", 1}, {"complete", "not_owner", 1},
	} {
		if n := m.Sum("pgfence.idempotency.operations", attrs(want.op, want.outcome)...); n != want.n {
			t.Errorf("operations{%s,%s} = %d, want %d", want.op, want.outcome, n, want.n)
		}
	}
	if n, _, _ := m.Histogram("pgfence.idempotency.duration", attribute.String("pgfence.operation", "atomic")); n != 3 {
		t.Errorf("atomic duration count %d, want 3", n)
	}
	if n, _, _ := m.Histogram("pgfence.idempotency.duration", attribute.String("pgfence.operation", "leased")); n != 4 {
		t.Errorf("leased duration count %d, want 4", n)
	}

	// Spans: the Func runs inside Do's span; refusals are answers, not errors.
	atomic := p.Ended("pgfence.idempotency.atomic")
	if len(atomic) != 3 {
		t.Fatalf("%d atomic spans", len(atomic))
	}
	if fnSpan.SpanID() != atomic[0].SpanContext().SpanID() {
		t.Error("the Func's context does not carry Do's span")
	}
	for _, s := range atomic {
		if v, _ := telemetrytest.Attr(s, "pgfence.idempotency.key"); v.AsString() != "order-1" || s.Status().Code == codes.Error {
			t.Errorf("atomic span key %q status %v", v.AsString(), s.Status())
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), "amount") {
				t.Errorf("span attribute %s carries the payload", kv.Key)
			}
		}
	}
	leased := p.Ended("pgfence.idempotency.leased")
	if len(leased) != 4 {
		t.Fatalf("%d leased spans", len(leased))
	}
	if v, _ := telemetrytest.Attr(leased[2], "pgfence.idempotency.epoch"); v.AsInt64() != 2 {
		t.Errorf("takeover span epoch %d", v.AsInt64())
	}
	completes := p.Ended("pgfence.idempotency.complete")
	if len(completes) != 2 || completes[0].Status().Code != codes.Error {
		t.Errorf("complete spans: %d, the late one must be an error", len(completes))
	}

	for _, want := range []string{"leased key taken over", "late complete by a replaced owner refused", "duplicate answered"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no log %q in:\n%s", want, logs.String())
		}
	}
}
