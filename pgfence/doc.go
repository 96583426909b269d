// Package pgfence makes the database that holds the data reject writes from a
// holder that lost its lock: a stale fencing token or a lost lease is refused
// atomically with the business write, by PostgreSQL itself, on every write
// path.
//
// Which write to use, one line per need (each takes a [Lease]: a
// *leases.Lease, or [LeaseOf] for a grant made through SQL or received from
// another process):
//
//   - Several statements, or Go code between them, fenced by the lease's
//     token: [Write](ctx, db, lease, fn). fn runs in the transaction after the
//     fence; read the resource there.
//   - One statement fenced by the lease's token, in one round trip:
//     [Exec](ctx, db, lease, sql, args...). It returns the rows the statement
//     affected.
//   - Refuse the holder the moment its lease is lost, not only once a newer
//     holder has written (the lease row is in the same database): pass
//     [Checked](lease) to [Write] or [Exec].
//   - A bare token, without its lease: [LeaseOf](resource, "", token), the
//     resource being the key of the lease that issued the token.
//   - database/sql (lib/pq, pgx's stdlib driver, sqlx, sqlc, GORM, bun):
//     [WriteSQL], [ExecSQL] and [ResolveSQL], the same writes on a *sql.DB, a
//     *sql.Conn or the caller's *sql.Tx.
//
// What they do:
//
//   - Fenced writes ([Write], [Exec]): the writer presents its lease's token
//     for the resource the lease's key names; pgfence.fence(resource, token)
//     accepts it iff the lease whose key is the resource issued it, it is
//     above the token floor (and at or below the retention floor only if it
//     is its key's newest), and no higher token was accepted for that
//     resource (equal tokens pass), records it and keeps the resource's fence
//     row locked until the transaction ends. The business write runs in the
//     same transaction. [Exec] sends the fence and one statement as one
//     pipeline: one round trip, one implicit transaction.
//   - Lease-checked writes ([Checked]): for a lease row in the same database
//     (pgfence.leases), pgfence.check_lease(key, holder, token) takes FOR
//     SHARE on the lease row and checks holder, token and expiry by the
//     database clock; a takeover waits until the write's transaction ends.
//   - Versioned rows, a SQL pattern rather than a helper: the application's
//     own table carries the token in a column and one statement compares it,
//     UPDATE … SET …, fence = $t WHERE id = $id AND (fence IS NULL OR fence
//     <= $t); no row affected means refused (the package README has the
//     pattern). No fence row is written, so [Protect] and [Resolve] do not
//     apply to it.
//
// [Protect] closes the other doors: a trigger on a protected table rejects any
// INSERT, UPDATE or DELETE unless the same transaction had a token accepted
// by pgfence.fence() for the resource of every row it touches, and refuses
// TRUNCATE outright,
// so psql, another service or an old binary cannot write around the fence.
//
// Every helper takes a [DB]: a *pgxpool.Pool, a *pgx.Conn, or a pgx.Tx to work
// inside the caller's transaction; the database/sql ones an [SQLDB].
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
// same database as the lease, a lease-checked write ([Checked]) refuses the
// stale holder the moment its lease is lost.
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
//     operator's pgfence.lower_fence, recorded in pgfence.fence_resets, lowers it):
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
// PF001 → *[StaleTokenError] ([ErrStaleToken]), PF002 → *[LeaseLostError]
// ([ErrLeaseLost]), PF012 → *[TokenNotIssuedError] ([ErrTokenNotIssued]),
// PF006 → [ErrUnfencedWrite], PF009 → [ErrFloorLowered]. The sentinels are
// the errors of every pgfence package: errors.Is matches them whichever
// package returned the error, and the typed errors unwrap to them.
//
// # Failure handling
//
//   - A rejection, a failing statement or an error returned by the caller's
//     function rolls the whole transaction back (on a pgx.Tx or a *sql.Tx,
//     [Write] and [WriteSQL] roll back their savepoint only): nothing is
//     accepted. fn's own error is returned unchanged; an error of its
//     statements is mapped as [MapError] does.
//   - A connection lost after COMMIT was sent returns an
//     *[OutcomeUnknownError] (errors.Is [ErrOutcomeUnknown]); lease-checked
//     writes record no operation id and return a plain [ErrOutcomeUnknown]:
//     re-read what they wrote. [Resolve] waits for any transaction still
//     holding the fence row and answers [Applied], [NotApplied] or
//     [Superseded] from the accepted token and the write's operation id.
//     Never retry blindly: resolve first. The helpers whose one statement
//     commits on its own ([RaiseTokenFloor], [Protect], [Unprotect]) return
//     an error wrapping [ErrOutcomeUnknown] when the connection is lost after
//     sending it: re-read the floor or [Protected] before trying again.
//   - fn must leave COMMIT and ROLLBACK to the helper. When it ends the
//     transaction itself (through the driver's API, or as SQL), the helper
//     cannot know what committed: its error wraps [ErrInvalid], and
//     [ErrOutcomeUnknown] too when what fn ended may have committed (the
//     helper's own transaction, or the caller's whole one); where the
//     driver cannot tell why its COMMIT failed (lib/pq), only the latter.
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
//   - Names of tables, schemas and columns ([Protect], [Unprotect],
//     [MaxStoredToken]) are always quoted; names PostgreSQL or pgx would
//     change (over [MaxIdentifierLen] bytes: truncated; NUL bytes: dropped)
//     are refused by [CheckIdentifier] with [ErrInvalid], so a call never acts
//     on another object than the one named. Resources are 1 to
//     [MaxResourceLen] bytes of UTF-8 without NUL, floor reasons 1 to
//     [MaxReasonLen] characters; the SQL functions enforce the same for other
//     clients (PF008).
//
// # database/sql
//
// [WriteSQL], [ExecSQL] and [ResolveSQL] are [Write], [Exec] and [Resolve] on
// database/sql: the same code behind another driver interface, with the same
// guarantees, errors, recorded rejections and telemetry, whatever the driver.
//
//	tx, err := db.BeginTx(ctx, nil) // your transaction (sqlx: tx.Tx; GORM: tx.Statement.ConnPool.(*sql.Tx))
//	...
//	_, err = pgfence.WriteSQL(ctx, tx, lease, func(ctx context.Context, tx *sql.Tx) error {
//		// read and write the resource here, after the fence
//		_, err := tx.ExecContext(ctx, `UPDATE stock SET qty = qty - $1 WHERE sku = $2`, n, sku)
//		return err
//	})
//	if errors.Is(err, pgfence.ErrStaleToken) { ... } // another holder wrote since: nothing of fn remains
//	...
//	err = tx.Commit()
//
// In detail:
//
//   - On a *sql.Tx, [WriteSQL] runs in a savepoint of it and gives fn that
//     same *sql.Tx; [ExecSQL] joins it, so a rejection aborts it. An ORM's
//     transaction is passed as the *sql.Tx it wraps; db must be a *sql.DB (or
//     a type that embeds one, such as *sqlx.DB), a *sql.Conn or a *sql.Tx,
//     any other type is refused with [ErrInvalid].
//   - SQLSTATE and DETAIL are read from pgx's *pgconn.PgError and lib/pq's
//     *pq.Error alike. A COMMIT that fails without an answer is an unknown
//     outcome, database/sql's driver.ErrBadConn included (lib/pq returns it
//     for a connection that broke after the COMMIT was sent). A closed
//     *sql.DB or *sql.Conn, a *sql.Tx already ended or aborted, or an
//     argument the driver cannot send returns that error and writes nothing;
//     an error that carries no SQLSTATE (another database's driver) is
//     returned unchanged.
//   - Costs: [ExecSQL] with pgx's stdlib driver on a *sql.DB or a *sql.Conn
//     is one pipeline, as [Exec] (through [sql.Conn.Raw]). lib/pq cannot
//     pipeline: [ExecSQL] runs BEGIN, the fence, the statement and COMMIT.
//   - Behind PgBouncer in transaction mode give lib/pq binary_parameters=yes
//     and pgx's stdlib driver default_query_exec_mode=exec in the URL.
//   - Leases stay with package leases, which runs on pgx (it must know
//     whether a statement was sent at all, which database/sql cannot tell,
//     and its wake-ups need a connection that LISTENs): open a pgx pool on
//     the same DSN (with pgx's driver, one pool serves both:
//     stdlib.OpenDBFromPool) and pass its *leases.Lease. Without it, grant
//     through SQL in autocommit (pgfence.try_acquire) and wrap the grant with
//     [LeaseOf].
//
// Runnable examples with GORM, sqlc-style code and sqlx are in the
// repository's nested module examples/orm.
//
// # Observability
//
// The writes report, as instrumentation scope github.com/pgfence/pgfence/pgfence,
// to the global OpenTelemetry providers
// (otel.SetMeterProvider, otel.SetTracerProvider), which are no-ops until
// the application sets them; their instruments are made once, and follow the
// first providers the application sets. They log nothing. Metrics:
// pgfence.fence.operations and pgfence.fence.duration by operation (write, exec,
// write_leased, exec_leased) and outcome (accepted, stale_token,
// lease_not_held, token_not_issued, unfenced, unknown, error); a span
// pgfence.fence.<operation> per write with the resource, token and operation
// id (a lease-checked write: its holder), and its outcome. When the context
// carries a valid span context, the trace id is stored with the accepted
// token (pgfence.fences.trace_id), so one query joins a write to the lease
// grant of the same trace.
//
// A rejected write (stale token, lease not held or token not issued) on a pool or connection is
// recorded afterwards in pgfence.fence_rejections with its trace id, best
// effort: one extra statement, only on a rejection, committed with
// synchronous_commit off and bounded by one second; a failure to record
// never changes the returned error. Inside a caller's transaction the
// rejection aborts or rolls back with the caller's work, so it is recorded
// only in the span and the metric. [Rejections] lists a resource's newest
// rejections; rows are kept for 7 days.
package pgfence
