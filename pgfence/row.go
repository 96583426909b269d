package pgfence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Table names one of the application's own tables whose rows carry their
// fence token in a column: a versioned write updates a row only if the row's
// token is not newer than the writer's, and stores the writer's token.
type Table struct {
	// Name is the table, optionally schema-qualified: pgx.Identifier{"app", "jobs"}.
	Name pgx.Identifier
	// Key is the column that identifies a row (unique).
	Key string
	// Fence is the bigint column holding the token of the row's last write. A
	// NULL fence accepts any token.
	Fence string
}

func (t Table) validate() error {
	if err := checkIdentifier("Table.Name", t.Name); err != nil {
		return err
	}
	if err := checkName("Table.Key", t.Key); err != nil {
		return err
	}
	return checkName("Table.Fence", t.Fence)
}

// UpdateRow is a versioned write in one statement:
//
//	UPDATE t SET col = value, ..., fence = token WHERE key = id AND (fence IS NULL OR fence <= token)
//
// Column names come from set and are quoted with [pgx.Identifier]; every name
// is checked first with [CheckIdentifier]. It returns
// nil if the row was updated, a *[StaleTokenError] if the row carries a newer
// token, and [ErrNotFound] if there is no such row (both told apart by reading
// the row after a miss; the successful path is one round trip). A connection
// lost after the UPDATE was sent on a pool or connection returns an error
// wrapping [ErrOutcomeUnknown]: the write may have committed, and the row's
// fence column tells whether it (or a later write) did.
//
// A versioned row is its own guard: the fence column refuses the stale
// writer. Do not also [Protect] its table: the guard of a protected table
// admits only writes whose transaction fenced the row's resource, which
// UpdateRow does not do, so it fails there with an error wrapping
// [ErrUnfencedWrite] that says so.
func (f *Fencer) UpdateRow(ctx context.Context, db DB, t Table, id any, token int64, set map[string]any) error {
	if err := checkDB(db); err != nil {
		return err
	}
	w := &write{op: opUpdateRow, token: token, table: strings.Join(t.Name, ".")}
	return f.observed(ctx, pgxSession{db}, w, func(ctx context.Context) error {
		return updateRow(ctx, pgxSession{db}, t, id, token, set)
	})
}

func updateRow[T, R any](ctx context.Context, s session[T, R], t Table, id any, token int64, set map[string]any) error {
	if err := t.validate(); err != nil {
		return err
	}
	if err := validateToken(token); err != nil {
		return err
	}
	cols := make([]string, 0, len(set))
	for c := range set {
		if err := checkName("column of set", c); err != nil {
			return err
		}
		if c == t.Fence || c == t.Key {
			return fmt.Errorf("%w: set must not assign the key or fence column %q", ErrInvalid, c)
		}
		cols = append(cols, c)
	}
	slices.Sort(cols)
	table, key, fence := t.Name.Sanitize(), pgx.Identifier{t.Key}.Sanitize(), pgx.Identifier{t.Fence}.Sanitize()
	var sb strings.Builder
	args := []any{id, token}
	fmt.Fprintf(&sb, "UPDATE %s SET ", table)
	for _, c := range cols {
		args = append(args, set[c])
		fmt.Fprintf(&sb, "%s = $%d, ", pgx.Identifier{c}.Sanitize(), len(args))
	}
	fmt.Fprintf(&sb, "%s = $2 WHERE %s = $1 AND (%s IS NULL OR %s <= $2)", fence, key, fence, fence)
	update := sb.String()
	read := fmt.Sprintf("SELECT %s FROM %s WHERE %s = $1", fence, table, key)

	conn, release, err := s.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	// A miss is re-read; if a concurrent writer changed the row in between (a
	// delete and re-insert), the update is tried again, a bounded number of times.
	for range 3 {
		n, err := conn.execRows(ctx, update, args...)
		if err != nil {
			// On a pool the UPDATE is its own transaction: lost after
			// sending, its outcome is unknown (re-read the row).
			err = mapError(err, s.ownCommit())
			if errors.Is(err, ErrUnfencedWrite) {
				return fmt.Errorf("pgfence: UpdateRow: table %s is protected (pgfence.protect), and a versioned row write presents no fence: "+
					"write it with Write or Exec under the row's lease, or leave a table whose rows carry their own token column unprotected: %w", table, err)
			}
			return err
		}
		if n > 0 {
			return nil
		}
		var current *int64
		err = conn.queryRow(ctx, read, id).Scan(&current)
		if noRows(err) {
			return fmt.Errorf("%w: no row %s = %v in %s", ErrNotFound, key, id, table)
		}
		if err != nil {
			return mapError(err, false)
		}
		if current != nil && *current > token {
			return &StaleTokenError{Resource: fmt.Sprintf("%s[%v]", table, id), Presented: token, Accepted: *current}
		}
	}
	return fmt.Errorf("pgfence: row %s = %v in %s keeps changing under the versioned write", key, id, table)
}
