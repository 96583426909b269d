package migrations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrUntrusted is wrapped by an [*UntrustedError]: the migrating role does
// not own what it would install into, or the pgfence roles are not the plain
// groups pgfence grants privileges to.
var ErrUntrusted = errors.New("migrations: refusing to migrate: the pgfence schema or roles are not safe for the migrating role")

// Finding is one reason an [*UntrustedError] refuses to migrate.
type Finding struct {
	// Object names what is wrong: "schema pgfence",
	// "function pgfence.next_token(bigint)", "role pgfence_app",
	// "search_path", ...
	Object string
	// Problem says what is wrong with it and why it matters.
	Problem string
	// Fix says what to do about it, often as a statement to run.
	Fix string
}

// UntrustedError is returned by [Migrator.Up] and [Migrator.DownTo], before
// they change anything, when migrating as Role would hand another role a way
// to run code with Role's rights: pgfence's SECURITY DEFINER functions run as
// their owner, the migrating role, and use every object of schema pgfence.
//
// It refuses when schema pgfence exists and another role owns it or anything
// in it (relations, functions, types, operators, ...), or may create objects
// in it; when another role may write a pgfence table or add a trigger to it,
// or Role's default privileges would grant that (or EXECUTE) on what the
// migrations create; when role pgfence_app or pgfence_operator exists with
// LOGIN, SUPERUSER, CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS, or as a
// member of another role; and when the session's search_path puts a schema
// before pg_catalog. The first migration runs the same check in SQL, so a
// script from [Script] refuses the same database.
type UntrustedError struct {
	// Role is the migrating role (current_user).
	Role string
	// Findings lists every reason, most important first.
	Findings []Finding
}

func (e *UntrustedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "migrations: refusing to migrate as role %s: ", e.Role)
	for i, f := range e.Findings {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.Object + " " + f.Problem)
	}
	b.WriteString(". To fix: ")
	seen := map[string]bool{}
	for _, f := range e.Findings {
		if !seen[f.Fix] {
			if len(seen) > 0 {
				b.WriteString(" ")
			}
			seen[f.Fix] = true
			b.WriteString(f.Fix)
		}
	}
	return b.String()
}

// Unwrap returns [ErrUntrusted].
func (e *UntrustedError) Unwrap() error { return ErrUntrusted }

// The first migration holds the trust check between these markers: the
// whole statement, which a script runs first, and in it the query that
// lists what is wrong, which the migrator runs on its own.
const (
	trustBlockBegin    = "-- pgfence:trust-check begin"
	trustBlockEnd      = "-- pgfence:trust-check end"
	trustFindingsBegin = "-- pgfence:findings begin"
	trustFindingsEnd   = "-- pgfence:findings end"
)

// trustSQL returns the text of the first migration between begin and end.
func trustSQL(begin, end string) (string, error) {
	raw, err := fs.ReadFile(files, firstMigration)
	if err != nil {
		return "", fmt.Errorf("migrations: %w", err)
	}
	s := string(raw)
	i := strings.Index(s, begin)
	j := strings.Index(s, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("migrations: %s lacks the markers %q and %q", firstMigration, begin, end)
	}
	return strings.TrimSpace(s[i+len(begin) : j]), nil
}

// firstMigration holds the trust check.
const firstMigration = "00001_schema.sql"

// checkTrust returns an [*UntrustedError] listing what is wrong, or nil. It
// reads the session's search_path first, so call it before pinning it.
func checkTrust(ctx context.Context, tx pgx.Tx) error {
	query, err := trustSQL(trustFindingsBegin, trustFindingsEnd)
	if err != nil {
		return err
	}
	var role string
	var path []string
	if err := tx.QueryRow(ctx, `SELECT CURRENT_USER::pg_catalog.text, pg_catalog.current_schemas(true)::pg_catalog.text[]`).Scan(&role, &path); err != nil {
		return err
	}
	var findings []Finding
	if f, ok := searchPathFinding(path); ok {
		findings = append(findings, f)
	}
	rows, err := tx.Query(ctx, query)
	if err != nil {
		return err
	}
	for rows.Next() {
		var rank int
		var f Finding
		if err := rows.Scan(&rank, &f.Object, &f.Problem, &f.Fix); err != nil {
			rows.Close()
			return err
		}
		findings = append(findings, f)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(findings) == 0 {
		return nil
	}
	return &UntrustedError{Role: role, Findings: findings}
}

// searchPathFinding reports a search_path that puts a schema before
// pg_catalog (path is current_schemas(true); the session's own temporary
// schema is never searched for functions and operators). goose's own
// statements, which the migrator cannot pin, would resolve built-in names
// such as max() and now() in that schema, as the migrating role.
func searchPathFinding(path []string) (Finding, bool) {
	var before []string
	for _, s := range path {
		if s == "pg_catalog" {
			break
		}
		if !strings.HasPrefix(s, "pg_temp_") {
			before = append(before, s)
		}
	}
	if len(before) == 0 {
		return Finding{}, false
	}
	return Finding{
		Object: "search_path",
		Problem: fmt.Sprintf("puts %s before pg_catalog (effective path %s): the statements that record migrations would resolve built-in functions there, with the rights of the migrating role",
			strings.Join(before, ", "), strings.Join(path, ", ")),
		Fix: "Remove the setting that does it (ALTER DATABASE ... RESET search_path, ALTER ROLE ... RESET search_path, or the options of the connection string), or put pg_catalog first.",
	}, true
}
