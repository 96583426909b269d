package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"text/tabwriter"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/migrations"
)

const migrateUsage = `migrate <up|down|status|sql> [flags]

  up       apply every pending migration (safe to run from several processes at once)
  down     roll back the newest migration, or down to --to VERSION (0 rolls back all; the empty
           schema pgfence, its version table and the cluster-wide roles remain)
  status   list migrations and whether each is applied
  sql      print the plain SQL (--direction up|down, --from/--to VERSION) for other migration
           tools or psql; it records its steps like up and down do; needs no database`

func runMigrate(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(e.stderr, "Usage: pgfence %s\n", migrateUsage)
		if len(args) == 0 {
			return usageError("migrate needs a subcommand: up, down, status or sql")
		}
		return nil
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "up", "down", "status":
		return runMigrateDB(ctx, e, sub, rest)
	case "sql":
		return runMigrateSQL(e, rest)
	default:
		return usageError("migrate: unknown subcommand %q (want up, down, status or sql)", sub)
	}
}

func runMigrateSQL(e *env, args []string) error {
	fs := newFlags(e, "migrate sql", "migrate sql [--direction up|down] [--from VERSION] [--to VERSION]")
	direction := fs.String("direction", "up", "up or down")
	from := fs.Int64("from", -1, "the schema version the script starts from (default: 0 up, the latest down)")
	to := fs.Int64("to", -1, "the schema version the script ends at (default: the latest up, 0 down)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("migrate sql takes no arguments, got %q", fs.Args())
	}
	latest := migrations.Latest()
	switch *direction {
	case "up":
		if *from == -1 {
			*from = 0
		}
		if *to == -1 {
			*to = latest
		}
		if *from > *to {
			return usageError("--direction up: --from %d is above --to %d", *from, *to)
		}
	case "down":
		if *from == -1 {
			*from = latest
		}
		if *to == -1 {
			*to = 0
		}
		if *from < *to {
			return usageError("--direction down: --from %d is below --to %d", *from, *to)
		}
	default:
		return usageError("--direction %q: want up or down", *direction)
	}
	sql, err := migrations.Script(*from, *to) // refuses a version it does not know
	if err != nil {
		return usageError("%v", err)
	}
	fmt.Fprintf(e.stdout, "-- pgfence schema, %s from version %d to version %d.\n", *direction, *from, *to)
	fmt.Fprintf(e.stdout, "-- It records each step in %s, as `pgfence migrate %s` does.\n", migrations.VersionTable, *direction)
	fmt.Fprintln(e.stdout, "-- Apply in one transaction, e.g. psql --single-transaction -v ON_ERROR_STOP=1 -f this.sql")
	fmt.Fprint(e.stdout, sql)
	return nil
}

func runMigrateDB(ctx context.Context, e *env, sub string, args []string) error {
	fs := newFlags(e, "migrate "+sub, "migrate "+sub+" [flags]")
	var db dbFlags
	db.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	to := int64(-1)
	if sub == "down" {
		fs.Int64Var(&to, "to", -1, "roll back every migration above this version (default: only the newest)")
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("migrate %s takes no arguments, got %q", sub, fs.Args())
	}
	if sub == "down" && to < -1 {
		return usageError("--to must be >= 0, got %d", to)
	}
	pool, err := db.connect(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := migrations.New(pool, nil)
	if err != nil {
		return err
	}
	defer m.Close()

	switch sub {
	case "status":
		ss, err := m.Status(ctx)
		if err != nil {
			return migrateError(err)
		}
		current, latest, err := m.Version(ctx)
		if err != nil {
			return migrateError(err)
		}
		if *asJSON {
			out := make([]migrationStatusJSON, 0, len(ss))
			for _, s := range ss {
				j := migrationStatusJSON{Version: s.Version, Name: s.Name, Applied: s.Applied}
				if s.Applied {
					j.AppliedAt = s.AppliedAt.Format(time.RFC3339)
				}
				out = append(out, j)
			}
			return writeJSON(e, map[string]any{"current": current, "latest": latest, "migrations": out})
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tNAME\tAPPLIED AT")
		for _, s := range ss {
			at := "pending"
			if s.Applied {
				at = s.AppliedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\n", s.Version, s.Name, at)
		}
		tw.Flush()
		fmt.Fprintf(e.stdout, "schema version %d of %d\n", current, latest)
		return nil
	case "up":
		rs, err := m.Up(ctx)
		if err != nil {
			printResults(e, "up", rs, *asJSON, false) // what was applied before the failure
			return migrateError(err)
		}
		printResults(e, "up", rs, *asJSON, true)
		if !*asJSON {
			current, _, err := m.Version(ctx)
			if err != nil {
				return migrateError(err)
			}
			fmt.Fprintf(e.stdout, "schema at version %d\n", current)
		}
		return nil
	default: // down
		current, _, err := m.Version(ctx)
		if err != nil {
			return migrateError(err)
		}
		if to > current {
			return usageError("--to %d is above the schema's version %d: down only rolls back", to, current)
		}
		if to == -1 {
			if current == 0 {
				if *asJSON {
					return writeJSON(e, []migrationResultJSON{})
				}
				fmt.Fprintln(e.stdout, "nothing to roll back: no pgfence migration is applied")
				return nil
			}
			ss, err := m.Status(ctx)
			if err != nil {
				return migrateError(err)
			}
			to = 0
			for _, s := range ss {
				if s.Applied && s.Version < current {
					to = s.Version
				}
			}
		}
		rs, err := m.DownTo(ctx, to)
		if err != nil {
			printResults(e, "down", rs, *asJSON, false)
			return migrateError(err)
		}
		printResults(e, "down", rs, *asJSON, true)
		if !*asJSON {
			current, _, err := m.Version(ctx)
			if err != nil {
				return migrateError(err)
			}
			fmt.Fprintf(e.stdout, "schema at version %d\n", current)
		}
		return nil
	}
}

// migrationStatusJSON is one migration in `migrate status --json`.
type migrationStatusJSON struct {
	Version   int64  `json:"version"`
	Name      string `json:"name"`
	Applied   bool   `json:"applied"`
	AppliedAt string `json:"applied_at,omitempty"` // RFC 3339, empty when pending
}

// migrationResultJSON is one migration applied or rolled back, in --json.
type migrationResultJSON struct {
	Version   int64  `json:"version"`
	Name      string `json:"name"`
	Direction string `json:"direction"`
	Duration  string `json:"duration"`
}

// printResults prints the migrations applied or rolled back. After a failure
// (done false) it prints only the steps that completed, and nothing when there
// were none: the error says what happened.
func printResults(e *env, direction string, rs []migrations.Result, asJSON, done bool) {
	if !done && len(rs) == 0 {
		return
	}
	if asJSON {
		out := make([]migrationResultJSON, 0, len(rs))
		for _, r := range rs {
			out = append(out, migrationResultJSON{Version: r.Version, Name: r.Name, Direction: string(r.Direction), Duration: r.Duration.String()})
		}
		_ = writeJSON(e, out)
		return
	}
	if len(rs) == 0 {
		if direction == "up" {
			fmt.Fprintln(e.stdout, "no migrations to apply")
		} else {
			fmt.Fprintln(e.stdout, "nothing to roll back")
		}
	}
	for _, r := range rs {
		fmt.Fprintf(e.stdout, "%-4s %05d_%s (%s)\n", r.Direction, r.Version, r.Name, r.Duration)
	}
}

// migrateError explains a failed migration in one line with a hint. goose's
// error quotes the whole failing statement; the server's message and the
// migration's name say what went wrong.
func migrateError(err error) error {
	var ce *cliError
	if errors.As(schemaError(err), &ce) {
		return ce
	}
	msg := err.Error()
	var pe *goose.PartialError
	if errors.As(err, &pe) && pe.Failed != nil && pe.Failed.Source != nil {
		msg = fmt.Sprintf("migration %s (%s) failed", path.Base(pe.Failed.Source.Path), pe.Failed.Direction)
		if pgErr := pgerr.PgError(err); pgErr != nil {
			msg += ": " + pgErr.Error()
		} else {
			msg += ": " + rootCause(err).Error()
		}
	} else if pgErr := pgerr.PgError(err); pgErr != nil {
		msg = "migrations: " + pgErr.Error()
	}
	hint := "each migration runs in its own transaction: `pgfence migrate status` shows the version the schema stayed at; fix the cause and rerun"
	switch pgerr.Code(err) {
	case "42501": // insufficient_privilege
		hint = "run the migrations as a role that may create objects in this database, such as its owner"
	case "42P07", "42710", "42723": // duplicate table, object, function
		hint = "pgfence objects exist that " + migrations.VersionTable + " does not record (installed by a script from an older `pgfence migrate sql`?); `pgfence migrate status` shows the recorded version"
	}
	return &cliError{msg: redact(msg), hint: hint, code: exitFailure, err: err}
}

func writeJSON(e *env, v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
