// Package pgfence makes the database that holds the data reject writes from a
// holder that lost its lock: a stale fencing token or a lost lease is refused
// atomically with the business write, by PostgreSQL itself, on every write
// path.
//
// Three forms, from the most general to the most specific:
//
//   - Token-guarded writes ([Write], [Exec]): the writer presents its token for
//     a resource; pgfence.fence(resource, token) accepts it iff no higher token
//     was accepted for that resource (equal tokens pass), records it and keeps
//     the resource's fence row locked until the transaction ends. The
//     business write runs in the same transaction. [Exec] sends the fence and
//     one statement as one pipeline: one round trip, one implicit transaction.
//   - Versioned rows ([UpdateRow]): the application's own table carries the
//     token in a column; UPDATE … SET …, fence = $t WHERE id = $id AND fence <= $t.
//   - Lease-checked writes ([WriteLeased], [ExecLeased]): for a lease row in the
//     same database (pgfence.leases), pgfence.check_lease(key, holder, token)
//     takes FOR SHARE on the lease row and checks holder, token and expiry by
//     the database clock; a takeover waits until the write's transaction ends.
//
// [Protect] closes the other doors: a trigger on a protected table rejects any
// INSERT, UPDATE or DELETE (and TRUNCATE) unless the same transaction had a
// token accepted by pgfence.fence() for the resource of every row it touches,
// so psql, another service or an old binary cannot write around the fence.
//
// Every helper takes a [DB]: a *pgxpool.Pool, a *pgx.Conn, or a pgx.Tx to work
// inside the caller's transaction.
//
// # SQL surface
//
// Installed by migration 00003_fence.sql (protected_tables as fixed by
// 00010_protected_tables_names.sql); any client can use it:
//
//	pgfence.fence(resource text, token bigint, op uuid DEFAULT NULL) RETURNS bigint  -- PF001 if stale
//	pgfence.check_lease(key text, holder uuid, token bigint) RETURNS void            -- PF002 if not held
//	pgfence.fence_probe(resource text) RETURNS TABLE (token bigint, writes bigint, op uuid)  -- 00009, for Resolve
//	pgfence.protect(relation regclass, resource_column text, prefix text DEFAULT '') RETURNS void
//	pgfence.unprotect(relation regclass) RETURNS boolean
//	pgfence.protected_tables() RETURNS TABLE (relation regclass, resource_column text, prefix text)
//	pgfence.max_stored_token() RETURNS bigint
//	pgfence.raise_token_floor(new_floor bigint, reason text) RETURNS bigint           -- PF009 if lower
//
// The table pgfence.fences(resource, token, accepted_at, writes, op,
// fenced_xid) holds one row per fenced resource. Migration
// 00007_fence_rejections.sql adds the audit of refused writes:
//
//	pgfence.fence_rejections(id, resource, presented_token, accepted_token, reason, lease_reason, operation, op, trace_id, at)
//	pgfence.record_fence_rejection(resource text, presented bigint, accepted bigint, reason text,
//	    lease_reason text, operation text, op uuid, trace_id text) RETURNS void
//	pgfence.prune_fence_rejections(max_age interval DEFAULT '7 days') RETURNS bigint
//
// pgfence.fence() runs one UPDATE for a resource fenced before, and an
// INSERT ... ON CONFLICT DO UPDATE ... WHERE for its first write (migration
// 00008). The fences table's rules (tokens never lowered, the trace id) are one
// plpgsql trigger without a WHEN clause and its CHECKs one plpgsql call, since
// PostgreSQL plans WHEN clauses and CHECKs again for every statement; a fenced
// write costs ~2.3× the CPU of the bare UPDATE (~2.7× before).
//
// # Guarantees
//
//   - A write guarded by token T on resource R commits only if no write with a
//     token higher than T was accepted for R before it, and after it commits no
//     write with a token lower than T is accepted for R: the fence row is
//     locked from the check until the commit, and the check runs on the newest
//     committed row (UPDATE … WHERE token <= $t under READ COMMITTED waits for
//     a concurrent writer and re-checks its committed version; a new resource
//     goes through INSERT … ON CONFLICT DO UPDATE … WHERE token <= $t, whose
//     WHERE runs on the newest version after the row lock). Accepted tokens
//     per resource never decrease, in commit order.
//   - The accepted token is never lowered or forgotten, even by direct DML:
//     triggers on pgfence.fences reject UPDATEs that lower it, DELETE and
//     TRUNCATE (PF001).
//   - A lease-checked write commits only if its lease was live, held by the
//     same holder with the same token, when the check ran, and no takeover can
//     commit before the write's transaction ends.
//   - On a protected table, a row write commits only in a transaction that
//     called pgfence.fence() for that row's resource (old and new row) and had
//     it accepted: the trigger checks that the fence row was last accepted by
//     the current transaction (fenced_xid = pg_current_xact_id()), a fence
//     rolled back to a savepoint does not count, and no session setting is
//     consulted, so a hand-set "token" cannot open the door.
//   - The fence is durable with the write: pgfence.fence() raises
//     synchronous_commit to on for its transaction when the session has off
//     or local.
//   - Tokens drawn with pgfence.next_token are failover-monotone (timeline in
//     the high bits), so a promoted standby never issues a token at or below
//     one the old primary issued; see the failover tests.
//
// Rejections are our own SQLSTATEs, mapped to sentinels for Go callers (use
// [MapError] on errors of statements you run yourself):
// PF001 → *[StaleTokenError] ([ErrStaleToken]), PF002 → *[LeaseNotHeldError]
// ([ErrLeaseNotHeld]), PF006 → [ErrUnfencedWrite], PF009 → [ErrFloorLowered].
//
// # Failure handling
//
//   - A rejection, a failing statement or an error returned by the caller's
//     function rolls the whole transaction back (on a pgx.Tx, [Write] and
//     [WriteLeased] roll back their savepoint only): nothing is accepted.
//   - A connection lost after COMMIT was sent returns an
//     *[OutcomeUnknownError] (errors.Is [ErrOutcomeUnknown]); lease-checked
//     writes ([WriteLeased], [ExecLeased]) record no operation id and return
//     a plain [ErrOutcomeUnknown]: re-read what they wrote. [Resolve] waits
//     for any transaction still holding the fence row and answers [Applied],
//     [NotApplied] or [Superseded] from the accepted token and the write's
//     operation id. It cannot see a write still queued for that row lock in
//     a session the server has not yet noticed is gone: resolve once that
//     session has ended (lock_timeout, tcp_keepalives_*,
//     client_connection_check_interval bound it). Never retry blindly:
//     resolve first. The helpers whose
//     one statement commits on its own ([UpdateRow], [RaiseTokenFloor],
//     [Protect], [Unprotect]) return an error wrapping [ErrOutcomeUnknown]
//     when the connection is lost after sending it: re-read the row, the
//     floor or [Protected] before trying again.
//   - Errors before anything was sent are [ErrUnavailable]; a standby answers
//     [ErrNotPrimary]; lock_timeout and statement_timeout map to
//     [ErrLockTimeout] and [ErrStatementTimeout]. Under REPEATABLE READ or
//     SERIALIZABLE a concurrent fence fails with [ErrIsolation]: use READ
//     COMMITTED.
//   - Limits: the table's owner and a superuser can disable triggers (ALTER
//     TABLE … DISABLE TRIGGER, session_replication_role = replica) or drop
//     them; direct DML on pgfence.fences that keeps the current token is
//     equivalent to presenting that token. Hence the recommended setup
//     (migration 00009, README "Security and least privilege"): business
//     tables are owned by a migration/owner role that is a member of
//     pgfence_operator and runs [Protect]; the application's login role is a
//     member of pgfence_app and gets only SELECT/INSERT/UPDATE/DELETE on the
//     business tables. pgfence_app has no write privilege on any pgfence
//     table (pgfence.fence() and pgfence.check_lease() run as their owner), so
//     it can neither forge nor lower a fence, nor remove the guard.
//     pgfence.protect and pgfence.unprotect run with the caller's rights:
//     CREATE/DROP TRIGGER require the caller to own the table. A
//     lease-checked write's lease can expire between the check and COMMIT,
//     but no takeover can interleave.
//   - Names of tables, schemas and columns ([Protect], [UpdateRow],
//     [MaxStoredToken]) are always quoted; names PostgreSQL or pgx would
//     change (over [MaxIdentifierLen] bytes: truncated; NUL bytes: dropped)
//     are refused by [CheckIdentifier] with [ErrInvalid], so a call never acts
//     on another object than the one named. Resources are 1 to
//     [MaxResourceLen] bytes of UTF-8 without NUL, floor reasons 1 to
//     [MaxReasonLen] characters; pgfence.fence and pgfence.raise_token_floor
//     enforce the same for other clients (PF008).
//   - Cost: [Exec] is one round trip and one commit, like the unfenced
//     statement; the protection trigger adds one plpgsql call and one
//     primary-key lookup per row written (see the benchmarks).
//
// # Observability
//
// The helpers use the global OpenTelemetry providers (otel.GetMeterProvider,
// otel.GetTracerProvider), no-ops until the application sets them:
// pgfence.fence.writes and pgfence.fence.duration by operation and outcome
// (accepted, stale_token, lease_not_held, unfenced, unknown, error),
// and a span per write with resource, token and operation id (a rejection adds
// a pgfence.rejected event). When the context carries a valid span context,
// the trace id is stored with the accepted token (pgfence.fences.trace_id),
// so one query joins a write to the lease grant of the same trace.
//
// A rejected write (stale token or lease not held) on a pool or connection is
// recorded afterwards in pgfence.fence_rejections with its trace id, best
// effort: one extra statement, only on a rejection, committed with
// synchronous_commit off and bounded by one second; a failure to record is
// logged at debug level and never changes the returned error. Inside a
// caller's [pgx.Tx] the rejection aborts or rolls back with the caller's work,
// so it is recorded only in the span, the metric and the log. [Rejections]
// lists a resource's newest rejections; rows are kept for 7 days.
//
// Logs: the package has no configuration and keeps no logger; a logger placed
// in the context with [ContextWithLogger] gets one event per write: accepted
// at debug, rejected at info, outcome unknown at warn, other failures at
// debug. Without it the package logs nothing.
package pgfence
