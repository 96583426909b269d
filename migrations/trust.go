package migrations

import (
	"context"
	"database/sql"
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
	// Kind names the rule the finding breaks, most important first:
	// "search_path" (the session's search_path puts a schema before
	// pg_catalog), "schema owner" (another role owns schema pgfence),
	// "schema create" (another role may create objects in it), "object
	// owner" (another role owns an object in it), "table grant" (another
	// role may write a pgfence table or add a trigger to it), "default
	// privileges" (the role's default privileges would grant another role
	// that on what the migrations create), "role attributes" (pgfence_app
	// or pgfence_operator can log in or has an attribute) and "role
	// membership" (either is a member of another role).
	Kind string
}

// findingKinds maps the rank the trust check's query gives a finding to its
// kind.
var findingKinds = map[int]string{
	1: "schema owner", 2: "schema create", 3: "object owner", 4: "table grant",
	5: "default privileges", 6: "role attributes", 7: "role membership",
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
func checkTrust(ctx context.Context, tx *sql.Tx) error {
	var role string
	if err := tx.QueryRowContext(ctx, `SELECT CURRENT_USER::pg_catalog.text`).Scan(&role); err != nil {
		return err
	}
	path, err := searchPath(ctx, tx)
	if err != nil {
		return err
	}
	var findings []Finding
	if f, ok := searchPathFinding(path); ok {
		findings = append(findings, f)
	}
	query, err := auditSQL()
	if err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, query, role)
	if err != nil {
		return err
	}
	defer rows.Close()
	found, err := scanFindings(rows)
	if err != nil {
		return err
	}
	findings = append(findings, found...)
	if len(findings) == 0 {
		return nil
	}
	return &UntrustedError{Role: role, Findings: findings}
}

// Querier runs a query: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// trustRoleCurrent is how the trust check's query names the migrating role,
// once; [Audit] puts the role it is given there instead.
const (
	trustRoleCurrent = "WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER"
	trustRoleParam   = "WHERE r.rolname OPERATOR(pg_catalog.=) $1::pg_catalog.name"
)

// Audit runs the migrator's trust check as if role were migrating, and
// returns what it finds, most important first (the session's search_path
// aside, which only matters to a session that migrates): another role owns
// schema pgfence or an object in it, may create objects in it, may write a
// pgfence table; role's default privileges would grant others what the
// migrations create; pgfence_app or pgfence_operator can log in, has an
// attribute or is a member of another role. It is the same query the first
// migration runs, changes nothing and takes no lock, so any role can run it
// (`pgfence doctor` does, for the role that installed the schema).
func Audit(ctx context.Context, q Querier, role string) ([]Finding, error) {
	query, err := auditSQL()
	if err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, query, role)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanFindings(rows)
}

// auditSQL is the first migration's trust check with the migrating role as
// parameter $1.
func auditSQL() (string, error) {
	query, err := trustSQL(trustFindingsBegin, trustFindingsEnd)
	if err != nil {
		return "", err
	}
	if n := strings.Count(query, trustRoleCurrent); n != 1 {
		return "", fmt.Errorf("migrations: the trust check in %s names the migrating role %d times, want once as %q", firstMigration, n, trustRoleCurrent)
	}
	return strings.Replace(query, trustRoleCurrent, trustRoleParam, 1), nil
}

// scanFindings reads the trust check's rows, from either driver.
func scanFindings(rows interface {
	Next() bool
	Scan(...any) error
	Err() error
}) ([]Finding, error) {
	var findings []Finding
	for rows.Next() {
		var rank int
		var f Finding
		if err := rows.Scan(&rank, &f.Object, &f.Problem, &f.Fix); err != nil {
			return nil, err
		}
		f.Kind = findingKinds[rank]
		findings = append(findings, f)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return findings, nil
}

// searchPath returns the schemas the session searches, in order
// (current_schemas(true)), one row each: drivers scan arrays differently.
func searchPath(ctx context.Context, tx *sql.Tx) ([]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT s.name::pg_catalog.text
  FROM pg_catalog.unnest(pg_catalog.current_schemas(true)) WITH ORDINALITY AS s(name, n) ORDER BY s.n`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var path []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		path = append(path, name)
	}
	return path, rows.Err()
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
		Kind:   "search_path",
		Object: "search_path",
		Problem: fmt.Sprintf("puts %s before pg_catalog (effective path %s): the statements that record migrations would resolve built-in functions there, with the rights of the migrating role",
			strings.Join(before, ", "), strings.Join(path, ", ")),
		Fix: "Remove the setting that does it (ALTER DATABASE ... RESET search_path, ALTER ROLE ... RESET search_path, or the options of the connection string), or put pg_catalog first.",
	}, true
}
