package pgfence_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The database/sql writes report as the pgx ones do: the metrics and spans
// by operation and outcome, and a rejection recorded with its operation id
// and the trace id of the refused call (set for the fence's transaction, in a
// statement of its own). Not parallel: it reads the global providers.
func TestTelemetrySQL(t *testing.T) {
	for _, d := range sqlDrivers {
		t.Run(d.name, func(t *testing.T) {
			o := observe(t)
			ctx := testContext(t)
			db := pgfencetest.NewDatabase(t)
			newKV(t, db.Pool)
			pgfencetest.IssueToken(t, db.Pool, "kv:a", 100)
			sdb := openDB(t, d.driver, db.URL)

			const traceID = "0af7651916cd43dd8448eb211c80319c"
			tctx := telemetrytest.RemoteTrace(t, ctx, traceID)
			if _, err := pgfence.WriteSQL(tctx, sdb, pgfence.LeaseOf("kv:a", "", 5), sqlFn(set("five", 5))); err != nil {
				t.Fatal(err)
			}
			var stored string
			if err := db.Pool.QueryRow(ctx, `SELECT trace_id FROM pgfence.fences WHERE resource = 'kv:a'`).Scan(&stored); err != nil || stored != traceID {
				t.Errorf("trace id stored with the accepted token: %q, %v; want %s", stored, err, traceID)
			}
			_, err := pgfence.ExecSQL(tctx, sdb, pgfence.LeaseOf("kv:a", "", 4), `UPDATE kv SET v = 'four' WHERE k = 'a'`)
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
			l := acquire(t, db.Pool, "job")
			if _, err := pgfence.WriteSQL(ctx, sdb, pgfence.Checked(l), func(context.Context, *sql.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}

			for _, c := range []struct {
				op, outcome string
			}{{"write", "accepted"}, {"exec", "stale_token"}, {"write_leased", "accepted"}} {
				if n := o.Sum(t, "pgfence.fence.operations", attribute.String("pgfence.operation", c.op), attribute.String("pgfence.outcome", c.outcome)); n != 1 {
					t.Errorf("pgfence.fence.operations{%s,%s} = %d, want 1", c.op, c.outcome, n)
				}
			}
			if spans := o.Ended("pgfence.fence.exec"); len(spans) != 1 {
				t.Errorf("%d exec spans, want 1", len(spans))
			}
		})
	}
}
