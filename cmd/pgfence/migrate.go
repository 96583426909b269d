package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/migrations"
)

// migrationJSON is one migration applied or rolled back.
type migrationJSON struct {
	Version    int64  `json:"version"`
	Name       string `json:"name"`
	Direction  string `json:"direction"` // up or down
	DurationMS int64  `json:"duration_ms"`
}

// migrateJSON is what `migrate up --json` and `migrate down --json` print:
// the migrations applied or rolled back, and the schema's version after
// them (absent when a failure left it unknown).
type migrateJSON struct {
	Migrations []migrationJSON `json:"migrations"`
	Version    *int64          `json:"version,omitempty"`
}

// migrationStatusJSON is one migration in `migrate status --json`.
type migrationStatusJSON struct {
	Version   int64      `json:"version"`
	Name      string     `json:"name"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"` // absent when pending
}

// migrateStatusJSON is what `migrate status --json` prints.
type migrateStatusJSON struct {
	Version    int64                 `json:"version"` // 0: nothing applied
	Latest     int64                 `json:"latest"`  // the newest this binary knows
	Migrations []migrationStatusJSON `json:"migrations"`
}

// migrateSQLJSON is what `migrate sql --json` prints.
type migrateSQLJSON struct {
	Direction string `json:"direction"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
	SQL       string `json:"sql"`
}

// migrator opens the command's database and a migrator on it.
func migrator(ctx context.Context, in *input) (*migrations.Migrator, func(), error) {
	pool, err := in.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	m, err := migrations.New(pool, nil)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return m, func() { m.Close(); pool.Close() }, nil
}

func migrateUp(*flag.FlagSet) runFunc {
	return func(ctx context.Context, in *input) error {
		m, done, err := migrator(ctx, in)
		if err != nil {
			return err
		}
		defer done()
		rs, err := m.Up(ctx)
		if err != nil {
			printResults(ctx, in, m, "up", rs, false) // what was applied before the failure
			return migrateError(err)
		}
		return printResults(ctx, in, m, "up", rs, true)
	}
}

func migrateDown(fs *flag.FlagSet) runFunc {
	to := fs.Int64("to", -1, "roll back every migration above this version (default: only the newest)")
	return func(ctx context.Context, in *input) error {
		if *to < -1 {
			return usageError("--to must be >= 0, got %d", *to)
		}
		m, done, err := migrator(ctx, in)
		if err != nil {
			return err
		}
		defer done()
		current, _, err := m.Version(ctx)
		if err != nil {
			return migrateError(err)
		}
		if *to > current {
			return usageError("--to %d is above the schema's version %d: down only rolls back", *to, current)
		}
		target := *to
		if target == -1 {
			if current == 0 {
				return in.print(migrateJSON{Migrations: []migrationJSON{}, Version: &current}, func(w io.Writer) {
					fmt.Fprintln(w, "nothing to roll back: no pgfence migration is applied")
				})
			}
			ss, err := m.Status(ctx)
			if err != nil {
				return migrateError(err)
			}
			target = 0
			for _, s := range ss {
				if s.Applied && s.Version < current {
					target = s.Version
				}
			}
		}
		rs, err := m.DownTo(ctx, target)
		if err != nil {
			printResults(ctx, in, m, "down", rs, false)
			return migrateDownError(err, target)
		}
		return printResults(ctx, in, m, "down", rs, true)
	}
}

// printResults prints the migrations applied or rolled back, and the version
// the schema is at. After a failure (done false) it prints only the steps
// that completed, and nothing when there were none: the error says what
// happened.
func printResults(ctx context.Context, in *input, m *migrations.Migrator, direction string, rs []migrations.Result, done bool) error {
	if !done && len(rs) == 0 {
		return nil
	}
	out := migrateJSON{Migrations: make([]migrationJSON, 0, len(rs))}
	for _, r := range rs {
		out.Migrations = append(out.Migrations, migrationJSON{Version: r.Version, Name: r.Name, Direction: string(r.Direction), DurationMS: r.Duration.Milliseconds()})
	}
	// After a failure the connection may be gone: the version is best effort.
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), in.db.timeout)
	defer cancel()
	if current, _, err := m.Version(vctx); err == nil {
		out.Version = &current
	} else if done {
		return migrateError(err)
	}
	return in.print(out, func(w io.Writer) {
		if len(rs) == 0 {
			if direction == "up" {
				fmt.Fprintln(w, "no migrations to apply")
			} else {
				fmt.Fprintln(w, "nothing to roll back")
			}
		}
		for _, r := range rs {
			fmt.Fprintf(w, "%-4s %05d_%s (%s)\n", r.Direction, r.Version, r.Name, r.Duration)
		}
		if out.Version != nil && done {
			fmt.Fprintf(w, "schema at version %d\n", *out.Version)
		}
	})
}

func migrateStatus(*flag.FlagSet) runFunc {
	return func(ctx context.Context, in *input) error {
		m, done, err := migrator(ctx, in)
		if err != nil {
			return err
		}
		defer done()
		ss, err := m.Status(ctx)
		if err != nil {
			return migrateError(err)
		}
		current, latest, err := m.Version(ctx)
		if err != nil {
			return migrateError(err)
		}
		out := migrateStatusJSON{Version: current, Latest: latest, Migrations: make([]migrationStatusJSON, 0, len(ss))}
		for _, s := range ss {
			j := migrationStatusJSON{Version: s.Version, Name: s.Name, Applied: s.Applied}
			if s.Applied {
				j.AppliedAt = optionalTime(s.AppliedAt)
			}
			out.Migrations = append(out.Migrations, j)
		}
		return in.print(out, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tNAME\tAPPLIED AT")
			for _, s := range ss {
				at := "pending"
				if s.Applied {
					at = s.AppliedAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\n", s.Version, s.Name, at)
			}
			tw.Flush()
			fmt.Fprintf(w, "schema version %d of %d\n", current, latest)
		})
	}
}

func migrateSQL(fs *flag.FlagSet) runFunc {
	direction := fs.String("direction", "up", "up or down")
	from := fs.Int64("from", -1, "the schema version the script starts from (default: 0 up, the latest down)")
	to := fs.Int64("to", -1, "the schema version the script ends at (default: the latest up, 0 down)")
	return func(ctx context.Context, in *input) error {
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
		return in.print(migrateSQLJSON{Direction: *direction, From: *from, To: *to, SQL: sql}, func(w io.Writer) {
			fmt.Fprintf(w, "-- pgfence schema, %s from version %d to version %d.\n", *direction, *from, *to)
			fmt.Fprintf(w, "-- It records each step in %s, as `pgfence migrate %s` does.\n", migrations.VersionTable, *direction)
			fmt.Fprintln(w, "-- Apply in one transaction, e.g. psql --single-transaction -v ON_ERROR_STOP=1 -f this.sql")
			fmt.Fprint(w, sql)
		})
	}
}

// migrateError explains a failed migration in one line with a hint. goose's
// error quotes the whole failing statement; the server's message and the
// migration's name say what went wrong.
func migrateError(err error) error {
	return migrateErrorHint(err, "run `pgfence migrate up` again")
}

// migrateDownError is migrateError for a rollback to target: a rollback cut
// short is finished by rolling back again, never by migrate up, which would
// re-apply what it was removing.
func migrateDownError(err error, target int64) error {
	return migrateErrorHint(err, fmt.Sprintf("run `pgfence migrate down --to %d` again", target))
}

// migrateErrorHint is migrateError with again as the way to finish a run whose
// lock was taken over.
func migrateErrorHint(err error, again string) error {
	var ce *cliError
	if errors.As(schemaError(err), &ce) {
		return ce
	}
	var untrusted *migrations.UntrustedError
	if errors.As(err, &untrusted) {
		fixes := make([]string, 0, len(untrusted.Findings))
		for _, f := range untrusted.Findings {
			fixes = append(fixes, f.Object+": "+f.Fix)
		}
		return &cliError{msg: redact(untrusted.Error()), hint: strings.Join(fixes, "; "), code: exitFailure, err: err}
	}
	var locked *migrations.LockedError
	if errors.As(err, &locked) {
		return &cliError{msg: redact(locked.Error()), hint: "`pgfence doctor` shows the lock; retry once the other migration has finished", code: exitFailure, err: err}
	}
	if errors.Is(err, migrations.ErrLockLost) {
		return &cliError{msg: redact(err.Error()), hint: "another migrator took the lock over (or an operator cleared it) after this one was paused past its lease; what this run did is recorded: " + again, code: exitFailure, err: err}
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
