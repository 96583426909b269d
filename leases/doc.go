// Package leases grants time-bounded, holder-bound leases on keys, decided by
// the PostgreSQL database clock, each with a fencing token.
//
// A [Client] on a [github.com/jackc/pgx/v5/pgxpool.Pool] acquires a lease ([Client.TryAcquire] once,
// [Client.Acquire] waiting until the context's deadline), and the [Lease] it
// returns is kept alive in the background until it is released
// ([Lease.Release]), lost, held for [AcquireOptions.MaxHold], or the client
// is closed; with [AcquireOptions.NoKeepAlive] the caller renews it
// ([Lease.Renew]). [Client.Do] runs a function under a lease and cancels its
// context when the lease ends.
// [Client.List], [Client.Get], [Client.History] and [Client.ForceRelease] are
// for inspection and operators; [Client.PauseGrants] and [Client.ResumeGrants]
// are the kill switch for rollouts (new grants of a key prefix are refused
// with [pgfence.ErrGrantsPaused] while current holders finish). Every grant records
// the client's version ("pgfence-go/" and the module version), shown in [Status.ClientVersion].
//
// Privileges: the application's database role needs membership in
// pgfence_app (the protocol functions and reads); ForceRelease, PauseGrants
// and ResumeGrants need pgfence_operator. Neither role may write the lease
// tables directly (see "Roles and the threat model" in the pgfence package's
// README).
//
// The protocol lives in SQL functions installed by the migrations
// (pgfence.try_acquire, pgfence.acquire, pgfence.renew, pgfence.release,
// pgfence.force_release, the view pgfence.lease_status); this package calls
// them, and workers in other languages may call them directly and take part in
// the same protocol. Releases send NOTIFY pgfence_lease_released with the key
// as payload; a grant asked to ([AcquireOptions.Announce]) sends NOTIFY
// pgfence_lease_granted (the leases README describes the payloads).
//
// # Guarantees
//
//   - Single clock. Every expiry decision is made by the database with
//     clock_timestamp(), after taking the lease row's lock. The client's clock
//     is used only to stop early: a lease's context ends when its local trust
//     window runs out, that is the send time of the last confirmed grant or
//     renewal + TTL − safety margin ([Config.SafetyMargin]) by the local
//     monotonic clock. That is before the database can grant the key to anyone
//     else, as long as the two clocks' rates differ by less than the margin.
//   - Holder identity. Every grant gets a fresh random holder id. Renew and
//     release succeed only for the current grant (holder and token); a late or
//     repeated release never frees another grant, and says so
//     ([pgfence.ErrLeaseLost]).
//   - Fencing tokens are drawn with pgfence.next_token in the granting
//     statement, strictly increase per key across grants, survive crashes
//     (grants and renewals commit with synchronous_commit on) and standby
//     promotion (the timeline is in the high bits), and are returned only after
//     the grant committed.
//   - A renewal never extends a lease that expired, even while another
//     transaction holds a lock on the lease row (it locks, then checks).
//   - A failed acquire writes nothing; waiting is bounded by the context, polls
//     with capped exponential backoff and full jitter, is woken by release
//     notifications, and within a client only the first waiter of a key polls
//     (the others queue in FIFO order). Waiters in different clients do not
//     stampede: after a release each waits a random moment (a window that
//     adapts to how often it loses, at most 64 ms); a single waiting client
//     has no such delay. The same hold-back applies at a crashed holder's
//     expiry. Waiters that hear a grant announced ([AcquireOptions.Announce])
//     skip their attempt and set their timers to that lease's expiry.
//     Resuming paused grants wakes waiters at once. With [AcquireOptions.Fair], waiters of
//     every client and process take turns in arrival order through a queue in
//     the database (pgfence.lease_waiters); each fair waiter polls from its
//     arrival, even behind another waiter of its own client.
//
// # Failure handling
//
//   - The database refuses: [pgfence.ErrLeaseHeld] (a [*HeldError] with the holder's
//     remaining time), [pgfence.ErrLeaseLost] (renewal or release of a grant that
//     expired, was taken over or force-released), [pgfence.ErrInvalid] (the message
//     names the argument), [pgfence.ErrNotPrimary].
//   - The database cannot be reached before a statement is sent (no
//     connection, or the pool is closed): [pgfence.ErrUnavailable]; nothing happened.
//     Acquire retries until its deadline. When the caller's context has
//     already ended before anything was sent, the error is the context's
//     (not [pgfence.ErrOutcomeUnknown]): nothing happened either.
//     The reads ([Client.List], [Client.Get], [Client.History],
//     [Client.Pauses]) change nothing, so they never report
//     [pgfence.ErrOutcomeUnknown]: a connection that breaks after they were sent is
//     [pgfence.ErrUnavailable] as well, and a deadline that passes meanwhile the
//     context's error.
//   - The connection breaks after a grant was sent: the client settles the
//     attempt by its holder id, which is unique to it. It records that the
//     attempt is abandoned (from then on the grant is refused if it still
//     arrives), waits for any transaction still holding the key's row, and
//     reads whether the attempt got there first (all within
//     [Config.ResolveTimeout]); no backend is stopped, so this holds behind a
//     transaction pooler too. It either returns the lease or reports that
//     nothing was granted ([pgfence.ErrUnavailable]); if it cannot tell, the error wraps
//     [pgfence.ErrOutcomeUnknown] and names the holder id; the settlement goes on in
//     the background, and a grant it finds is released, which wakes this
//     client's waiters of the key (it is left to expire only when the client
//     is closed first). The caller never waits past its context
//     for this: when the context ends first, the call returns
//     [pgfence.ErrOutcomeUnknown] at once and the read-back finishes in the
//     background, releasing a grant that nobody received.
//   - A grant whose token carries an older timeline than one this client
//     already saw comes from a demoted primary (after a failover that did not
//     stop it): it is refused with [pgfence.ErrNotPrimary].
//   - A renewal fails or its outcome is unknown: the lease keeps its last
//     confirmed trust window. The keep-alive retries, bounds every attempt by
//     the trust window, and ends the lease's context when the window runs out or
//     after [AcquireOptions.MaxFailures] failures in a row; it never keeps a
//     lease past [AcquireOptions.MaxHold] (an hour by default), counted from
//     the grant ([ErrMaxHold]). Work under the lease must stop when
//     [Lease.Context] is done.
//   - A release whose reply is lost is retried (it is idempotent). A release
//     that finds the grant already released (or, after a lost reply, the key
//     granted to another holder) reads the lease's history: a
//     release with the grant's holder id and token (the lost attempt's, or
//     another client's acting for the holder) returns nil, an operator's
//     force-release [pgfence.ErrLeaseLost]; if the history cannot say after a lost
//     reply, the error also wraps [pgfence.ErrOutcomeUnknown]. A release
//     that was not sent, or whose outcome stays unknown, does not end the
//     lease as released ([ErrReleased] means a confirmed release): the lease
//     may still be held, so its context stays open until its trust window
//     runs out (then it ends with [pgfence.ErrLeaseLost]) or a retried [Lease.Release]
//     is confirmed, and the keep-alive no longer renews it. By default a
//     release commits with synchronous_commit = off ([Config.DurableRelease]): if
//     the server crashes right after, the release may be lost and the next holder
//     waits until the lease expires; any later durable commit makes it durable.
//   - The LISTEN connection fails: waiters fall back to polling at once and the
//     connection is re-established with backoff; a lost notification costs at
//     most [Config.PollInterval]. Behind PgBouncer in transaction mode set
//     [Config.DisableWakeups]; everything else is one statement per operation and
//     keeps no session state.
//   - A holder process dies: its lease is taken over after its TTL by the next
//     Acquire, recorded as taken_over in the history.
//   - Limits on input, checked before any round trip ([pgfence.ErrInvalid] names the
//     argument and the limit) and enforced by pgfence.lease_check_args for
//     every other client (PF008): a key is 1 to [MaxKeyBytes] bytes of UTF-8
//     without NUL, a TTL 1 ms to [MaxTTLLimit], a holder description at most
//     [MaxHolderInfoBytes]. A refused call writes nothing. Poll, backoff,
//     renewal and watch intervals are 1 ms to [MaxTTLLimit]; helpers that
//     hold a lease later (an
//     election, a job runner) check their options when built
//     ([Client.Check]).
//   - The client was closed ([Client.Close]): its methods return [ErrClosed]
//     without sending anything (waiting calls and watches end with it); it
//     stops keeping its leases alive (Close waits for that), and they can
//     still be renewed and released.
//
// # Cost
//
// A grant commits durably (one WAL flush); a release does not by default
// ([Config.DurableRelease]), so a grant + release cycle waits for one flush.
// pgfence.leases has fillfactor 80: grants and releases update the key's row
// in place (HOT), so the table and its index do not grow under churn. The row
// checks of leases and lease_events run as one plpgsql call per row, because
// PostgreSQL plans CHECK expressions again for every statement.
//
// # Observability
//
// [Config.MeterProvider] and [Config.TracerProvider] (default: the global
// OpenTelemetry providers, no-ops until set) receive pgfence.lease.operations
// and pgfence.lease.duration by pgfence.operation and pgfence.outcome (calls
// of acquire, renew and release; grant attempts, takeovers and attempts
// skipped after a wake-up; hold time; the trust window left at each renewal;
// why each keep-alive stopped) and a span per acquire, renew and release with
// key, holder and token. When a
// call's context carries a valid span context, its trace id is stored in the
// lease events it records (pgfence.lease_events.trace_id), set in the same
// pipeline as the statement.
// [Config.Logger] gets one event per transition, and one when a keep-alive
// stops, naming the reason.
// The Observability section of the pgfence package's README lists every
// metric.
package leases
