package pgfence_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// UpdateRow on a protected table is refused by the guard (it presents no
// fence), with an error that says why and what to do instead.
func TestUpdateRowOnProtectedTableSaysWhy(t *testing.T) {
	ctx := testContext(t)
	pool := pgfencetest.NewPool(t)
	mustExec(t, pool, `CREATE TABLE jobs (id text PRIMARY KEY, state text, fence bigint)`)
	mustExec(t, pool, `INSERT INTO jobs VALUES ('1', 'queued', NULL)`)
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{"jobs"}, "id", "jobs:"); err != nil {
		t.Fatal(err)
	}
	err := pgfence.UpdateRow(ctx, pool, pgfence.Table{Name: pgx.Identifier{"jobs"}, Key: "id", Fence: "fence"}, "1", 5, map[string]any{"state": "running"})
	if !errors.Is(err, pgfence.ErrUnfencedWrite) || !strings.Contains(err.Error(), "is protected") {
		t.Fatalf("UpdateRow on a protected table: %v, want ErrUnfencedWrite saying the table is protected", err)
	}
}
