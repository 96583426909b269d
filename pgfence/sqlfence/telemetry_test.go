package sqlfence_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/sqlfence"
)

// A Fencer reports database/sql writes as pgfence's does: the metrics and
// spans by operation and outcome, the log events, and a rejection recorded
// with its operation id and the trace id of the refused call (set for the
// fence's transaction, in a statement of its own).
func TestTelemetry(t *testing.T) {
	for _, d := range sqlDrivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			db := pgfencetest.NewDatabase(t)
			setupKV(t, db.Pool)
			pgfencetest.IssueToken(t, db.Pool, "kv:a", 100)
			p := telemetrytest.New(t)
			var logs bytes.Buffer
			f := sqlfence.New(&pgfence.Config{
				MeterProvider:  p.Meter,
				TracerProvider: p.Tracer,
				Logger:         slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			})
			sdb := openDB(t, d.driver, db.URL)

			const traceID = "0af7651916cd43dd8448eb211c80319c"
			tctx := telemetrytest.RemoteTrace(t, ctx, traceID)
			if _, err := f.WriteToken(tctx, sdb, "kv:a", 5, sqlFn(set("five", 5))); err != nil {
				t.Fatal(err)
			}
			var stored string
			if err := db.Pool.QueryRow(ctx, `SELECT trace_id FROM pgfence.fences WHERE resource = 'kv:a'`).Scan(&stored); err != nil || stored != traceID {
				t.Errorf("trace id stored with the accepted token: %q, %v; want %s", stored, err, traceID)
			}
			_, err := f.ExecToken(tctx, sdb, "kv:a", 4, `UPDATE kv SET v = 'four' WHERE k = 'a'`)
			var stale *pgfence.StaleTokenError
			if !errors.As(err, &stale) {
				t.Fatalf("stale exec: %v", err)
			}
			rs, err := pgfence.Rejections(ctx, db.Pool, "kv:a", 0)
			if err != nil || len(rs) != 1 {
				t.Fatalf("rejections: %+v, %v", rs, err)
			}
			if r := rs[0]; r.Operation != "exec" || r.PresentedToken != 4 || r.AcceptedToken != 5 || r.Op == (pgfence.OpID{}) || r.TraceID != traceID {
				t.Errorf("rejection recorded: %+v", r)
			}
			l := grant(t, db.Pool, "job")
			if err := f.WriteLeased(ctx, sdb, l, func(context.Context, *sql.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}

			m := p.Metrics(t)
			for _, c := range []struct {
				op, outcome string
			}{{"write", "accepted"}, {"exec", "stale_token"}, {"write_leased", "accepted"}} {
				if n := m.Sum("pgfence.fence.writes", attribute.String("pgfence.operation", c.op), attribute.String("pgfence.outcome", c.outcome)); n != 1 {
					t.Errorf("pgfence.fence.writes{%s,%s} = %d, want 1", c.op, c.outcome, n)
				}
			}
			if spans := p.Ended("pgfence.fence.exec"); len(spans) != 1 {
				t.Errorf("%d exec spans, want 1", len(spans))
			}
			for _, msg := range []string{"pgfence: write accepted", "pgfence: write rejected"} {
				if !strings.Contains(logs.String(), msg) {
					t.Errorf("log lacks %q:\n%s", msg, logs.String())
				}
			}
		})
	}
}
