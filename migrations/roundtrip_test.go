package migrations_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// leftovers lists what a full rollback left of pgfence in the database:
// any relation, function, type, operator or collation of schema pgfence but
// goose's version table and the migration lock's table, and any privilege on the schema or on the version
// table that the schema's owner did not have before.
const leftovers = `
SELECT 'relation ' || c.relname || ' (' || c.relkind::text || ')'
  FROM pg_class c
 WHERE c.relnamespace = 'pgfence'::regnamespace
   AND c.relname NOT IN ('goose_db_version', 'goose_db_version_id_seq', 'goose_db_version_pkey', 'migration_lock', 'migration_lock_pkey')
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'pgfence'::regnamespace
UNION ALL
SELECT 'type ' || t.typname FROM pg_type t
 WHERE t.typnamespace = 'pgfence'::regnamespace AND t.typname NOT IN ('goose_db_version', '_goose_db_version', 'migration_lock', '_migration_lock')
UNION ALL
SELECT 'operator ' || o.oid::regoperator::text FROM pg_operator o WHERE o.oprnamespace = 'pgfence'::regnamespace
UNION ALL
SELECT 'collation ' || c.collname FROM pg_collation c WHERE c.collnamespace = 'pgfence'::regnamespace
UNION ALL
SELECT 'privilege ' || a.privilege_type || ' on schema pgfence to ' || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
  FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a
 WHERE n.nspname = 'pgfence' AND a.grantee <> n.nspowner
UNION ALL
SELECT 'privilege ' || a.privilege_type || ' on ' || c.relname || ' to ' || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
  FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
 WHERE c.relnamespace = 'pgfence'::regnamespace AND a.grantee <> c.relowner
UNION ALL
SELECT 'default privileges for ' || d.defaclobjtype::text FROM pg_default_acl d WHERE d.defaclnamespace = 'pgfence'::regnamespace
ORDER BY 1`

// TestRoundTrip checks that the Down sections undo exactly what the Up
// sections do: DownTo(0) leaves nothing of pgfence but goose's version
// table and the migration lock's table, and migrating up again, from 0 or from any version in between,
// reproduces schema.sql (and the catalog of the first Up, which also holds
// what pg_dump does not print, such as validated flags and storage options).
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := blankDatabase(t)
	m := newMigrator(t, db.Pool)
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	first := snapshot(t, db.Pool)
	var want string
	d, err := findSchemaDump(db.Pool)
	switch {
	case err != nil && os.Getenv("CI") == "true":
		noSchemaDump(t, err) // fails
	case err != nil:
		t.Logf("comparing catalogs only, not %s: %v", schemaFile, err)
	default:
		var mismatch string
		if want, mismatch = d.committed(t); mismatch != "" {
			t.Logf("comparing catalogs only: %s", mismatch)
		}
	}
	same := func(when string) {
		t.Helper()
		if got := snapshot(t, db.Pool); strings.Join(got, "\n") != strings.Join(first, "\n") {
			t.Fatalf("%s: the catalog differs from the first Up's:\n%s", when, diff(first, got))
		}
		if want != "" {
			if got := d.file(t, db.URL); got != want {
				t.Fatalf("%s: the schema differs from %s:\n%s", when, schemaFile, unifiedDiff(want, got))
			}
		}
	}
	same("the first Up")

	if _, err := m.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, leftovers)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("DownTo(0) left:\n  %s", strings.Join(left, "\n  "))
	}
	if current, _, err := m.Version(ctx); err != nil || current != 0 {
		t.Fatalf("after DownTo(0): version %d, %v", current, err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	same("DownTo(0), then Up")

	status, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(status) - 2; i >= 0; i-- {
		v := status[i].Version
		if _, err := m.DownTo(ctx, v); err != nil {
			t.Fatalf("DownTo(%d): %v", v, err)
		}
		if current, _, err := m.Version(ctx); err != nil || current != v {
			t.Fatalf("after DownTo(%d): version %d, %v", v, current, err)
		}
		if _, err := m.Up(ctx); err != nil {
			t.Fatalf("Up from %d: %v", v, err)
		}
		same(fmt.Sprintf("DownTo(%d), then Up", v))
	}
	if latest := status[len(status)-1].Version; latest != migrations.Latest() {
		t.Fatalf("Status ends at %d, want %d", latest, migrations.Latest())
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
