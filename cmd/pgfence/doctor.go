package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/migrations"
)

// check is one doctor finding, as `doctor --json` prints it.
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

// doctorJSON is what `doctor --json` prints.
type doctorJSON struct {
	Checks []check `json:"checks"`
	Failed int     `json:"failed"` // how many have status fail
}

func doctor(*flag.FlagSet) runFunc {
	return func(ctx context.Context, in *input) error {
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		out := doctorJSON{Checks: diagnose(ctx, pool)}
		for _, c := range out.Checks {
			if c.Status == statusFail {
				out.Failed++
			}
		}
		if err := in.print(out, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL")
			for _, c := range out.Checks {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Status, c.Detail)
			}
			tw.Flush()
		}); err != nil {
			return err
		}
		if out.Failed > 0 {
			return &cliError{msg: fmt.Sprintf("doctor: %d check(s) failed", out.Failed), hint: "see the DETAIL column of the failed checks", code: exitFailure}
		}
		return nil
	}
}

// The doctor's own statements read the server's catalog and settings. Each
// names its functions, operators, types and collations with their schema,
// so a session's search_path cannot change what they check; pgfence's own
// state comes from the libraries.
const (
	// sqlServer: the version, whether the server is a standby, and its
	// timeline: on a primary the one its WAL is written on (the high bits of
	// the tokens it issues, as pgfence.token_epoch() reads it); on a standby
	// the one its WAL receiver streams (visible to superusers and
	// pg_read_all_stats only), else that of its last restartpoint, with the
	// upstream it streams from.
	sqlServer = `SELECT pg_catalog.current_setting('server_version'), pg_catalog.pg_is_in_recovery(),
       CASE WHEN pg_catalog.pg_is_in_recovery() THEN
            coalesce((SELECT r.received_tli::pg_catalog.int8 FROM pg_catalog.pg_stat_wal_receiver r),
                     (SELECT c.timeline_id::pg_catalog.int8 FROM pg_catalog.pg_control_checkpoint() c))
       ELSE pg_catalog.concat('x', pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8
       END,
       (SELECT pg_catalog.concat(r.sender_host, ':', r.sender_port) FROM pg_catalog.pg_stat_wal_receiver r WHERE r.sender_host IS NOT NULL)`
	sqlDurability = `SELECT pg_catalog.current_setting('synchronous_commit'), pg_catalog.current_setting('synchronous_standby_names'),
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication),
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication
         WHERE sync_state OPERATOR(pg_catalog.=) ANY ('{sync,quorum}'::pg_catalog.text[]))`
	sqlTimeouts       = `SELECT pg_catalog.current_setting('idle_in_transaction_session_timeout'), pg_catalog.current_setting('lock_timeout')`
	sqlUnrecordedObjs = `SELECT pg_catalog.to_regclass('pgfence.token_floor') IS NOT NULL`
	sqlRoleMembers    = `SELECT pg_catalog.count(*) FILTER (WHERE r.rolname OPERATOR(pg_catalog.=) 'pgfence_app'),
       pg_catalog.count(*) FILTER (WHERE r.rolname OPERATOR(pg_catalog.=) 'pgfence_operator')
  FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) m.roleid
 WHERE r.rolname OPERATOR(pg_catalog.=) ANY ('{pgfence_app,pgfence_operator}'::pg_catalog.name[])`
	// sqlUnprotectedTables lists tables that look fenced (a column named like
	// "fence…" or "…fencing_token…") but carry no pgfence trigger.
	sqlUnprotectedTables = `SELECT DISTINCT pg_catalog.format('%I.%I', n.nspname, c.relname)
  FROM pg_catalog.pg_attribute a
  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) a.attrelid
   AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p}'::pg_catalog."char"[])
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
   AND (a.attname OPERATOR(pg_catalog.~~) 'fence%' OR a.attname OPERATOR(pg_catalog.~~) '%fencing_token%')
   AND n.nspname OPERATOR(pg_catalog.<>) ALL ('{pgfence,pg_catalog,information_schema}'::pg_catalog.name[])
   AND NOT EXISTS (
       SELECT 1 FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) t.tgfoid
        WHERE t.tgrelid OPERATOR(pg_catalog.=) c.oid AND p.pronamespace OPERATOR(pg_catalog.=) 'pgfence'::pg_catalog.regnamespace)
 ORDER BY 1`
	// sqlUnstableResourceColumns lists protected tables whose resource
	// column protect() refuses now, as it did not always: a type other than
	// text, varchar, smallint, integer, bigint or uuid (or a domain over
	// one), whose text has padding (char(n)), keeps a scale (numeric) or
	// depends on session settings (timestamptz, float, interval); or a
	// nondeterministic collation, under which equal keys have several
	// texts.
	sqlUnstableResourceColumns = `SELECT pg_catalog.format('%s.%I (%s%s)', p.relation, p.resource_column, pg_catalog.format_type(a.atttypid, a.atttypmod),
       CASE WHEN NOT co.collisdeterministic THEN pg_catalog.format(' COLLATE %I.%I, nondeterministic', cn.nspname, co.collname) ELSE '' END)
  FROM pgfence.protected_tables() p
  JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) p.relation
   AND a.attname OPERATOR(pg_catalog.=) p.resource_column AND NOT a.attisdropped
  JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
  LEFT JOIN pg_catalog.pg_collation co ON co.oid OPERATOR(pg_catalog.=) a.attcollation
  LEFT JOIN pg_catalog.pg_namespace cn ON cn.oid OPERATOR(pg_catalog.=) co.collnamespace
 WHERE (CASE WHEN t.typtype OPERATOR(pg_catalog.=) 'd' THEN t.typbasetype ELSE t.oid END)
       OPERATOR(pg_catalog.<>) ALL ('{pg_catalog.text,pg_catalog.varchar,pg_catalog.int2,pg_catalog.int4,pg_catalog.int8,pg_catalog.uuid}'::pg_catalog.regtype[]::pg_catalog.oid[])
    OR NOT co.collisdeterministic
 ORDER BY 1`
	// sqlPrefixOverlaps lists pairs of prefix grants of different roles
	// where one prefix starts the other ('stock' and 'stock:'): both roles
	// may use the names under the longer one. Each pair once, the shorter
	// prefix (or, for equal ones, the lower role name) first.
	sqlPrefixOverlaps = `SELECT pg_catalog.format('%s %L and %s %L share the names under %L', a.grantee, a.prefix, b.grantee, b.prefix, b.prefix)
  FROM pgfence.prefix_grants a JOIN pgfence.prefix_grants b
    ON a.grantee OPERATOR(pg_catalog.<>) b.grantee
   AND pg_catalog.starts_with(b.prefix, a.prefix)
   AND (pg_catalog.octet_length(a.prefix) OPERATOR(pg_catalog.<) pg_catalog.octet_length(b.prefix)
        OR a.grantee::pg_catalog.text OPERATOR(pg_catalog.<) b.grantee::pg_catalog.text)
 ORDER BY 1`
	// sqlGuardGaps: see guardGaps. tgtype bits: 1 row, 2 before, 4 insert,
	// 16 update.
	sqlGuardGaps = `WITH RECURSIVE tree(relid) AS (
    SELECT p.relation::pg_catalog.oid FROM pgfence.protected_tables() p
    UNION
    SELECT i.inhrelid FROM tree t JOIN pg_catalog.pg_inherits i ON i.inhparent OPERATOR(pg_catalog.=) t.relid
)
SELECT pg_catalog.format('%s: %s', t.relid::pg_catalog.regclass, g.problem)
  FROM tree t
  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.relid
 CROSS JOIN LATERAL (
    SELECT 'has no pgfence_guard trigger, so rows written through it are not checked (run protect again on the protected table it belongs to)' AS problem
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger x
                        WHERE x.tgrelid OPERATOR(pg_catalog.=) t.relid AND x.tgname OPERATOR(pg_catalog.=) 'pgfence_guard')
    UNION ALL
    SELECT 'its pgfence_guard trigger is disabled or fires for replicas only (ALTER TABLE ... ENABLE TRIGGER pgfence_guard)'
     WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_trigger x
                    WHERE x.tgrelid OPERATOR(pg_catalog.=) t.relid AND x.tgname OPERATOR(pg_catalog.=) 'pgfence_guard'
                      AND x.tgenabled OPERATOR(pg_catalog.<>) ALL ('{O,A}'::pg_catalog."char"[]))
    UNION ALL
    SELECT 'TRUNCATE is not refused (run protect again on the protected table it belongs to)'
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger x
                        WHERE x.tgrelid OPERATOR(pg_catalog.=) t.relid AND x.tgname OPERATOR(pg_catalog.=) 'pgfence_guard_truncate'
                          AND x.tgenabled OPERATOR(pg_catalog.=) ANY ('{O,A}'::pg_catalog."char"[]))
    UNION ALL
    SELECT pg_catalog.format('BEFORE trigger %I fires after its BEFORE guard (name order) and can change the row after the check (protect the table again: the guard then runs after the row is written)', x.tgname)
      FROM pg_catalog.pg_trigger x
     WHERE x.tgrelid OPERATOR(pg_catalog.=) t.relid AND NOT x.tgisinternal
       AND x.tgenabled OPERATOR(pg_catalog.=) ANY ('{O,A}'::pg_catalog."char"[])
       AND (x.tgtype OPERATOR(pg_catalog.&) 3) OPERATOR(pg_catalog.=) 3
       AND (x.tgtype OPERATOR(pg_catalog.&) 20) OPERATOR(pg_catalog.<>) 0
       AND x.tgname COLLATE pg_catalog."C" OPERATOR(pg_catalog.>) 'pgfence_guard'
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g
                    WHERE g.tgrelid OPERATOR(pg_catalog.=) t.relid AND g.tgname OPERATOR(pg_catalog.=) 'pgfence_guard'
                      AND (g.tgtype OPERATOR(pg_catalog.&) 2) OPERATOR(pg_catalog.=) 2)
 ) g
 WHERE c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p}'::pg_catalog."char"[])
UNION ALL
SELECT 'the event trigger pgfence_guard_new_tables is missing or disabled, so a partition or child added to a protected table later is not guarded when it is created (migrate as a superuser to install it, or protect the table again after adding one)'
 WHERE EXISTS (SELECT 1 FROM pgfence.protected_tables())
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e
                    WHERE e.evtname OPERATOR(pg_catalog.=) 'pgfence_guard_new_tables'
                      AND e.evtenabled OPERATOR(pg_catalog.<>) 'D')
 ORDER BY 1`
)

// diagnose runs every check against a live database. A check that cannot run
// reports fail with the reason instead of aborting the others.
func diagnose(ctx context.Context, pool *pgxpool.Pool) []check {
	var out []check
	add := func(name, status, format string, args ...any) {
		out = append(out, check{Name: name, Status: status, Detail: fmt.Sprintf(format, args...)})
	}

	var version string
	var inRecovery bool
	var timeline *int64
	var upstream *string
	if err := pool.QueryRow(ctx, sqlServer).Scan(&version, &inRecovery, &timeline, &upstream); err != nil {
		add("server", statusFail, "cannot query the server: %v", err)
		return out
	}
	where := ""
	if timeline != nil {
		where = fmt.Sprintf(" on timeline %d", *timeline)
	}
	if inRecovery {
		if upstream != nil {
			where += ", streaming from " + *upstream
		}
		add("server", statusFail, "PostgreSQL %s is a standby (in recovery)%s: pgfence issues tokens only on the primary; connect with target_session_attrs=read-write", version, where)
	} else {
		tokens := ""
		if timeline != nil {
			tokens = fmt.Sprintf(" (the tokens it issues are above %d << 40)", *timeline)
		}
		add("server", statusOK, "PostgreSQL %s, primary%s%s", version, where, tokens)
	}

	schema := schemaCheck(ctx, pool)
	out = append(out, schema)

	var syncCommit, syncStandbys string
	var replicas, syncReplicas int
	if err := pool.QueryRow(ctx, sqlDurability).Scan(&syncCommit, &syncStandbys, &replicas, &syncReplicas); err != nil {
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
	if err := pool.QueryRow(ctx, sqlTimeouts).Scan(&idleTimeout, &lockTimeout); err == nil {
		if idleTimeout == "0" {
			add("idle_in_transaction_session_timeout", statusWarn, "not set for this role: a paused holder with an open transaction can block a takeover indefinitely; e.g. ALTER ROLE CURRENT_USER SET idle_in_transaction_session_timeout = '30s'")
		} else {
			add("idle_in_transaction_session_timeout", statusOK, "%s", idleTimeout)
		}
	}

	pctx, cancel := context.WithTimeout(ctx, poolerProbeTimeout)
	out = append(out, poolerCheck(pctx, pool))
	cancel()

	// Before the schema's own checks: a lock left behind is what makes
	// `migrate up` wait, whatever version is installed.
	out = append(out, migrationLock(ctx, pool))

	if schema.Status == statusOK {
		client, err := leases.New(pool, &leases.Config{DisableWakeups: true})
		if err != nil {
			add("leases", statusFail, "%v", err)
			return out
		}
		defer client.Close()
		out = append(out, leaseCounts(ctx, client))
		out = append(out, roleMembers(ctx, pool))
		out = append(out, trustChecks(ctx, pool)...)
		out = append(out, grantPauses(ctx, client))
		out = append(out, prefixOverlaps(ctx, pool))
		out = append(out, unprotectedTables(ctx, pool))
		out = append(out, unstableResourceColumns(ctx, pool))
		out = append(out, guardGaps(ctx, pool))
		if c, ok := taskBacklog(ctx, pool); ok {
			out = append(out, c)
		}
		out = append(out, maintenanceCheck(ctx, pool))
	}
	return out
}

// schemaCheck compares the installed schema version with this binary's.
func schemaCheck(ctx context.Context, pool *pgxpool.Pool) check {
	const name = "schema"
	m, err := migrations.New(pool, nil)
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: err.Error()}
	}
	defer m.Close()
	current, latest, err := m.Version(ctx)
	switch {
	case err != nil:
		return check{Name: name, Status: statusFail, Detail: err.Error()}
	case current == 0 && unrecordedObjects(ctx, pool):
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("pgfence objects exist but %s records no migration (installed by a script from an older `pgfence migrate sql`?), so `pgfence migrate up` would fail on them; record each version that script installed (INSERT INTO %s (version_id, is_applied) VALUES (N, true)), then run `pgfence migrate up`", migrations.VersionTable, migrations.VersionTable)}
	case current == 0:
		return check{Name: name, Status: statusFail, Detail: "the pgfence schema is not installed; run `pgfence migrate up`"}
	case current < latest:
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("schema version %d, this binary expects %d; run `pgfence migrate up`", current, latest)}
	}
	return check{Name: name, Status: statusOK, Detail: fmt.Sprintf("schema version %d (latest)", current)}
}

// leaseCounts warns about grants past their expiry and never released.
func leaseCounts(ctx context.Context, client *leases.Client) check {
	n, err := client.Count(ctx)
	switch {
	case err != nil:
		return check{Name: "leases", Status: statusFail, Detail: fmt.Sprintf("cannot count the leases: %v", err)}
	case n.Expired > 0:
		return check{Name: "leases", Status: statusWarn, Detail: fmt.Sprintf("%d live, %d past expiry and never released (their holders died or lost the database; the next acquire takes them over)", n.Live, n.Expired)}
	}
	return check{Name: "leases", Status: statusOK, Detail: fmt.Sprintf("%d live, none past expiry", n.Live)}
}

// grantPauses reports the kill switches in force: a forgotten pause keeps
// refusing grants long after its rollout.
func grantPauses(ctx context.Context, client *leases.Client) check {
	const name = "grant pauses"
	pauses, err := client.Pauses(ctx)
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("cannot read the paused prefixes: %v", err)}
	}
	if len(pauses) == 0 {
		return check{Name: name, Status: statusOK, Detail: "no key prefix is paused"}
	}
	var list []string
	for _, p := range pauses {
		list = append(list, fmt.Sprintf("'%s' by %s since %s (%s)", strings.ReplaceAll(p.Prefix, "'", "''"), p.PausedBy,
			p.PausedAt.UTC().Format("2006-01-02 15:04:05Z"), p.Reason))
	}
	return check{Name: name, Status: statusWarn, Detail: fmt.Sprintf(
		"new grants are paused for %d prefix(es): %s; `pgfence leases resume PREFIX` lifts a pause", len(pauses), strings.Join(list, "; "))}
}

// prefixOverlaps lists the prefix grants of two roles where one prefix
// starts the other: grant_prefix warns when it grants one, and this finds
// those granted before, or whose warning went unread. A service that holds a
// sub-prefix of another's on purpose may keep it.
func prefixOverlaps(ctx context.Context, pool *pgxpool.Pool) check {
	const name = "prefix grants"
	pairs, err := catalogList(ctx, pool, sqlPrefixOverlaps)
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("cannot read the prefix grants (pgfence_operator members and the schema's owner can): %v", err)}
	}
	if len(pairs) > 0 {
		return check{Name: name, Status: statusWarn, Detail: fmt.Sprintf(
			"prefixes of different roles overlap: %s; unless the names are meant to be shared, revoke one (SELECT pgfence.revoke_prefix(role, prefix)) and grant prefixes that end with a separator and do not start one another", strings.Join(pairs, "; "))}
	}
	return check{Name: name, Status: statusOK, Detail: "no role's prefix starts another role's"}
}

// unrecordedObjects reports whether the first migration's objects exist in a
// database whose version table records none: a schema installed without
// goose's bookkeeping.
func unrecordedObjects(ctx context.Context, pool *pgxpool.Pool) bool {
	var exists bool
	err := pool.QueryRow(ctx, sqlUnrecordedObjs).Scan(&exists)
	return err == nil && exists
}

// roleMembers checks that applications can connect with least privilege: a
// cluster where no role is a member of pgfence_app usually means the
// applications connect as the schema owner, which may write lease and fence
// rows directly.
func roleMembers(ctx context.Context, pool *pgxpool.Pool) check {
	var app, operator int
	if err := pool.QueryRow(ctx, sqlRoleMembers).Scan(&app, &operator); err != nil {
		return check{Name: "roles", Status: statusFail, Detail: fmt.Sprintf("cannot read role memberships: %v", err)}
	}
	if app == 0 {
		return check{Name: "roles", Status: statusWarn, Detail: "no role is a member of pgfence_app: applications probably connect as the schema owner, which can write lease and fence rows directly; GRANT pgfence_app TO your application's login role (pgfence/README.md, \"Roles and the threat model\")"}
	}
	return check{Name: "roles", Status: statusOK, Detail: fmt.Sprintf("%d member(s) of pgfence_app, %d of pgfence_operator", app, operator)}
}

// catalogList runs a catalog query that returns one text per finding.
func catalogList(ctx context.Context, pool *pgxpool.Pool, sql string) ([]string, error) {
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// unprotectedTables lists tables that look fenced (a column named like
// "fence…" or "…fencing_token…") but carry no pgfence trigger.
func unprotectedTables(ctx context.Context, pool *pgxpool.Pool) check {
	const name = "protected tables"
	names, err := catalogList(ctx, pool, sqlUnprotectedTables)
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: err.Error()}
	}
	if len(names) > 0 {
		return check{Name: name, Status: statusWarn, Detail: fmt.Sprintf(
			"%s look fenced (a fence column) but have no pgfence trigger: any other write path can bypass the fence; run `pgfence tables protect TABLE --resource-column COLUMN`", strings.Join(names, ", "))}
	}
	return check{Name: name, Status: statusOK, Detail: "every table with a fence column has a pgfence trigger"}
}

// unstableResourceColumns lists protected tables whose resource column
// protect() refuses now: protected before it did, one row may be several
// resources. The guard names a row's resource by the column's text: a
// char(n) pads it, a numeric keeps its scale (1 and 1.00), a nondeterministic
// collation makes 'ALICE' and 'Alice' one key of two texts, and a
// timestamptz, float or interval prints by the writer's TimeZone,
// extra_float_digits or IntervalStyle.
func unstableResourceColumns(ctx context.Context, pool *pgxpool.Pool) check {
	const name = "protected resource columns"
	cols, err := catalogList(ctx, pool, sqlUnstableResourceColumns)
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: err.Error()}
	}
	if len(cols) > 0 {
		return check{Name: name, Status: statusWarn, Detail: fmt.Sprintf(
			"%s: protect refuses such a resource column now. The resource is the column's text: char(n) pads it, numeric keeps its scale, a nondeterministic collation gives equal keys several texts, and timestamptz, float or interval print by the writer's session settings; so one row can be several resources, fenced apart. Protect the table on a text (deterministic collation), integer or uuid key column instead (`pgfence tables unprotect`, then `tables protect`)", strings.Join(cols, ", "))}
	}
	return check{Name: name, Status: statusOK, Detail: "every protected table's resource column has one text per key, in every session"}
}

// guardGaps lists the ways rows of a protected table can be written past
// its guard, which pgfence.protected_tables() alone does not show: a guard
// disabled (or set to fire for replicas only), a partition or inheritance
// child without the guard or without the TRUNCATE guard (protect() covers
// those that exist when it runs, the event trigger pgfence_guard_new_tables
// those added later; without it, one attached or created later gets only the
// row guard PostgreSQL clones to a partition), the event trigger missing or
// disabled, and, where the guard is a
// BEFORE trigger (tables protected before the guard became an AFTER
// trigger), a BEFORE row trigger that fires after it (triggers fire in name
// order) and so can change the row, and its resource, after the check.
func guardGaps(ctx context.Context, pool *pgxpool.Pool) check {
	const name = "protected table guards"
	gaps, err := catalogList(ctx, pool, sqlGuardGaps)
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: err.Error()}
	}
	if len(gaps) > 0 {
		return check{Name: name, Status: statusWarn, Detail: "writes can get past the guard: " + strings.Join(gaps, "; ")}
	}
	return check{Name: name, Status: statusOK, Detail: "every protected table, partition and child has its guards enabled, and no BEFORE trigger runs after the guard"}
}
