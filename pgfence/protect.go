package pgfence

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/driver"
)

// Protect installs pgfence's guard trigger on table: from now on every INSERT,
// UPDATE and DELETE of a row must run in a transaction that presented an
// accepted token (pgfence.fence, [Write], [Exec]) for the row's resource,
// prefix || the text of resourceColumn, for both the old and the new row.
// Other writes fail with [ErrUnfencedWrite] (SQLSTATE PF006), whatever client
// sends them; TRUNCATE is refused. The partitions and inheritance children
// table has when Protect runs are guarded too, and so are those added later
// (created or attached), when they are added, by the event trigger
// pgfence_guard_new_tables that the migrations install when a superuser runs
// them. Without it a later partition refuses every write until table is
// protected again, and a later inheritance child is not guarded (pgfence
// doctor reports both). Protecting a table again replaces its settings. It
// runs pgfence.protect(table, resourceColumn, prefix).
//
// resourceColumn must be text, varchar, smallint, integer, bigint or uuid (or
// a domain over one), whose text is the same in every session and unique per
// value; other types are refused ([ErrInvalid], PF008): char(n) and numeric
// have several texts for one value, and others print differently under the
// writer's TimeZone, extra_float_digits or IntervalStyle. The row guard is an
// AFTER trigger: it checks each row as stored, after the table's own BEFORE
// triggers and generated columns.
//
// Names are checked with [CheckIdentifier] and quoted; a name that does not
// exist fails (SQLSTATE 42P01 or PF008) and changes nothing.
//
// Cost: one plpgsql call and one primary-key lookup in pgfence.fences per row
// written (see BenchmarkProtectedRows).
func Protect(ctx context.Context, db DB, table pgx.Identifier, resourceColumn, prefix string) error {
	if err := checkIdentifier("table", table); err != nil {
		return err
	}
	if err := checkName("resourceColumn", resourceColumn); err != nil {
		return err
	}
	if len(prefix) >= MaxResourceLen || strings.IndexByte(prefix, 0) >= 0 || !utf8.ValidString(prefix) {
		return fmt.Errorf("%w: prefix must be valid UTF-8 without NUL bytes and shorter than %d bytes (a resource is at most %d), got %d bytes",
			ErrInvalid, MaxResourceLen, MaxResourceLen, len(prefix))
	}
	return run(ctx, db, `SELECT 1 FROM pgfence.protect($1::regclass, $2, $3)`, []any{table.Sanitize(), resourceColumn, prefix}, new(int))
}

// Unprotect removes the guard from table and from its partitions and
// inheritance children, and reports whether table was protected.
func Unprotect(ctx context.Context, db DB, table pgx.Identifier) (bool, error) {
	if err := checkIdentifier("table", table); err != nil {
		return false, err
	}
	var had bool
	err := run(ctx, db, `SELECT pgfence.unprotect($1::regclass)`, []any{table.Sanitize()}, &had)
	return had, err
}

// ProtectedTable is one table guarded by [Protect].
type ProtectedTable struct {
	// Table is the table name as PostgreSQL prints a regclass (quoted and
	// schema-qualified where needed).
	Table          string
	ResourceColumn string
	Prefix         string
}

// Protected lists the protected tables of the database, from the catalog.
func Protected(ctx context.Context, db DB) ([]ProtectedTable, error) {
	if err := driver.NilHandle(db); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT relation::text, resource_column, prefix FROM pgfence.protected_tables()`)
	if err != nil {
		return nil, read(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProtectedTable, error) {
		var p ProtectedTable
		err := r.Scan(&p.Table, &p.ResourceColumn, &p.Prefix)
		return p, err
	})
	return out, read(err)
}
