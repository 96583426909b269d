// Package pgfence makes the database that holds the data reject writes from a
// holder that lost its lock: a stale fencing token or a lost lease is refused
// atomically with the business write, by PostgreSQL itself, on every write
// path.
//
// Three forms, from the most general to the most specific:
//
//   - Fenced writes ([Write], [Exec]): the writer presents its lease's token
//     for the resource the lease's key names; pgfence.fence(resource, token)
//     accepts it iff the lease whose key is the resource issued it, it is
//     above the token floor (and at or below the retention floor only if it
//     is its key's newest), and no higher token was accepted for that
//     resource (equal tokens pass), records it and keeps the resource's fence row locked until
//     the transaction ends. The business write runs in the same transaction.
//     [Exec] sends the fence and one statement as one pipeline: one round
//     trip, one implicit transaction. [WriteToken] and [ExecToken] take a bare
//     token and the resource it is for, when the lease itself is not at hand.
//   - Versioned rows ([UpdateRow]): the application's own table carries the
//     token in a column; UPDATE … SET …, fence = $t WHERE id = $id AND fence <= $t.
//   - Lease-checked writes ([WriteLeased], [ExecLeased]): for a lease row in the
//     same database (pgfence.leases), pgfence.check_lease(key, holder, token)
//     takes FOR SHARE on the lease row and checks holder, token and expiry by
//     the database clock; a takeover waits until the write's transaction ends.
//
// [Protect] closes the other doors: a trigger on a protected table rejects any
// INSERT, UPDATE or DELETE unless the same transaction had a token accepted
// by pgfence.fence() for the resource of every row it touches, and refuses
// TRUNCATE outright,
// so psql, another service or an old binary cannot write around the fence.
//
// Every helper takes a [DB]: a *pgxpool.Pool, a *pgx.Conn, or a pgx.Tx to work
// inside the caller's transaction. The writes take a [Lease]: a
// *leases.Lease, or [LeaseOf] for a grant made through SQL.
//
// # Which token, which check
//
// Tokens count per lease key, so only tokens of one key can be compared: the
// token of lease "reports/daily" says nothing about resource
// "inventory/sku-42". [Write] and [Exec] fence the resource named by the
// lease's key, so the pairing cannot be wrong; take the lease on the name of
// the resource you write.
//
// A fenced write accepts a token until a newer token of the key has been
// accepted for the resource: a holder whose lease expired can still write
// until the next holder has written. That is the fencing-token contract, and
// all a resource outside this database can check. When the resource is in the
// same database as the lease, a lease-checked write ([WriteLeased]) refuses
// the stale holder the moment its lease is lost.
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
//   - The accepted token is never lowered or forgotten by direct DML (only an
//     operator's [LowerFence], recorded in pgfence.fence_resets, lowers it):
//     triggers on pgfence.fences reject UPDATEs that lower it, DELETE and
//     TRUNCATE (PF001). Only a row at or below a floor may go
//     ([PruneRetired]): the token floor ([RaiseTokenFloor]) refuses every
//     token at or below it, and the retention floor ([AdvanceRetention])
//     every one at or below it that a later grant of its key superseded, so
//     the only token such a row could still refuse is one that is refused
//     without it.
//   - A lease-checked write commits only if its lease was live, held by the
//     same holder with the same token, when the check ran, and no takeover can
//     commit before the write's transaction ends.
//   - On a protected table, a row write commits only in a transaction that
//     called pgfence.fence() for that row's resource (old and new row) and had
//     it accepted: the trigger checks that the fence row was last accepted by
//     the current transaction, a fence rolled back to a savepoint does not
//     count, and no session setting is consulted, so a hand-set "token" cannot
//     open the door.
//   - The fence is durable with the write: pgfence.fence() raises
//     synchronous_commit to on for its transaction when the session has off
//     or local.
//   - Tokens are failover-monotone (the timeline in the high bits), so a
//     promoted standby never issues a token at or below one the old primary
//     issued.
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
//     operation id. Never retry blindly: resolve first. The helpers whose
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
//     equivalent to presenting that token. Hence the recommended roles (see
//     the package README): business tables are owned by a migration/owner
//     role that is a member of pgfence_operator and runs [Protect]; the
//     application's login role is a member of pgfence_app and gets only
//     SELECT/INSERT/UPDATE/DELETE on the business tables. pgfence_app has no
//     write privilege on any pgfence table (pgfence.fence() and
//     pgfence.check_lease() run as their owner), so it can neither forge nor
//     lower a fence, nor remove the guard.
//   - Names of tables, schemas and columns ([Protect], [UpdateRow],
//     [MaxStoredToken]) are always quoted; names PostgreSQL or pgx would
//     change (over [MaxIdentifierLen] bytes: truncated; NUL bytes: dropped)
//     are refused by [CheckIdentifier] with [ErrInvalid], so a call never acts
//     on another object than the one named. Resources are 1 to
//     [MaxResourceLen] bytes of UTF-8 without NUL, floor reasons 1 to
//     [MaxReasonLen] characters; the SQL functions enforce the same for other
//     clients (PF008).
//
// # Observability
//
// A [Fencer] reports every write to the logger, meter and tracer providers of
// its [Config]; the package-level functions use one with the defaults (no
// logs; the global OpenTelemetry providers, no-ops until the application sets
// them). Metrics: pgfence.fence.writes and pgfence.fence.duration by
// operation and outcome (accepted, stale_token, lease_not_held,
// token_not_issued, unfenced, unknown, error); a span per write with
// resource, token and operation id (a stale token or a lost lease adds a
// pgfence.rejected event). When the context carries a valid
// span context, the trace id is stored with the accepted token
// (pgfence.fences.trace_id), so one query joins a write to the lease grant of
// the same trace.
//
// A rejected write (stale token, lease not held or token not issued) on a pool or connection is
// recorded afterwards in pgfence.fence_rejections with its trace id, best
// effort: one extra statement, only on a rejection, committed with
// synchronous_commit off and bounded by one second; a failure to record is
// logged at debug level and never changes the returned error. Inside a
// caller's [pgx.Tx] the rejection aborts or rolls back with the caller's work,
// so it is recorded only in the span, the metric and the log. [Rejections]
// lists a resource's newest rejections; rows are kept for 7 days.
package pgfence
