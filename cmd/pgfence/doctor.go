package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/migrations"
)

// check is one doctor finding.
type check struct {
	Name   string `json:"name"`
	Status string `json:"status"` // ok, warn or fail
	Detail string `json:"detail"`
}

const (
	statusOK   = "ok"
	statusWarn = "warn"
	statusFail = "fail"
)

func runDoctor(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "doctor", "doctor [--database-url URL] [--json]")
	var db dbFlags
	db.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("doctor takes no arguments, got %q", fs.Args())
	}
	pool, err := db.connect(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()

	checks := diagnose(ctx, pool)
	failed := 0
	for _, c := range checks {
		if c.Status == statusFail {
			failed++
		}
	}
	if *asJSON {
		if err := writeJSON(e, map[string]any{"checks": checks, "failed": failed}); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL")
		for _, c := range checks {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Status, c.Detail)
		}
		tw.Flush()
	}
	if failed > 0 {
		return &cliError{msg: fmt.Sprintf("doctor: %d check(s) failed", failed), hint: "see the DETAIL column of the failed checks", code: exitFailure}
	}
	return nil
}

// diagnose runs every check against a live database. A check that cannot run
// reports fail with the reason instead of aborting the others.
func diagnose(ctx context.Context, pool *pgxpool.Pool) []check {
	var out []check
	add := func(name, status, format string, args ...any) {
		out = append(out, check{Name: name, Status: status, Detail: fmt.Sprintf(format, args...)})
	}

	var version string
	var inRecovery bool
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), pg_is_in_recovery()`).Scan(&version, &inRecovery); err != nil {
		add("server", statusFail, "cannot query the server: %v", err)
		return out
	}
	if inRecovery {
		add("server", statusFail, "PostgreSQL %s is a standby (in recovery): pgfence issues tokens only on the primary; connect with target_session_attrs=read-write", version)
	} else {
		add("server", statusOK, "PostgreSQL %s, primary", version)
	}

	m, err := migrations.New(pool, nil)
	schemaOK := false
	if err == nil {
		current, latest, verr := m.Version(ctx)
		m.Close()
		switch {
		case verr != nil:
			add("schema", statusFail, "%v", verr)
		case current == 0 && unrecordedObjects(ctx, pool):
			add("schema", statusFail, "pgfence objects exist but %s records no migration (installed by a script from an older `pgfence migrate sql`?), so `pgfence migrate up` would fail on them; record the installed versions (README, \"Install the schema\")", migrations.VersionTable)
		case current == 0:
			add("schema", statusFail, "the pgfence schema is not installed; run `pgfence migrate up`")
		case current < latest:
			add("schema", statusFail, "schema version %d, this binary expects %d; run `pgfence migrate up`", current, latest)
		default:
			add("schema", statusOK, "schema version %d (latest)", current)
			schemaOK = true
		}
	} else {
		add("schema", statusFail, "%v", err)
	}

	var syncCommit, syncStandbys string
	var replicas, syncReplicas int
	if err := pool.QueryRow(ctx, `
		SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
		       (SELECT count(*) FROM pg_stat_replication),
		       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))`).
		Scan(&syncCommit, &syncStandbys, &replicas, &syncReplicas); err != nil {
		add("durability", statusFail, "cannot read durability settings: %v", err)
	} else {
		switch syncCommit {
		case "off", "local":
			add("synchronous_commit", statusWarn, "synchronous_commit=%s for this role: pgfence forces it on in lease and fence transactions, but your own business writes may be lost on a crash", syncCommit)
		default:
			add("synchronous_commit", statusOK, "synchronous_commit=%s", syncCommit)
		}
		switch {
		case replicas == 0:
			add("replication", statusOK, "no standbys attached: a failover would lose this server's data, tokens stay monotone on the new timeline")
		case syncReplicas == 0:
			add("replication", statusWarn, "%d asynchronous standby(s), synchronous_standby_names=%q: after a promotion, recently acknowledged grants and fenced writes may be lost (tokens still never go backwards: the new timeline is in their high bits)", replicas, syncStandbys)
		default:
			add("replication", statusOK, "%d standby(s), %d synchronous (synchronous_standby_names=%q)", replicas, syncReplicas, syncStandbys)
		}
	}

	var idleTimeout, lockTimeout string
	if err := pool.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('lock_timeout')`).Scan(&idleTimeout, &lockTimeout); err == nil {
		if idleTimeout == "0" {
			add("idle_in_transaction_session_timeout", statusWarn, "not set for this role: a paused holder with an open transaction can block a takeover indefinitely; e.g. ALTER ROLE CURRENT_USER SET idle_in_transaction_session_timeout = '30s'")
		} else {
			add("idle_in_transaction_session_timeout", statusOK, "%s", idleTimeout)
		}
	}

	out = append(out, detectPooler(ctx, pool))

	if schemaOK {
		var expired, live int
		if err := pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE released_at IS NULL AND expires_at <= clock_timestamp()),
			       count(*) FILTER (WHERE released_at IS NULL AND expires_at > clock_timestamp())
			FROM pgfence.leases`).Scan(&expired, &live); err != nil {
			add("leases", statusFail, "cannot read pgfence.leases: %v", err)
		} else if expired > 0 {
			add("leases", statusWarn, "%d live, %d past expiry and never released (their holders died or lost the database; the next acquire takes them over)", live, expired)
		} else {
			add("leases", statusOK, "%d live, none past expiry", live)
		}
		out = append(out, roleMembers(ctx, pool))
		out = append(out, grantPauses(ctx, pool))
		out = append(out, unprotectedTables(ctx, pool))
		out = append(out, unstableResourceColumns(ctx, pool))
		out = append(out, guardGaps(ctx, pool))
	}
	return out
}

// unstableResourceColumns lists protected tables whose resource column prints
// differently by session settings (a timestamptz by TimeZone, a float by
// extra_float_digits, an interval by IntervalStyle): protected before
// migration 00014 refused such columns, one row may be several resources.
func unstableResourceColumns(ctx context.Context, pool *pgxpool.Pool) check {
	const name = "protected resource columns"
	rows, err := pool.Query(ctx, `
		SELECT format('%s.%I (%s)', p.relation, p.resource_column, format_type(a.atttypid, a.atttypmod))
		FROM pgfence.protected_tables() p
		JOIN pg_attribute a ON a.attrelid = p.relation AND a.attname = p.resource_column AND NOT a.attisdropped
		JOIN pg_type t ON t.oid = a.atttypid
		WHERE (CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END)
		      NOT IN ('text'::regtype, 'varchar'::regtype, 'bpchar'::regtype, 'int2'::regtype,
		              'int4'::regtype, 'int8'::regtype, 'numeric'::regtype, 'uuid'::regtype)
		ORDER BY 1`)
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: err.Error()}
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: err.Error()}
	}
	if len(cols) > 0 {
		return check{Name: name, Status: statusWarn, Detail: fmt.Sprintf(
			"%s: the resource is the column's text, which depends on the writer's session settings, so one row can be several resources fenced apart; protect the table on a text or integer key column instead", strings.Join(cols, ", "))}
	}
	return check{Name: name, Status: statusOK, Detail: "every protected table's resource column prints the same in every session"}
}

// guardGaps lists the ways rows of a protected table can be written past
// its guard, which pgfence.protected_tables() alone does not show: a guard
// disabled (or set to fire for replicas only), a partition or inheritance
// child without the guard or without the TRUNCATE guard (protect() covers
// those that exist when it runs; one attached or created later gets only the
// row guard PostgreSQL clones to a partition), and, where the guard is a
// BEFORE trigger (tables protected before migration 00017), a BEFORE row
// trigger that fires after it (triggers fire in name order) and so can
// change the row, and its resource, after the check.
func guardGaps(ctx context.Context, pool *pgxpool.Pool) check {
	const name = "protected table guards"
	// tgtype bits: 1 row, 2 before, 4 insert, 16 update.
	rows, err := pool.Query(ctx, `
		WITH RECURSIVE tree(relid) AS (
		    SELECT p.relation::oid FROM pgfence.protected_tables() p
		    UNION
		    SELECT i.inhrelid FROM tree t JOIN pg_inherits i ON i.inhparent = t.relid
		)
		SELECT format('%s: %s', t.relid::regclass, g.problem)
		FROM tree t
		JOIN pg_class c ON c.oid = t.relid
		CROSS JOIN LATERAL (
		    SELECT 'has no pgfence_guard trigger, so rows written through it are not checked (run protect again on the protected table it belongs to)' AS problem
		     WHERE NOT EXISTS (SELECT 1 FROM pg_trigger x WHERE x.tgrelid = t.relid AND x.tgname = 'pgfence_guard')
		    UNION ALL
		    SELECT 'its pgfence_guard trigger is disabled or fires for replicas only (ALTER TABLE ... ENABLE TRIGGER pgfence_guard)'
		     WHERE EXISTS (SELECT 1 FROM pg_trigger x WHERE x.tgrelid = t.relid AND x.tgname = 'pgfence_guard'
		                     AND x.tgenabled NOT IN ('O', 'A'))
		    UNION ALL
		    SELECT 'TRUNCATE is not refused (run protect again on the protected table it belongs to)'
		     WHERE NOT EXISTS (SELECT 1 FROM pg_trigger x WHERE x.tgrelid = t.relid AND x.tgname = 'pgfence_guard_truncate'
		                         AND x.tgenabled IN ('O', 'A'))
		    UNION ALL
		    SELECT format('BEFORE trigger %I fires after its BEFORE guard (name order) and can change the row after the check (protect the table again: the guard then runs after the row is written)', x.tgname)
		      FROM pg_trigger x
		     WHERE x.tgrelid = t.relid AND NOT x.tgisinternal AND x.tgenabled IN ('O', 'A')
		       AND x.tgtype & 3 = 3 AND x.tgtype & 20 <> 0
		       AND x.tgname COLLATE "C" > 'pgfence_guard'
		       AND EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = t.relid AND g.tgname = 'pgfence_guard' AND g.tgtype & 2 = 2)
		) g
		WHERE c.relkind IN ('r', 'p')
		ORDER BY 1`)
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: err.Error()}
	}
	gaps, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: err.Error()}
	}
	if len(gaps) > 0 {
		return check{Name: name, Status: statusWarn, Detail: "writes can get past the guard: " + strings.Join(gaps, "; ")}
	}
	return check{Name: name, Status: statusOK, Detail: "every protected table, partition and child has its guards enabled, and no BEFORE trigger runs after the guard"}
}

// unrecordedObjects reports whether the first migration's objects exist in a
// database whose version table records none: a schema installed without
// goose's bookkeeping.
func unrecordedObjects(ctx context.Context, pool *pgxpool.Pool) bool {
	var exists bool
	err := pool.QueryRow(ctx, `SELECT to_regclass('pgfence.token_floor') IS NOT NULL`).Scan(&exists)
	return err == nil && exists
}

// roleMembers checks that applications can connect with least privilege: a
// cluster where no role is a member of pgfence_app usually means the
// applications connect as the schema owner, which may write lease and fence
// rows directly.
func roleMembers(ctx context.Context, pool *pgxpool.Pool) check {
	var app, operator int
	if err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE r.rolname = 'pgfence_app'), count(*) FILTER (WHERE r.rolname = 'pgfence_operator')
		FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid
		WHERE r.rolname IN ('pgfence_app', 'pgfence_operator')`).Scan(&app, &operator); err != nil {
		return check{Name: "roles", Status: statusFail, Detail: fmt.Sprintf("cannot read role memberships: %v", err)}
	}
	if app == 0 {
		return check{Name: "roles", Status: statusWarn, Detail: "no role is a member of pgfence_app: applications probably connect as the schema owner, which can write lease and fence rows directly; GRANT pgfence_app TO your application's login role (README, \"Security and least privilege\")"}
	}
	return check{Name: "roles", Status: statusOK, Detail: fmt.Sprintf("%d member(s) of pgfence_app, %d of pgfence_operator", app, operator)}
}

// grantPauses reports the kill switches in force (pgfence.grant_pauses): a
// forgotten pause keeps refusing grants long after its rollout.
func grantPauses(ctx context.Context, pool *pgxpool.Pool) check {
	rows, err := pool.Query(ctx, `
		SELECT format('%L by %s since %s (%s)', prefix, paused_by,
		              to_char(paused_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS"Z"'), reason)
		FROM pgfence.grant_pauses ORDER BY prefix`)
	if err != nil {
		return check{Name: "grant pauses", Status: statusFail, Detail: fmt.Sprintf("cannot read pgfence.grant_pauses: %v", err)}
	}
	pauses, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return check{Name: "grant pauses", Status: statusFail, Detail: fmt.Sprintf("cannot read pgfence.grant_pauses: %v", err)}
	}
	if len(pauses) > 0 {
		return check{Name: "grant pauses", Status: statusWarn, Detail: fmt.Sprintf(
			"new grants are paused for %d prefix(es): %s; `pgfence leases resume PREFIX` lifts a pause", len(pauses), strings.Join(pauses, "; "))}
	}
	return check{Name: "grant pauses", Status: statusOK, Detail: "no key prefix is paused"}
}

// detectPooler checks whether consecutive statements on one client connection
// reach different server backends, which is what a transaction-mode pooler
// (PgBouncer pool_mode=transaction) does.
func detectPooler(ctx context.Context, pool *pgxpool.Pool) check {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return check{Name: "pooler", Status: statusFail, Detail: err.Error()}
	}
	defer conn.Release()
	pids := map[int32]bool{}
	for range 8 {
		var pid int32
		if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return check{Name: "pooler", Status: statusFail, Detail: err.Error()}
		}
		pids[pid] = true
	}
	if len(pids) > 1 {
		return check{Name: "pooler", Status: statusWarn, Detail: fmt.Sprintf(
			"statements on one connection reached %d server backends: a transaction-mode pooler is in between; leases and fenced writes work, LISTEN wake-ups need a direct connection (or disable them: polling stays)", len(pids))}
	}
	return check{Name: "pooler", Status: statusOK, Detail: "one server backend per connection (no transaction-mode pooler detected)"}
}

// unprotectedTables lists tables that look fenced (a column named like
// "fence…" or "…fencing_token") but carry no pgfence trigger.
func unprotectedTables(ctx context.Context, pool *pgxpool.Pool) check {
	rows, err := pool.Query(ctx, `
		SELECT DISTINCT format('%I.%I', n.nspname, c.relname)
		FROM pg_attribute a
		JOIN pg_class c ON c.oid = a.attrelid AND c.relkind IN ('r', 'p')
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE a.attnum > 0 AND NOT a.attisdropped
		  AND (a.attname LIKE 'fence%' OR a.attname LIKE '%fencing_token%')
		  AND n.nspname NOT IN ('pgfence', 'pg_catalog', 'information_schema')
		  AND NOT EXISTS (
		      SELECT 1 FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
		      WHERE t.tgrelid = c.oid AND p.pronamespace = 'pgfence'::regnamespace)
		ORDER BY 1`)
	if err != nil {
		return check{Name: "protected tables", Status: statusFail, Detail: err.Error()}
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return check{Name: "protected tables", Status: statusFail, Detail: err.Error()}
		}
		names = append(names, s)
	}
	if err := rows.Err(); err != nil {
		return check{Name: "protected tables", Status: statusFail, Detail: err.Error()}
	}
	if len(names) > 0 {
		return check{Name: "protected tables", Status: statusWarn, Detail: fmt.Sprintf(
			"%s look fenced (a fence column) but have no pgfence trigger: any other write path can bypass the fence; run `pgfence protect TABLE`", strings.Join(names, ", "))}
	}
	return check{Name: "protected tables", Status: statusOK, Detail: "every table with a fence column has a pgfence trigger"}
}
