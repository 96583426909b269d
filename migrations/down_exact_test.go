package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/pgfence/pgfence/migrations"
)

// catalogSnapshot describes every object of schema pgfence the way it
// behaves: function definitions (body, volatility, SECURITY DEFINER, SET
// clauses), effective privileges, columns with their defaults, constraints
// (and whether they are validated), triggers, indexes, views and storage
// options. goose's version table is left out.
const catalogSnapshot = `
WITH rels AS (
    SELECT c.oid, c.relname, c.relkind, c.reloptions, coalesce(c.relacl, acldefault('r', c.relowner)) AS acl
      FROM pg_class c
     WHERE c.relnamespace = 'pgfence'::regnamespace AND c.relname <> 'goose_db_version'
       AND c.relkind IN ('r', 'v', 'p')
)
SELECT 'function ' || pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = 'pgfence'::regnamespace
UNION ALL
SELECT 'function acl ' || p.oid::regprocedure::text || ' ' || coalesce(g.rolname, 'PUBLIC') || ' ' || a.privilege_type
  FROM pg_proc p
 CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
  LEFT JOIN pg_roles g ON g.oid = a.grantee
 WHERE p.pronamespace = 'pgfence'::regnamespace
UNION ALL
SELECT 'relation ' || r.relname || ' ' || r.relkind::text || ' ' || coalesce(r.reloptions::text, '') FROM rels r
UNION ALL
SELECT 'relation acl ' || r.relname || ' ' || coalesce(g.rolname, 'PUBLIC') || ' ' || a.privilege_type
  FROM rels r
 CROSS JOIN LATERAL aclexplode(r.acl) a
  LEFT JOIN pg_roles g ON g.oid = a.grantee
UNION ALL
SELECT 'column ' || r.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
       || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
       || CASE WHEN a.attidentity <> '' THEN ' IDENTITY ' || a.attidentity::text ELSE '' END
  FROM rels r
  JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
UNION ALL
SELECT 'constraint ' || r.relname || ' ' || con.conname || ' ' || pg_get_constraintdef(con.oid)
       || CASE WHEN con.convalidated THEN '' ELSE ' (not validated)' END
  FROM rels r JOIN pg_constraint con ON con.conrelid = r.oid
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid) || CASE t.tgenabled WHEN 'O' THEN '' ELSE ' enabled=' || t.tgenabled::text END
  FROM rels r JOIN pg_trigger t ON t.tgrelid = r.oid AND NOT t.tgisinternal
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
  FROM rels r JOIN pg_index i ON i.indrelid = r.oid
UNION ALL
SELECT 'view ' || r.relname || ' ' || pg_get_viewdef(r.oid) FROM rels r WHERE r.relkind = 'v'
ORDER BY 1`

func snapshot(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), catalogSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDownRestoresExactly migrates up one version at a time, recording the
// catalog after each, then rolls back one version at a time and checks that
// every Down section restores the catalog of the version below it exactly:
// function bodies and settings, privileges, constraints, triggers, defaults.
// TestUpDownUp only compares object names, so a Down that restored an older
// body, a validated constraint as NOT VALID, or SECURITY DEFINER left on a
// function would pass it.
func TestDownRestoresExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := blankDatabase(t)
	// goose's provider on the embedded files, as the Migrator uses it, for
	// UpTo (the Migrator only migrates all the way up).
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA `+migrations.Schema); err != nil {
		t.Fatal(err)
	}
	store, err := database.NewStore(database.DialectPostgres, migrations.VersionTable)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	m, err := goose.NewProvider("", sqlDB, migrations.FS, goose.WithStore(store), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	versions := []int64{0}
	for _, s := range m.ListSources() {
		versions = append(versions, s.Version)
	}
	if versions[len(versions)-1] != migrations.Latest() {
		t.Fatalf("status lists versions %v, want up to %d", versions, migrations.Latest())
	}
	before := map[int64][]string{0: snapshot(t, db.Pool)}
	for _, v := range versions[1:] {
		if _, err := m.UpTo(ctx, v); err != nil {
			t.Fatalf("up to %d: %v", v, err)
		}
		before[v] = snapshot(t, db.Pool)
	}
	for i := len(versions) - 1; i > 0; i-- {
		v, below := versions[i], versions[i-1]
		if _, err := m.DownTo(ctx, below); err != nil {
			t.Fatalf("down from %d to %d: %v", v, below, err)
		}
		if got, want := snapshot(t, db.Pool), before[below]; strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("the Down of migration %d does not restore version %d:\n%s", v, below, diff(want, got))
		}
	}
}

// diff lists the lines only in want (-) and only in got (+).
func diff(want, got []string) string {
	in := func(list []string) map[string]int {
		n := map[string]int{}
		for _, s := range list {
			n[s]++
		}
		return n
	}
	var b strings.Builder
	only := func(sign string, list []string, other map[string]int) {
		for _, s := range list {
			if other[s] == 0 {
				b.WriteString(sign + " " + s + "\n")
			} else {
				other[s]--
			}
		}
	}
	only("-", want, in(got))
	only("+", got, in(want))
	return b.String()
}
