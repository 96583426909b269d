package pgfence

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/driver"
)

// RaiseTokenFloor makes every token issued from now on greater than floor,
// after the schema was rebuilt or restored from an older backup, so tokens
// never restart below tokens already stored. It also retires every token at
// or below floor: fenced writes refuse them as stale, so holders of leases
// granted before acquire again before they write, and [PruneRetired] may
// delete the rows that only remember retired tokens. It refuses to lower the
// floor ([ErrFloorLowered]); the current value is a no-op. It returns the
// floor before. floor must be 0 to 2^62, far above any token a real
// cluster issues and far below the end of the bigint range, so tokens keep
// room to grow (a floor is never lowered: one near the end of the range
// would make every later grant fail for good); reason (1 to 1000
// characters) is recorded. The database refuses other values
// ([ErrInvalid]).
func RaiseTokenFloor(ctx context.Context, db DB, floor int64, reason string) (previous int64, err error) {
	err = run(ctx, db, `SELECT pgfence.raise_token_floor($1, $2)`, []any{floor, reason}, &previous)
	return previous, err
}

// Column is a token column of one of the application's tables.
type Column struct {
	Table pgx.Identifier
	Name  string
}

// MaxStoredToken returns the highest token stored in pgfence's own tables
// (fences, leases, lease history, the floor) and in columns: the least floor
// for [RaiseTokenFloor] after a restore.
func MaxStoredToken(ctx context.Context, db DB, columns ...Column) (int64, error) {
	if err := driver.NilHandle(db); err != nil {
		return 0, err
	}
	var sb strings.Builder
	sb.WriteString("SELECT greatest(pgfence.max_stored_token()")
	for _, c := range columns {
		if err := checkIdentifier("Column.Table", c.Table); err != nil {
			return 0, err
		}
		if err := checkName("Column.Name", c.Name); err != nil {
			return 0, err
		}
		fmt.Fprintf(&sb, ", (SELECT max(%s)::bigint FROM %s)", pgx.Identifier{c.Name}.Sanitize(), c.Table.Sanitize())
	}
	sb.WriteString(")")
	var maxToken int64
	err := db.QueryRow(ctx, sb.String()).Scan(&maxToken)
	return maxToken, read(err)
}
