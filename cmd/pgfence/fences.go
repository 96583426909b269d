package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence"
)

// fenceRow is one pgfence.fences row as `fences show` prints it.
type fenceRow struct {
	Resource   string    `json:"resource"`
	Token      int64     `json:"token"`
	Writes     int64     `json:"writes"`
	AcceptedAt time.Time `json:"accepted_at"`
}

func runFences(ctx context.Context, e *env, args []string) error {
	switch {
	case len(args) > 0 && args[0] == "help":
		args = []string{"-h"} // a resource named help: `fences show help`
	case len(args) > 0 && (args[0] == "show" || args[0] == "list"):
		args = args[1:]
	}
	fs := newFlags(e, "fences show", "fences show [RESOURCE [--rejections N]] [--json]")
	var db dbFlags
	db.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	nRejections := fs.Int("rejections", pgfence.RejectionsLimitDefault, fmt.Sprintf("with RESOURCE: how many recent rejected writes to list (0 to %d)", pgfence.MaxRejectionsLimit))
	if err := parse(fs, interspersed(fs, args)); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return usageError("fences show takes at most one RESOURCE, got %q", fs.Args())
	}
	if *nRejections < 0 || *nRejections > pgfence.MaxRejectionsLimit {
		return usageError("--rejections must be 0 to %d, got %d", pgfence.MaxRejectionsLimit, *nRejections)
	}
	pool, err := db.connect(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()

	query := `SELECT resource, token, writes, accepted_at FROM pgfence.fences ORDER BY resource`
	var qargs []any
	if fs.NArg() == 1 {
		query = `SELECT resource, token, writes, accepted_at FROM pgfence.fences WHERE resource = $1`
		qargs = append(qargs, fs.Arg(0))
	}
	rows, err := pool.Query(ctx, query, qargs...)
	if err != nil {
		return dbError(err)
	}
	fences, err := pgx.CollectRows(rows, pgx.RowToStructByPos[fenceRow])
	if err != nil {
		return dbError(err)
	}
	var rejections []pgfence.Rejection
	if fs.NArg() == 1 && *nRejections > 0 {
		if rejections, err = pgfence.Rejections(ctx, pool, fs.Arg(0), *nRejections); err != nil {
			return dbError(err)
		}
	}
	if fs.NArg() == 1 && len(fences) == 0 && len(rejections) == 0 {
		return &cliError{msg: fmt.Sprintf("no token was ever accepted for resource %q", fs.Arg(0)), hint: "`pgfence fences show` lists every fenced resource", code: exitFailure}
	}
	protected, err := pgfence.Protected(ctx, pool)
	if err != nil {
		return dbError(err)
	}
	var floor int64
	if err := pool.QueryRow(ctx, `SELECT floor FROM pgfence.token_floor`).Scan(&floor); err != nil {
		return dbError(err)
	}
	if *asJSON {
		if fences == nil {
			fences = []fenceRow{}
		}
		tables := make([]protectedRow, 0, len(protected))
		for _, p := range protected {
			tables = append(tables, protectedRow{Table: p.Table, ResourceColumn: p.ResourceColumn, Prefix: p.Prefix})
		}
		out := map[string]any{"fences": fences, "protected_tables": tables, "token_floor": floor}
		if fs.NArg() == 1 {
			rows := make([]rejectionRow, 0, len(rejections))
			for _, r := range rejections {
				rows = append(rows, newRejectionRow(r))
			}
			out["rejections"] = rows
		}
		return writeJSON(e, out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tACCEPTED TOKEN\tWRITES\tLAST ACCEPTED AT")
	for _, f := range fences {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", cell(f.Resource), f.Token, f.Writes, stamp(f.AcceptedAt))
	}
	tw.Flush()
	if len(fences) == 0 {
		fmt.Fprintln(e.stdout, "(no fenced resources)")
	}
	if fs.NArg() == 0 {
		fmt.Fprintf(e.stdout, "\nprotected tables: ")
		if len(protected) == 0 {
			fmt.Fprintln(e.stdout, "none")
		} else {
			var names []string
			for _, p := range protected {
				names = append(names, fmt.Sprintf("%s (resource = %s%s)", p.Table, quotePrefix(p.Prefix), p.ResourceColumn))
			}
			fmt.Fprintln(e.stdout, strings.Join(names, ", "))
		}
		fmt.Fprintf(e.stdout, "token floor: %d\n", floor)
	}
	if fs.NArg() == 1 && *nRejections > 0 {
		printRejections(e, rejections)
	}
	return nil
}

// protectedRow is one protected table as `fences show --json` prints it.
type protectedRow struct {
	Table          string `json:"table"` // as PostgreSQL prints a regclass
	ResourceColumn string `json:"resource_column"`
	Prefix         string `json:"prefix"`
}

// rejectionRow is one pgfence.fence_rejections row as `fences show RESOURCE
// --json` prints it.
type rejectionRow struct {
	At             time.Time `json:"at"`
	Reason         string    `json:"reason"`
	LeaseReason    string    `json:"lease_reason,omitempty"`
	PresentedToken int64     `json:"presented_token"`
	AcceptedToken  int64     `json:"accepted_token,omitempty"`
	Operation      string    `json:"operation,omitempty"`
	Op             string    `json:"op,omitempty"`
	TraceID        string    `json:"trace_id,omitempty"`
}

func newRejectionRow(r pgfence.Rejection) rejectionRow {
	row := rejectionRow{At: r.At, Reason: r.Reason, LeaseReason: r.LeaseReason, PresentedToken: r.PresentedToken,
		AcceptedToken: r.AcceptedToken, Operation: r.Operation, TraceID: r.TraceID}
	if r.Op != (pgfence.OpID{}) {
		row.Op = r.Op.String()
	}
	return row
}

func printRejections(e *env, rejections []pgfence.Rejection) {
	fmt.Fprintf(e.stdout, "\nrecent rejected writes (newest first, kept 7 days):\n")
	if len(rejections) == 0 {
		fmt.Fprintln(e.stdout, "(none recorded)")
		return
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tREASON\tPRESENTED\tACCEPTED\tOPERATION\tTRACE ID")
	for _, r := range rejections {
		reason := r.Reason
		if r.LeaseReason != "" {
			reason += " (" + r.LeaseReason + ")"
		}
		accepted := "-"
		if r.AcceptedToken != 0 {
			accepted = strconv.FormatInt(r.AcceptedToken, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", stamp(r.At), reason, r.PresentedToken, accepted, cell(dash(r.Operation)), dash(r.TraceID))
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
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

func runProtect(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "protect", "protect TABLE --resource-column COLUMN [--prefix TEXT]")
	var db dbFlags
	db.register(fs)
	column := fs.String("resource-column", "", "the column whose value (after --prefix) names each row's fenced resource (required)")
	prefix := fs.String("prefix", "", "text prepended to the column's value to form the resource name")
	if err := parse(fs, interspersed(fs, args)); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError("protect needs exactly one TABLE, got %d arguments", fs.NArg())
	}
	if *column == "" {
		return usageError("protect needs --resource-column: the column that names each row's resource")
	}
	if err := pgfence.CheckIdentifier(pgx.Identifier{*column}); err != nil {
		return usageError("--resource-column: %s", strings.TrimPrefix(err.Error(), pgfence.ErrInvalid.Error()+": "))
	}
	if p := *prefix; len(p) >= pgfence.MaxResourceLen || strings.IndexByte(p, 0) >= 0 || !utf8.ValidString(p) {
		return usageError("--prefix must be valid UTF-8 without NUL bytes and shorter than %d bytes, got %d bytes", pgfence.MaxResourceLen, len(p))
	}
	table, err := parseTable(fs.Arg(0))
	if err != nil {
		return err
	}
	pool, err := db.connect(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Protecting again replaces the settings; say so when they change. A
	// failed lookup only loses that remark: Protect reports the real error.
	var oldColumn, oldPrefix string
	wasProtected := pool.QueryRow(ctx, `SELECT resource_column, prefix FROM pgfence.protected_tables() WHERE relation = to_regclass($1)`,
		table.Sanitize()).Scan(&oldColumn, &oldPrefix) == nil
	if err := pgfence.Protect(ctx, pool, table, *column, *prefix); err != nil {
		if errors.Is(err, pgfence.ErrInvalid) || pgerr42(err) {
			return &cliError{msg: redact(err.Error()), hint: "check the table and column names (schema.table, case-sensitive as created)", code: exitFailure, err: err}
		}
		return dbError(err)
	}
	fmt.Fprintf(e.stdout, "protected %s: every INSERT, UPDATE and DELETE must now present an accepted token for resource %s%s\n",
		table.Sanitize(), quotePrefix(*prefix), *column)
	if wasProtected && (oldColumn != *column || oldPrefix != *prefix) {
		fmt.Fprintf(e.stdout, "(it was protected with resource %s%s before; that setting is replaced)\n", quotePrefix(oldPrefix), oldColumn)
	}
	return nil
}

func runUnprotect(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "unprotect", "unprotect TABLE")
	var db dbFlags
	db.register(fs)
	if err := parse(fs, interspersed(fs, args)); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError("unprotect needs exactly one TABLE, got %d arguments", fs.NArg())
	}
	table, err := parseTable(fs.Arg(0))
	if err != nil {
		return err
	}
	pool, err := db.connect(ctx, e)
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
	if !was {
		fmt.Fprintf(e.stdout, "%s was not protected; nothing changed\n", table.Sanitize())
		return nil
	}
	fmt.Fprintf(e.stdout, "unprotected %s: writes no longer need a token (the fence helpers still check tokens they are given)\n", table.Sanitize())
	return nil
}

// pgerr42 reports a syntax or undefined-object error (class 42): a bad name.
// A missing pgfence function (42883: the schema is not installed) and a
// missing privilege (42501) are not the caller's names; dbError explains them.
func pgerr42(err error) bool {
	code := pgerr.Code(err)
	return strings.HasPrefix(code, "42") && code != "42883" && code != "42501"
}

func runFloor(ctx context.Context, e *env, args []string) error {
	const usageLine = "floor <show|raise> [--to N --reason TEXT] [--column schema.table.column ...]"
	if len(args) == 0 || (args[0] != "show" && args[0] != "raise") {
		fmt.Fprintf(e.stderr, "Usage: pgfence %s\n\n  show    the floor and the highest token stored in pgfence's tables (and --column columns)\n  raise   make every future token greater than --to (refuses to lower it)\n", usageLine)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return nil
		}
		return usageError("floor needs a subcommand: show or raise")
	}
	sub := args[0]
	fs := newFlags(e, "floor "+sub, usageLine)
	var db dbFlags
	db.register(fs)
	to := fs.Int64("to", -1, "raise: the new floor (default: the highest stored token)")
	reason := fs.String("reason", "", "raise: why (recorded), e.g. \"restored from backup of 2026-11-30\"")
	var columns columnList
	fs.Var(&columns, "column", "a token column of your own tables, schema.table.column (repeatable)")
	if err := parse(fs, interspersed(fs, args[1:])); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("floor %s takes no arguments, got %q", sub, fs.Args())
	}
	if sub == "raise" && *reason == "" {
		return usageError("floor raise needs --reason TEXT (it is recorded)")
	}
	// -1, the default, means "the highest stored token"; any other value is
	// the floor itself.
	if *to < -1 || *to > pgfence.MaxTokenFloor {
		return usageError("--to must be 0 to %d, got %d (a floor is never lowered, so one near the end of the bigint range would stop every later grant)", pgfence.MaxTokenFloor, *to)
	}
	pool, err := db.connect(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	stored, err := pgfence.MaxStoredToken(ctx, pool, columns...)
	if err != nil {
		// pgfence's own objects are a function (42883 when missing) in schema
		// pgfence; another missing schema, table or column is one of the
		// --column flags.
		code := pgerr.Code(err)
		userSchema := code == "3F000" && !strings.Contains(err.Error(), `"pgfence"`)
		if len(columns) > 0 && (code == "42P01" || code == "42703" || userSchema) {
			return &cliError{msg: redact(err.Error()), hint: "check the --column flags: schema.table.column of an existing column, case-sensitive as created", code: exitUsage, err: err}
		}
		return dbError(err)
	}
	var floor int64
	if err := pool.QueryRow(ctx, `SELECT floor FROM pgfence.token_floor`).Scan(&floor); err != nil {
		return dbError(err)
	}
	if sub == "show" {
		fmt.Fprintf(e.stdout, "token floor: %d\nhighest stored token: %d\n", floor, stored)
		if stored > floor {
			fmt.Fprintln(e.stdout, "(tokens already continue above the stored ones; raise the floor only after a restore or rebuild)")
		}
		return nil
	}
	target := *to
	if target < 0 {
		target = stored
	}
	prev, err := pgfence.RaiseTokenFloor(ctx, pool, target, *reason)
	if errors.Is(err, pgfence.ErrFloorLowered) {
		return &cliError{msg: fmt.Sprintf("refused: the floor is %d and may only be raised, not lowered to %d", floor, target), hint: "tokens must never go backwards; pass a higher --to", code: exitFailure, err: err}
	}
	if err != nil {
		return dbError(err)
	}
	fmt.Fprintf(e.stdout, "token floor raised from %d to %d; every new token is greater\n", prev, target)
	return nil
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
