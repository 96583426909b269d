package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/migrations"
)

// Reading the version or the status, and rolling back on a blank database,
// create nothing: goose creates its version table on any call, which left a
// schema pgfence behind after `migrate status` or `doctor` and made a role
// without CREATE on the database fail with "permission denied" instead of
// reading "not installed".
func TestReadOnlyOnBlankDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := blankDatabase(t)
	_, reader := loginRole(t, db, "pgfence_app") // no CREATE on the database
	for name, pool := range map[string]*pgxpool.Pool{"owner": db.Pool, "reader": reader} {
		m := newMigrator(t, pool)
		current, latest, err := m.Version(ctx)
		if err != nil || current != 0 || latest != migrations.Latest() {
			t.Errorf("%s: Version = %d, %d, %v; want 0, %d, nil", name, current, latest, err, migrations.Latest())
		}
		status, err := m.Status(ctx)
		if err != nil || len(status) != len(migrations.Versions()) {
			t.Errorf("%s: Status = %d migrations, %v; want %d", name, len(status), err, len(migrations.Versions()))
		}
		for _, s := range status {
			if s.Applied || s.Name == "" {
				t.Errorf("%s: Status on a blank database: %+v", name, s)
			}
		}
		if pending, err := pendingOf(ctx, m); err != nil || len(pending) != len(status) {
			t.Errorf("%s: Pending = %d, %v; want %d", name, len(pending), err, len(status))
		}
		vs := migrations.Versions()
		for _, to := range []int64{0, vs[len(vs)-2]} {
			if rs, err := m.DownTo(ctx, to); err != nil || len(rs) != 0 {
				t.Errorf("%s: DownTo(%d) = %v, %v; want nothing, nil", name, to, rs, err)
			}
		}
		noSchema(t, db.Pool)
	}
}

func noSchema(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var exists bool
	if err := pool.QueryRow(context.Background(), `SELECT to_regnamespace($1) IS NOT NULL`, migrations.Schema).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("schema %s exists after read-only calls", migrations.Schema)
	}
}
