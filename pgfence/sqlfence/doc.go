// Package sqlfence runs pgfence's fenced and lease-checked writes on
// database/sql: inside the *sql.Tx a team already has, whether it comes from
// lib/pq or pgx's stdlib driver, sqlx, sqlc's database/sql mode, GORM or bun.
// The fence and the business write commit together or not at all.
//
// It is package [github.com/pgfence/pgfence/pgfence] for another driver
// interface, not a second implementation: the same code runs both, so the
// writes give the same guarantees, return the same errors
// ([pgfence.ErrStaleToken], [pgfence.ErrLeaseNotHeld],
// [pgfence.ErrTokenNotIssued], *[pgfence.OutcomeUnknownError], …), record the
// same rejections and report the same telemetry ([Fencer]).
//
//	tx, err := db.BeginTx(ctx, nil) // your transaction (sqlx: tx.Tx; GORM: tx.Statement.ConnPool.(*sql.Tx))
//	...
//	_, err = sqlfence.Write(ctx, tx, lease, func(ctx context.Context, tx *sql.Tx) error {
//		// read and write the resource here, after the fence
//		_, err := tx.ExecContext(ctx, `UPDATE stock SET qty = qty - $1 WHERE sku = $2`, n, sku)
//		return err
//	})
//	if errors.Is(err, pgfence.ErrStaleToken) { ... } // another holder wrote since: nothing of fn remains
//	...
//	err = tx.Commit()
//
// Every helper takes a [DB]: a *sql.DB, a *sql.Conn, or the caller's
// *sql.Tx. On a pool or a connection a helper runs its own transaction; on a
// Tx, [Write] and [WriteLeased] run in a savepoint of it and give fn that
// same *sql.Tx, and nothing is durable until the caller commits. The lease is
// a [pgfence.Lease]: a *leases.Lease, or [pgfence.LeaseOf] for a grant made
// through SQL. Errors from statements you run yourself (a plain UPDATE of a
// protected table, say) map to the same sentinels with [pgfence.MapError],
// whichever driver returned them.
//
// # Guarantees
//
// Those of package pgfence, for every driver:
//
//   - A write guarded by token T on resource R commits only if no write with
//     a token higher than T was accepted for R before it; the fence row stays
//     locked from the fence to the commit, so the rows fn reads after the
//     fence cannot change under it. A token that the lease named by the
//     resource never issued is refused.
//   - A lease-checked write commits only if its lease was live, held by the
//     same holder with the same token, when the check ran, and no takeover
//     can commit before the write's transaction ends.
//   - The fence and fn's writes are one transaction (one savepoint inside the
//     caller's): a rejection, an error of fn or of its statements, or a panic
//     in fn leaves none of them.
//   - A COMMIT whose answer is lost is reported as an unknown outcome, never
//     as success and never as "unavailable"; [Resolve] settles it for good.
//
// # Failure handling
//
//   - Behind PgBouncer in transaction mode, give lib/pq binary_parameters=yes
//     and pgx's stdlib driver default_query_exec_mode=exec in the URL. Without
//     binary_parameters, lib/pq sends a statement with arguments outside a
//     transaction in two round trips, which the pooler may send to two
//     backends: the rejection record and Resolve then fail with "unnamed
//     prepared statement does not exist" (the fenced write itself, in its
//     transaction, still holds).
//   - Rejections map to the same errors whatever the driver: the SQLSTATE
//     and DETAIL are read from pgx's *pgconn.PgError and lib/pq's *pq.Error
//     alike. A rejection on the helper's own transaction is recorded in
//     pgfence.fence_rejections afterwards (in its own statement); inside the
//     caller's transaction it is in the span, metric and log only.
//   - Unknown outcomes: a COMMIT (of the helper's own transaction, or of an
//     Exec pipeline) that fails without an answer from the server wraps
//     [pgfence.ErrOutcomeUnknown] in a *[pgfence.OutcomeUnknownError]. That
//     includes database/sql's [driver.ErrBadConn]: lib/pq returns it for a
//     connection that broke after the COMMIT was sent, and for a FATAL error
//     such as an administrator's shutdown, so it cannot mean "not sent".
//     lib/pq's refusal to COMMIT a transaction that failed earlier (fn
//     swallowed an error) is not told apart from a lost COMMIT either, and
//     is an unknown outcome too. Errors before COMMIT was sent, and errors
//     the server answered (a deferred constraint at COMMIT), are known: the
//     transaction did not commit. When the context ends before COMMIT was
//     sent, database/sql rolls the transaction back and its error is
//     returned. Pass an unknown outcome to [Resolve] (with a *sql.DB or a
//     *sql.Conn): [pgfence.NotApplied] is final, because the write is given
//     up (pgfence.abandon_fence) before the resource is probed.
//   - A database that cannot be reached returns [pgfence.ErrUnavailable];
//     nothing was done. A closed *sql.DB or *sql.Conn, or a *sql.Tx that was
//     committed or rolled back, returns database/sql's own error
//     ([sql.ErrConnDone], [sql.ErrTxDone], "sql: database is closed"), a
//     *sql.Tx aborted by an earlier failed statement the server's (SQLSTATE
//     25P02): nothing was written. An argument the driver cannot send
//     returns the driver's error and nothing is written; pgx closes a
//     connection whose pipeline it could not encode, so a *sql.Conn used
//     with such an Exec is closed afterwards, as a *pgx.Conn is by
//     [pgfence.Exec]. An error that carries no SQLSTATE (a driver of
//     another database, say) is returned unchanged, never as a pgfence
//     sentinel, and the helper's transaction is rolled back.
//   - fn must leave COMMIT and ROLLBACK to the helper. When it ends the
//     transaction itself, through database/sql (tx.Commit, tx.Rollback, on
//     the caller's *sql.Tx too) or as SQL, the helper returns an error
//     wrapping [pgfence.ErrOutcomeUnknown]: with ErrInvalid where it can
//     tell (pgx's driver shows the connection's transaction status; in the
//     caller's transaction RELEASE SAVEPOINT fails), without it where only
//     the driver's COMMIT refused (lib/pq).
//   - db must be a *sql.DB (or a type that embeds one, such as *sqlx.DB), a
//     *sql.Conn or a *sql.Tx; any other type is refused with ErrInvalid,
//     since the helper could not tell whether it commits on its own. Under
//     REPEATABLE READ or SERIALIZABLE a concurrent fence fails with
//     [pgfence.ErrIsolation]: use READ COMMITTED, the default.
//
// # Costs
//
// [Write] on a pool costs BEGIN, the fence, fn's statements and COMMIT, as
// [pgfence.Write] does. [Exec] with pgx's stdlib driver sends the fence and
// the statement as one pipeline, one round trip (through [sql.Conn.Raw]).
// lib/pq cannot pipeline, but sends a statement without arguments as one
// simple query, which may hold several statements and runs them as one
// implicit transaction: [Exec] and [ExecLeased] send the trace's statement,
// the check and the statement as one, one round trip, with every argument
// written as a quoted constant — the text lib/pq would send for it, which the
// server reads exactly as it reads lib/pq's untyped parameter. When that is
// not certain (a []byte or a time.Time argument, a string with a backslash, a
// placeholder used twice, dollar quoting, several statements; the full list
// is in the source) the statement goes with its arguments as usual: BEGIN
// with the check as one simple query, the statement, COMMIT — three round
// trips, the statement's two by default (lib/pq prepares it first), one with
// binary_parameters=yes. A connection whose transaction could not be rolled
// back after a failure is closed, never returned to the pool. [Write] on a
// pool or connection of lib/pq sends the trace's statement and the check as
// one simple query too. With other drivers, and in the caller's transaction,
// the trace's id costs a statement of its own.
//
// `pgfence bench compare --cases sql-raw-update,sql-fenced-update` measures
// the fenced Exec on a *sql.DB of pgx's stdlib driver against the same
// unfenced UPDATE through the same driver; `go test -bench
// BenchmarkFencedVsUnfenced ./pgfence/sqlfence` compares the ratio on a pgx
// pool, pgx's stdlib driver and lib/pq, one writer on one connection. With
// lib/pq the fenced Exec takes one round trip where the unfenced statement
// takes two (one with binary_parameters=yes), so its ratio is below pgx's
// unless the arguments cannot be constants.
//
// Runnable examples with GORM, sqlc-style code and sqlx (each joining the
// fenced write to the ORM's transaction and refusing a stale holder) are in
// the repository's nested module examples/orm.
//
// # Leases
//
// Grants, renewals and releases stay with package leases, which runs on pgx:
// its client settles a grant whose reply was lost by the grant's holder id
// and must know whether a statement was sent at all, which database/sql
// cannot tell (see above), and its wake-ups need a connection of its own
// that LISTENs. A service whose handle is a *sql.DB gives it a pgx pool on
// the same database and passes the *leases.Lease, a [pgfence.Lease], to this
// package:
//
//	pool, err := pgxpool.New(ctx, dsn) // the same DSN (lib/pq's URL or key=value form)
//	client, err := leases.New(pool, nil)
//	lease, err := client.Acquire(ctx, "stock:sku-42", 30*time.Second, nil)
//	_, err = sqlfence.Write(ctx, sqlTx, lease, fn)
//
// With pgx's driver one pool serves both: open the *sql.DB from the pgx pool
// with stdlib.OpenDBFromPool. Without the leases package, grant through SQL
// in autocommit (SELECT holder, token FROM pgfence.try_acquire(key, ttl)),
// renew and release likewise, and wrap the grant with [pgfence.LeaseOf]; the
// pgfence package README lists the SQL functions and the rules for such
// clients.
package sqlfence
