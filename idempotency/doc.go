// Package idempotency makes one business intent take effect once, however
// often it is requested: a client retrying after a timeout, a user clicking
// twice, a queue redelivering a message, an AI agent repeating a tool call.
//
// A key (scope + key) names the intent. The first request that presents it
// does the work and stores the result; every duplicate gets the stored result
// instead of a second execution. The same key with a different payload is
// refused. Keys, results and leases live in PostgreSQL (table
// pgfence.idempotency_keys, installed by the migrations), so every process and
// every language sees the same answer. Package
// [github.com/pgfence/pgfence/idempotency/idemhttp] applies keys to
// net/http handlers (the Idempotency-Key header).
//
// # Choosing a key
//
// A key names a business intent — the order and the operation, "order-1234:
// capture", or a key the client generated once for one user action and sends
// with every retry of it. It is not a random id per attempt or per HTTP
// request: a fresh id on every retry makes every retry new and protects
// nothing. Put who may use the key and the operation in [Request.Scope], and a
// canonical form of the request in [Request.Payload] (see [CanonicalJSON]).
//
// When a natural unique fact exists, a constraint alone is simpler and better:
// one payment per order is UNIQUE (order_id) on the payments table; "ship only
// once" is UPDATE orders SET state = 'shipped' WHERE id = $1 AND state =
// 'paid' and checking the row count. Use keys when the intent has no such
// fact, when a duplicate must get the original response (not just a
// violation), when the payload must be checked, or when the effect is outside
// the database.
//
// # Atomic mode
//
// [Store.Do] is for effects that live in the same database. The claim, the
// business writes of its function and the stored result commit in one READ
// COMMITTED transaction. A duplicate that arrives meanwhile waits for that
// transaction (bounded by [Config.WaitTimeout] and its context) and then
// replays its result; if the first transaction rolls back or its connection
// dies, the key is simply free again. There is nothing to clean up after a
// crash. Do works inside the caller's transaction too (pass a [pgx.Tx]).
// [Store.Begin] is the same claim for a caller that runs the work itself (a
// middleware, an interceptor): it returns an [Attempt] holding the open
// transaction, which [Attempt.Complete] or [Attempt.Fail] commit with the
// stored answer.
//
// On a pool or a connection a new key costs two round trips besides the
// work's statements: BEGIN travels with the claim in one message, the stored
// result with COMMIT in one pipeline. A duplicate costs four: that first
// message (the claim refuses it and the transaction aborts), ROLLBACK with a
// new BEGIN, the claim alone (which reads the stored answer), and ROLLBACK.
//
// [Store.DoSQL] is Do on database/sql (lib/pq, pgx's stdlib driver, and the
// ORMs over them): on a *sql.DB or *sql.Conn it runs its own READ COMMITTED
// transaction; on the caller's *sql.Tx the claim, the function's writes and
// the result join that transaction under a savepoint, so they commit with
// the caller's other writes (a fenced write of package
// [github.com/pgfence/pgfence/pgfence.WriteSQL], say) or not at all. It runs
// the same code as Do and gives the same outcomes and errors; a lost COMMIT
// is [ErrOutcomeUnknown] with lib/pq too. The stored result and COMMIT are
// two round trips there, not one pipeline.
//
// # Leased mode
//
// [Store.Claim] is for effects outside the database: a payment provider, an
// e-mail, a device command. The claim commits first, with a lease (database
// clock) and a fresh owner id; the [Attempt] then works in phases. Each phase
// makes its external call with [Attempt.DerivedKey] (the same downstream
// idempotency key for every attempt and takeover, so the outside system
// deduplicates a call a crashed owner made) and records its recovery point
// with [Attempt.AdvanceTx] in the transaction of its own database writes, so
// the writes and the point commit together. The attempt ends with
// [Attempt.Complete] (or [Attempt.CompleteTx] in the last phase's
// transaction), [Attempt.Fail] (a permanent failure) or [Attempt.Release] (a
// transient error). If the owner crashes, the next claim after the lease
// expired takes over, with the recovery point of the crashed owner.
//
// A key whose owner crashed stays in progress until somebody claims it again.
// [Store.Recover], a completer to run periodically, takes such keys over the
// way a retry would and resumes each from its recovery point through a
// function of yours (or marks it failed with the code "abandoned");
// [Store.Abandoned] lists them.
//
// # Guarantees
//
//   - At most one effect per key: atomic mode runs the winning function's
//     writes once (it may run again only after its transaction rolled back);
//     leased mode has one owner at a time, decided in the database by an
//     INSERT … ON CONFLICT DO UPDATE … WHERE that runs under the row lock.
//   - Every duplicate of a completed key gets the stored result or stored
//     permanent failure; never a second execution.
//   - The same key with a different payload gets [ErrMismatch] and never the
//     stored result.
//   - A duplicate of a key in flight gets [ErrInProgress] with a retry hint (or,
//     in atomic mode, waits up to [Config.WaitTimeout] and gets the result).
//   - Only the current owner of a leased key can heartbeat, advance, complete,
//     fail or release it; a replaced owner's late write returns [ErrLeaseLost]
//     and changes nothing. [Attempt.AdvanceTx] and [Attempt.CompleteTx] fence
//     the caller's transaction the same way: a replaced owner's phase cannot
//     commit.
//   - A recovery point recorded with AdvanceTx commits exactly when the
//     phase's writes do: a takeover resumes after the last committed phase,
//     never before it or after an uncommitted one.
//   - [Store.Recover] resumes or fails each abandoned key at most once per
//     takeover, whatever runs concurrently (other completers, the client's
//     retry): it claims with the key's own fingerprint under the row lock.
//   - Lease expiry and result retention are decided by the database clock
//     (clock_timestamp()), never a client's.
//   - Transient failures are never stored: the key stays free for a retry.
//   - [Store.GC] deletes only completed keys whose retention ended, never a
//     key in progress.
//   - A committed atomic claim always has its result: a transaction that
//     claims and commits without storing one is refused at COMMIT.
//
// # Failure handling
//
//   - The caller's transaction is REPEATABLE READ or SERIALIZABLE:
//     [ErrIsolation] before anything is written (SQLSTATE PF010; a 40001 maps
//     to the same sentinel). On a pool or a connection whose sessions default
//     to such a level (default_transaction_isolation), Do, Begin and Claim run
//     in READ COMMITTED transactions of their own.
//   - The connection breaks while Do (or an atomic [Attempt.Complete]) commits, or
//     around a leased call: [ErrOutcomeUnknown]. Send the same request again:
//     the key answers with the stored result if it committed, or runs the
//     intent if it did not. The same holds when the caller's context ends
//     while Do waits for its COMMIT's answer (pgx closes the connection). A
//     context that ended before the result and COMMIT were sent returns the
//     context's error, and a result or COMMIT the server refuses (a deferred
//     constraint, say) returns the server's error: either way nothing was
//     stored and the key is free.
//   - The database is unreachable: [ErrUnavailable], nothing was done.
//   - The caller's context ends while a duplicate waits for the first attempt:
//     the context's error; the first attempt is unaffected.
//   - An atomic first attempt holds the key longer than the wait: [ErrInProgress]
//     with [Config.RetryAfter] as the hint; the caller's transaction stays
//     usable (the wait is a lock_timeout inside a subtransaction).
//   - A leased owner stops heartbeating (crash, pause, partition): after its
//     lease the key is taken over, by a retry or by [Store.Recover]; if it
//     wakes up, its writes get [ErrLeaseLost]. Use [Attempt.TrustedUntil] to
//     stop starting external calls before the lease can have expired.
//   - A crash between an external call and the AdvanceTx of its phase: the
//     next owner repeats the call with the same [Attempt.DerivedKey], which
//     the outside system must deduplicate (or the call must be safe to
//     repeat). That residual risk is the leased mode's; say so in your design.
//   - Recover's function fails transiently, panics or returns without settling
//     the key: the key is released with its recovery point for the next
//     retry or completer; a [*Failure] it returns is stored.
//   - Limits on input (scope and key [MaxScopeBytes] and [MaxKeyBytes],
//     results [MaxResultBytes], failure codes 128 bytes and messages 4096,
//     recovery points 256 bytes and their data 1 MiB; every text — scope,
//     key, failure code and message, recovery point — valid UTF-8 without
//     NUL) are checked before any round trip ([ErrInvalid] names the field
//     and the limit) and enforced by the SQL functions for other clients
//     (PF008; the server itself refuses such text, 22021). A refused call writes
//     nothing: an atomic claim rolls back with the caller's writes and the key
//     stays free; a leased attempt keeps the key and can still complete it.
//     A payload is only hashed, never sent or stored: bound what you read.
//
// # SQL interface
//
// Clients in other languages use the same functions in schema pgfence:
// idempotency_claim_atomic and idempotency_complete_atomic (atomic mode),
// idempotency_claim, idempotency_heartbeat, idempotency_advance,
// idempotency_complete and idempotency_release (leased mode), and
// idempotency_gc. The package README lists their arguments, results and
// SQLSTATEs. The fingerprint is the SHA-256 of the canonical payload.
//
// # Observability
//
// [Config.MeterProvider] and [Config.TracerProvider] (default: the global
// OpenTelemetry providers) receive pgfence.idempotency.operations and
// pgfence.idempotency.duration by pgfence.operation and pgfence.outcome: the
// claims (atomic or leased: new, taken_over, replayed, in_progress,
// mismatch, unknown, error), a leased attempt's heartbeat, advance,
// complete, fail and release (not_owner counts a replaced owner's late
// write), [Store.Recover] (recover, and recover_key by resumed, failed,
// released, skipped) and [Store.GC] (gc, and gc_deleted counting the keys);
// and a span for each with scope, key, owner and epoch — never the payload
// or the result. [Config.Logger] gets claims, duplicates, takeovers,
// recoveries, settlements and GC runs. Nothing records request or response
// bodies, and there is no option to: the result is stored in
// pgfence.idempotency_keys.result (replays need it), the request only as
// its SHA-256.
//
// When the context carries a valid span context, the claim (Do, Begin or
// Claim) sets its trace id for the claim's transaction in the same pipeline
// (no extra round trip), and pgfence.idempotency_keys.trace_id keeps the
// trace of the claim that created the key or last took it over (a retry or
// Store.Recover); heartbeats, recovery points and completions leave it as
// it is. `pgfence keys show SCOPE KEY` prints it.
package idempotency
