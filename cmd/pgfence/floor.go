package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence"
)

// floorShowJSON is what `floor show --json` prints.
type floorShowJSON struct {
	Floor    int64     `json:"floor"` // every token issued is greater
	RaisedAt time.Time `json:"raised_at"`
	Reason   string    `json:"reason"`
	// Retention is the retention floor (advance_retention): every token
	// issued is greater, and one at or below it is taken only if it is its
	// key's newest.
	Retention int64 `json:"retention"`
	// RetentionAt is when the retention floor was last advanced; absent
	// before the first time.
	RetentionAt *time.Time `json:"retention_at,omitempty"`
	// HighestStoredToken is the highest token in pgfence's tables and the
	// --column columns: the least floor after a restore.
	HighestStoredToken int64 `json:"highest_stored_token"`
}

// floorRaiseJSON is what `floor raise --json` prints.
type floorRaiseJSON struct {
	PreviousFloor int64  `json:"previous_floor"`
	Floor         int64  `json:"floor"`
	Reason        string `json:"reason"`
}

// storedTokens reads the token floor and the highest stored token,
// in pgfence's tables and in columns.
func storedTokens(ctx context.Context, db pgfence.DB, columns []pgfence.Column) (pgfence.TokenFloorState, int64, error) {
	stored, err := pgfence.MaxStoredToken(ctx, db, columns...)
	if err != nil {
		// pgfence's own objects are a function (42883 when missing) in schema
		// pgfence; another missing schema, table or column is one of the
		// --column flags.
		code := pgerr.Code(err)
		userSchema := code == "3F000" && !strings.Contains(err.Error(), `"pgfence"`)
		if len(columns) > 0 && (code == "42P01" || code == "42703" || userSchema) {
			return pgfence.TokenFloorState{}, 0, &cliError{msg: redact(err.Error()), hint: "check the --column flags: schema.table.column of an existing column, case-sensitive as created", code: exitUsage, err: err}
		}
		return pgfence.TokenFloorState{}, 0, dbError(err)
	}
	floor, err := pgfence.TokenFloor(ctx, db)
	if err != nil {
		return pgfence.TokenFloorState{}, 0, dbError(err)
	}
	return floor, stored, nil
}

func floorShow(fs *flag.FlagSet) runFunc {
	var columns columnList
	fs.Var(&columns, "column", "a token column of your own tables, schema.table.column (repeatable)")
	return func(ctx context.Context, in *input) error {
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		floor, stored, err := storedTokens(ctx, pool, columns)
		if err != nil {
			return err
		}
		out := floorShowJSON{Floor: floor.Floor, RaisedAt: floor.RaisedAt.UTC(), Reason: floor.Reason, Retention: floor.Retention, HighestStoredToken: stored}
		if !floor.RetentionAt.IsZero() {
			at := floor.RetentionAt.UTC()
			out.RetentionAt = &at
		}
		return in.print(out, func(w io.Writer) {
			fmt.Fprintf(w, "token floor: %d (set %s: %s)\n", floor.Floor, stamp(floor.RaisedAt), cell(floor.Reason))
			if floor.RetentionAt.IsZero() {
				fmt.Fprintln(w, "retention floor: 0 (never advanced)")
			} else {
				fmt.Fprintf(w, "retention floor: %d (advanced %s)\n", floor.Retention, stamp(floor.RetentionAt))
			}
			fmt.Fprintf(w, "highest stored token: %d\n", stored)
			if stored > floor.Floor {
				fmt.Fprintln(w, "(tokens already continue above the stored ones; raise the floor only after a restore or rebuild)")
			}
		})
	}
}

func floorRaise(fs *flag.FlagSet) runFunc {
	to := fs.Int64("to", -1, "the new floor (default: the highest stored token)")
	reason := fs.String("reason", "", "why (required; recorded), e.g. \"restored from backup of 2026-11-30\"")
	var columns columnList
	fs.Var(&columns, "column", "a token column of your own tables, schema.table.column (repeatable)")
	return func(ctx context.Context, in *input) error {
		if *reason == "" {
			return usageError("floor raise needs --reason TEXT (it is recorded)")
		}
		// -1, the default, means "the highest stored token"; any other value
		// is the floor itself (the database refuses one above 2^62).
		if *to < -1 {
			return usageError("--to must be 0 to 2^62, got %d", *to)
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		floor, stored, err := storedTokens(ctx, pool, columns)
		if err != nil {
			return err
		}
		target := *to
		if target < 0 {
			target = stored
		}
		prev, err := pgfence.RaiseTokenFloor(ctx, pool, target, *reason)
		if errors.Is(err, pgfence.ErrFloorLowered) {
			return &cliError{msg: fmt.Sprintf("refused: the floor is %d and may only be raised, not lowered to %d", floor.Floor, target), hint: "tokens must never go backwards; pass a higher --to", code: exitFailure, err: err}
		}
		if err != nil {
			return dbError(err)
		}
		return in.print(floorRaiseJSON{PreviousFloor: prev, Floor: target, Reason: *reason}, func(w io.Writer) {
			fmt.Fprintf(w, "token floor raised from %d to %d; every new token is greater\n", prev, target)
		})
	}
}

// columnList collects --column schema.table.column flags.
type columnList []pgfence.Column

func (c *columnList) String() string { return fmt.Sprint(len(*c), " columns") }

func (c *columnList) Set(s string) error {
	parts, err := splitIdentifier(s)
	if err != nil {
		return fmt.Errorf("%q: %w", s, err)
	}
	if len(parts) < 2 || len(parts) > 3 {
		return fmt.Errorf("%q: want table.column or schema.table.column (quote a name that contains a dot: \"a.b\")", s)
	}
	*c = append(*c, pgfence.Column{Table: pgx.Identifier(parts[:len(parts)-1]), Name: parts[len(parts)-1]})
	return nil
}
