package pgcluster_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
)

func startPrimary(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	if _, err := pgcluster.FindBinaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func connect(t *testing.T, c *pgcluster.Cluster) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), c.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func timeline(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var tl int
	if err := conn.QueryRow(context.Background(), `SELECT timeline_id FROM pg_control_checkpoint()`).Scan(&tl); err != nil {
		t.Fatal(err)
	}
	return tl
}

func TestStandby(t *testing.T) {
	for _, sync := range []bool{false, true} {
		name := map[bool]string{false: "async", true: "sync"}[sync]
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			primary := startPrimary(t)
			p := connect(t, primary)
			if _, err := p.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (1)`); err != nil {
				t.Fatal(err)
			}
			standby, err := primary.StartStandby(ctx, &pgcluster.StandbyConfig{Sync: sync})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = standby.Close() })
			var state string
			if err := p.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication`).Scan(&state); err != nil || state != name {
				t.Fatalf("sync_state %q %v, want %s", state, err, name)
			}
			if _, err := p.Exec(ctx, `INSERT INTO t VALUES (2)`); err != nil {
				t.Fatal(err)
			}
			if err := primary.WaitReplayed(ctx, standby); err != nil {
				t.Fatal(err)
			}
			s := connect(t, standby)
			var n int
			if err := s.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 2 {
				t.Fatalf("standby sees %d rows (%v), want 2", n, err)
			}
			if in, err := standby.InRecovery(ctx); err != nil || !in {
				t.Fatalf("standby in recovery: %v %v", in, err)
			}
			_, err = s.Exec(ctx, `INSERT INTO t VALUES (3)`)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
				t.Fatalf("write on the standby: want 25006, got %v", err)
			}
			if err := primary.Kill(); err != nil {
				t.Fatal(err)
			}
			if err := standby.Promote(ctx); err != nil {
				t.Fatal(err)
			}
			if in, err := standby.InRecovery(ctx); err != nil || in {
				t.Fatalf("promoted standby in recovery: %v %v", in, err)
			}
			s2 := connect(t, standby)
			if _, err := s2.Exec(ctx, `INSERT INTO t VALUES (3)`); err != nil {
				t.Fatalf("write after promotion: %v", err)
			}
			if _, err := s2.Exec(ctx, `CHECKPOINT`); err != nil {
				t.Fatal(err)
			}
			if tl := timeline(t, s2); tl != 2 {
				t.Fatalf("timeline after promotion %d, want 2", tl)
			}
		})
	}
}
