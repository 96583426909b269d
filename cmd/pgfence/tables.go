package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence"
)

// tableJSON is one protected table: each row's resource is prefix || the
// text of resource_column.
type tableJSON struct {
	Table          string `json:"table"` // as PostgreSQL prints a regclass
	ResourceColumn string `json:"resource_column"`
	Prefix         string `json:"prefix"`
}

// tablesListJSON is what `tables list --json` prints.
type tablesListJSON struct {
	Tables []tableJSON `json:"tables"`
}

// protectionJSON is a table's protection settings.
type protectionJSON struct {
	ResourceColumn string `json:"resource_column"`
	Prefix         string `json:"prefix"`
}

// protectJSON is what `tables protect --json` prints.
type protectJSON struct {
	Table          string `json:"table"` // as given
	ResourceColumn string `json:"resource_column"`
	Prefix         string `json:"prefix"`
	// Previous is the settings it replaced; absent if the table was not
	// protected.
	Previous *protectionJSON `json:"previous,omitempty"`
}

// unprotectJSON is what `tables unprotect --json` prints.
type unprotectJSON struct {
	Table        string `json:"table"` // as given
	WasProtected bool   `json:"was_protected"`
}

func tablesList(*flag.FlagSet) runFunc {
	return func(ctx context.Context, in *input) error {
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		protected, err := pgfence.Protected(ctx, pool)
		if err != nil {
			return dbError(err)
		}
		out := tablesListJSON{Tables: make([]tableJSON, 0, len(protected))}
		for _, p := range protected {
			out.Tables = append(out.Tables, tableJSON{Table: p.Table, ResourceColumn: p.ResourceColumn, Prefix: p.Prefix})
		}
		return in.print(out, func(w io.Writer) {
			if len(protected) == 0 {
				fmt.Fprintln(w, "(no protected tables)")
				return
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TABLE\tRESOURCE OF A ROW")
			for _, p := range protected {
				fmt.Fprintf(tw, "%s\t%s%s\n", cell(p.Table), quotePrefix(p.Prefix), cell(p.ResourceColumn))
			}
			tw.Flush()
		})
	}
}

func tablesProtect(fs *flag.FlagSet) runFunc {
	column := fs.String("resource-column", "", "the column whose value (after --prefix) names each row's fenced resource (required)")
	prefix := fs.String("prefix", "", "text prepended to the column's value to form the resource name")
	return func(ctx context.Context, in *input) error {
		if *column == "" {
			return usageError("tables protect needs --resource-column: the column that names each row's resource")
		}
		if err := pgfence.CheckIdentifier(pgx.Identifier{*column}); err != nil {
			return usageError("--resource-column: %s", strings.TrimPrefix(err.Error(), pgfence.ErrInvalid.Error()+": "))
		}
		if p := *prefix; len(p) >= pgfence.MaxResourceLen || strings.IndexByte(p, 0) >= 0 || !utf8.ValidString(p) {
			return usageError("--prefix must be valid UTF-8 without NUL bytes and shorter than %d bytes, got %d bytes", pgfence.MaxResourceLen, len(p))
		}
		table, err := parseTable(in.args[0])
		if err != nil {
			return err
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		// Protecting again replaces the settings; say so when they change. A
		// failed lookup only loses that remark: Protect reports the real error.
		old, wasProtected, err := pgfence.ProtectionOf(ctx, pool, table)
		if err != nil {
			wasProtected = false
		}
		if err := pgfence.Protect(ctx, pool, table, *column, *prefix); err != nil {
			if errors.Is(err, pgfence.ErrInvalid) || pgerr42(err) {
				return &cliError{msg: redact(err.Error()), hint: "check the table and column names (schema.table, case-sensitive as created)", code: exitFailure, err: err}
			}
			return dbError(err)
		}
		out := protectJSON{Table: in.args[0], ResourceColumn: *column, Prefix: *prefix}
		if wasProtected {
			out.Previous = &protectionJSON{ResourceColumn: old.ResourceColumn, Prefix: old.Prefix}
		}
		return in.print(out, func(w io.Writer) {
			fmt.Fprintf(w, "protected %s: every INSERT, UPDATE and DELETE must now present an accepted token for resource %s%s\n",
				table.Sanitize(), quotePrefix(*prefix), *column)
			if wasProtected && (old.ResourceColumn != *column || old.Prefix != *prefix) {
				fmt.Fprintf(w, "(it was protected with resource %s%s before; that setting is replaced)\n", quotePrefix(old.Prefix), old.ResourceColumn)
			}
		})
	}
}

func tablesUnprotect(*flag.FlagSet) runFunc {
	return func(ctx context.Context, in *input) error {
		table, err := parseTable(in.args[0])
		if err != nil {
			return err
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		was, err := pgfence.Unprotect(ctx, pool, table)
		if err != nil {
			if pgerr42(err) {
				return &cliError{msg: redact(err.Error()), hint: "check the table name (schema.table)", code: exitFailure, err: err}
			}
			return dbError(err)
		}
		return in.print(unprotectJSON{Table: in.args[0], WasProtected: was}, func(w io.Writer) {
			if !was {
				fmt.Fprintf(w, "%s was not protected; nothing changed\n", table.Sanitize())
				return
			}
			fmt.Fprintf(w, "unprotected %s: writes no longer need a token (the fence helpers still check tokens they are given)\n", table.Sanitize())
		})
	}
}

func quotePrefix(p string) string {
	if p == "" {
		return ""
	}
	return strconv.Quote(p) + " || "
}

// parseTable parses TABLE or SCHEMA.TABLE (see splitIdentifier for quoting).
func parseTable(s string) (pgx.Identifier, error) {
	if s == "" {
		return nil, usageError("TABLE is empty")
	}
	id, err := splitIdentifier(s)
	if err != nil {
		return nil, usageError("TABLE %q: %v", s, err)
	}
	if len(id) > 2 {
		return nil, usageError("TABLE %q: want table or schema.table (quote a name that contains a dot: \"a.b\")", s)
	}
	return id, nil
}

// pgerr42 reports a syntax or undefined-object error (class 42): a bad name.
// A missing pgfence function (42883: the schema is not installed) and a
// missing privilege (42501) are not the caller's names; dbError explains them.
func pgerr42(err error) bool {
	code := pgerr.Code(err)
	return strings.HasPrefix(code, "42") && code != "42883" && code != "42501"
}
