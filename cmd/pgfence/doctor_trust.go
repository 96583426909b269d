package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/migrations"
)

// The statements of the trust checks. Like the doctor's others, each names
// its functions, operators and types with their schema.
const (
	// sqlInstaller: the owner of schema pgfence, and the role that installed
	// it: the owner of the version table, which the first migration run
	// created (NULL without one); each also quoted for a statement.
	sqlInstaller = `SELECT o.owner, pg_catalog.quote_ident(o.owner), o.installer, pg_catalog.quote_ident(o.installer)
  FROM (SELECT pg_catalog.pg_get_userbyid(n.nspowner)::pg_catalog.text AS owner,
               (SELECT pg_catalog.pg_get_userbyid(c.relowner)::pg_catalog.text FROM pg_catalog.pg_class c
                 WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1::pg_catalog.text)::pg_catalog.oid) AS installer
          FROM pg_catalog.pg_namespace n
         WHERE n.nspname OPERATOR(pg_catalog.=) 'pgfence') o`

	// sqlSecurityDefiners: every SECURITY DEFINER function of schema
	// pgfence, its owner, whether that is the schema's owner, and its
	// search_path setting (NULL when it has none).
	sqlSecurityDefiners = `SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text, pg_catalog.pg_get_userbyid(p.proowner)::pg_catalog.text,
       p.proowner OPERATOR(pg_catalog.=) n.nspowner,
       (SELECT pg_catalog.substr(c, 13) FROM pg_catalog.unnest(p.proconfig) c
         WHERE pg_catalog.starts_with(c, 'search_path=') LIMIT 1)
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
 WHERE n.nspname OPERATOR(pg_catalog.=) 'pgfence' AND p.prosecdef
 ORDER BY 1`

	// sqlLockWriters: other sessions whose open transaction wrote the
	// migration lock's table (a row lock the lock's reader cannot see yet:
	// a script from `pgfence migrate sql` holds it until it commits).
	// Times are NULL for another role's session unless this role may read
	// all statistics.
	sqlLockWriters = `SELECT l.pid, coalesce(a.usename::pg_catalog.text, ''), coalesce(a.application_name, ''), a.xact_start,
       pg_catalog.clock_timestamp()
  FROM pg_catalog.pg_locks l
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
 WHERE l.locktype OPERATOR(pg_catalog.=) 'relation' AND l.granted
   AND l.relation OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1::pg_catalog.text)::pg_catalog.oid
   AND l.mode OPERATOR(pg_catalog.=) 'RowExclusiveLock'
   AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
 ORDER BY 1`
)

// trustChecks reports what makes the installed schema unsafe to trust, as
// the migrator's own trust check ([migrations.Audit]) sees it for the role
// that installed the schema: who owns the schema and what is in it, who else
// may create in it or write its tables, and what pgfence's roles may do;
// then pgfence's SECURITY DEFINER functions, which run with their owner's
// rights.
func trustChecks(ctx context.Context, pool *pgxpool.Pool) []check {
	const (
		ownership  = "ownership"
		privileges = "schema privileges"
		roles      = "role attributes"
		definers   = "security definer functions"
	)
	failAll := func(format string, args ...any) []check {
		var out []check
		for _, name := range []string{ownership, privileges, roles, definers} {
			out = append(out, check{Name: name, Status: statusFail, Detail: fmt.Sprintf(format, args...)})
		}
		return out
	}
	var owner, ownerQuoted string
	var installer, installerQuoted *string
	if err := pool.QueryRow(ctx, sqlInstaller, migrations.VersionTable).Scan(&owner, &ownerQuoted, &installer, &installerQuoted); err != nil {
		return failAll("cannot read the owner of schema pgfence: %v", err)
	}
	// The role that migrated: the version table's owner. Without a
	// version table (a damaged installation, which the schema check
	// reports), the schema's owner.
	migrator, q := owner, ownerQuoted
	how := "which owns it"
	if installer != nil {
		migrator, q = *installer, *installerQuoted
		how = "the owner of " + migrations.VersionTable + ", which the first migration created"
	}
	findings, err := migrations.Audit(ctx, pool, migrator)
	if err != nil {
		return failAll("cannot run the trust check for role %s: %v", migrator, err)
	}
	byKind := func(kinds ...string) []migrations.Finding {
		var out []migrations.Finding
		for _, f := range findings {
			for _, k := range kinds {
				if f.Kind == k {
					out = append(out, f)
				}
			}
		}
		return out
	}
	report := func(name string, found []migrations.Finding, fix func(migrations.Finding) string, ok string) check {
		if len(found) == 0 {
			return check{Name: name, Status: statusOK, Detail: ok}
		}
		var problems, fixes []string
		seen := map[string]bool{}
		for _, f := range found {
			problems = append(problems, f.Object+" "+f.Problem)
			if x := fix(f); !seen[x] {
				seen[x] = true
				fixes = append(fixes, x)
			}
		}
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("%s. To fix: %s", strings.Join(problems, "; "), strings.Join(fixes, " "))}
	}
	asIs := func(f migrations.Finding) string { return f.Fix }
	out := []check{
		// The migrator's fix for a schema another role owns is to migrate
		// as that role; here the schema is installed, and was handed over.
		report(ownership, byKind("schema owner", "object owner"), func(f migrations.Finding) string {
			if f.Kind == "schema owner" {
				return fmt.Sprintf("Find out who handed schema pgfence over and why, then give it back: ALTER SCHEMA pgfence OWNER TO %s;", q)
			}
			return f.Fix
		}, fmt.Sprintf("schema pgfence and every object in it are owned by role %s, the role that migrated (%s)", migrator, how)),
		report(privileges, byKind("schema create", "table grant", "default privileges"), asIs,
			fmt.Sprintf("no other role may create objects in schema pgfence or write its tables, and the default privileges of %s grant nothing on what migrations create", migrator)),
		report(roles, byKind("role attributes", "role membership"), asIs,
			"pgfence_app and pgfence_operator are NOLOGIN groups without attributes, members of no other role"),
		securityDefiners(ctx, pool, owner, ownerQuoted),
	}
	return out
}

// securityDefiners checks pgfence's SECURITY DEFINER functions: each runs
// with its owner's rights, so it must be owned by the schema's owner and
// pin its search_path, else a caller's search_path decides what its
// unqualified names resolve to.
func securityDefiners(ctx context.Context, pool *pgxpool.Pool, owner, ownerQuoted string) check {
	const name = "security definer functions"
	rows, err := pool.Query(ctx, sqlSecurityDefiners)
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("cannot list them: %v", err)}
	}
	var fn, fnOwner string
	var owned bool
	var path *string
	var problems []string
	n := 0
	_, err = pgx.ForEachRow(rows, []any{&fn, &fnOwner, &owned, &path}, func() error {
		n++
		if !owned {
			problems = append(problems, fmt.Sprintf("function %s is owned by role %s, not by the schema's owner %s: it runs with the rights of %s (ALTER FUNCTION %s OWNER TO %s, or drop it if pgfence did not create it)",
				fn, fnOwner, owner, fnOwner, fn, ownerQuoted))
		}
		switch {
		case path == nil:
			problems = append(problems, fmt.Sprintf("function %s sets no search_path: the caller's search_path decides what its unqualified names resolve to, with its owner's rights (ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp)", fn, fn))
		case !pinnedSearchPath(*path):
			problems = append(problems, fmt.Sprintf("function %s sets search_path=%s: only pg_catalog and pgfence may be searched, with pg_temp last, else another role's schema or the caller's temporary objects decide what its names resolve to (ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp)", fn, *path, fn))
		}
		return nil
	})
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("cannot list them: %v", err)}
	}
	if len(problems) > 0 {
		return check{Name: name, Status: statusFail, Detail: strings.Join(problems, "; ")}
	}
	return check{Name: name, Status: statusOK, Detail: fmt.Sprintf("%d SECURITY DEFINER function(s) in schema pgfence, each owned by %s with search_path pinned", n, owner)}
}

// pinnedSearchPath reports whether a function's search_path setting (as in
// proconfig: names separated by ", ", quoted where needed) searches only
// pg_catalog and pgfence, both owned by trusted roles, and pg_temp last
// (unnamed, it is searched first for tables).
func pinnedSearchPath(path string) bool {
	names := strings.Split(path, ",")
	for i, s := range names {
		switch strings.TrimSpace(s) {
		case "pg_catalog", "pgfence":
		case "pg_temp":
			if i != len(names)-1 {
				return false
			}
		default:
			return false
		}
	}
	return strings.TrimSpace(names[len(names)-1]) == "pg_temp"
}

// migrationLock reports the migration lock: free, held by a migration that
// runs now, held by one whose lease lapsed (it crashed or lost the
// database; the next migration takes it over), or being written by a
// transaction that has not committed (a script being applied). It waits for
// nothing.
func migrationLock(ctx context.Context, pool *pgxpool.Pool) check {
	const name = "migration lock"
	var writers []string
	rows, err := pool.Query(ctx, sqlLockWriters, migrations.LockTable)
	if err == nil {
		var pid int
		var user, app string
		var since *time.Time
		var now time.Time
		_, err = pgx.ForEachRow(rows, []any{&pid, &user, &app, &since, &now}, func() error {
			w := fmt.Sprintf("pid %d", pid)
			if user != "" {
				w += fmt.Sprintf(", role %s, application %q", user, app)
			}
			if since != nil {
				w += fmt.Sprintf(", in a transaction open since %s (%s)", since.UTC().Format(time.RFC3339), now.Sub(*since).Round(time.Second))
			}
			writers = append(writers, w)
			return nil
		})
	}
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("cannot read the locks on %s: %v", migrations.LockTable, err)}
	}
	uncommitted := ""
	if len(writers) > 0 {
		uncommitted = fmt.Sprintf("; a transaction that has not committed is writing %s (%s): a script from `pgfence migrate sql` being applied, most likely, and migrations wait for it to end",
			migrations.LockTable, strings.Join(writers, "; "))
	}

	h, lapsed, err := migrations.ReadLock(ctx, pool)
	switch {
	case pgerr.Code(err) == "42501":
		status := statusOK
		if uncommitted != "" {
			status = statusWarn
		}
		return check{Name: name, Status: status, Detail: fmt.Sprintf("holder not checked: only the schema's owner may read %s; run the doctor as that role to see who holds it%s", migrations.LockTable, uncommitted)}
	case err != nil:
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("cannot read %s: %v", migrations.LockTable, err)}
	case h == nil && uncommitted == "":
		return check{Name: name, Status: statusOK, Detail: "free: no migration runs"}
	case h == nil:
		return check{Name: name, Status: statusWarn, Detail: "no committed holder" + uncommitted}
	}
	who := fmt.Sprintf("host %s, pid %d, application %q, role %s, since %s", h.Host, h.PID, h.Application, h.User, h.LockedAt.UTC().Format(time.RFC3339))
	if lapsed {
		return check{Name: name, Status: statusWarn, Detail: fmt.Sprintf(
			"stale: held by %s, but its lease lapsed at %s (the migration stopped renewing it: it crashed, was killed, or lost the database). The next `pgfence migrate up` takes it over; to clear it now, once that process no longer runs, as the schema's owner: DELETE FROM %s%s",
			who, h.LeaseUntil.UTC().Format(time.RFC3339), migrations.LockTable, uncommitted)}
	}
	return check{Name: name, Status: statusWarn, Detail: fmt.Sprintf(
		"held by a running migration: %s, lease until %s (renewed every %s while it runs); other migrations wait for it%s",
		who, h.LeaseUntil.UTC().Format(time.RFC3339), 10*time.Second, uncommitted)}
}
