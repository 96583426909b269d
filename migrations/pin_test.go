package migrations_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/migrations"
)

// sqlRecorder records every statement a pool sends, in order.
type sqlRecorder struct {
	mu   sync.Mutex
	sqls []string
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	r.sqls = append(r.sqls, strings.TrimSpace(data.SQL))
	r.mu.Unlock()
	return ctx
}

func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The Migrator runs every migration with search_path pinned: as goose runs
// them, the first statement of each migration's transaction is the pin
// (TestPinnedSections checks the files goose reads; this, what reaches the
// server).
func TestMigratorRunsThePin(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := blankDatabase(t)
	rec := &sqlRecorder{}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rs, err := newMigrator(t, pool).Up(ctx)
	if err != nil || len(rs) != len(migrations.Versions()) {
		t.Fatalf("Up: %d migrations, %v; want %d", len(rs), err, len(migrations.Versions()))
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	pinned := 0
	for i, q := range rec.sqls {
		if q == migrations.SearchPathPin && i > 0 && strings.EqualFold(rec.sqls[i-1], "begin") {
			pinned++
		}
	}
	if pinned != len(rs) {
		t.Fatalf("%d transactions began with the search_path pin, want one per migration (%d)", pinned, len(rs))
	}
}
