// Package election elects one leader among replicas with a pgfence lease,
// decided by the PostgreSQL database clock, and gives the leader a term: the
// fencing token of its grant, which everything the leader writes carries
// through the fence.
//
// Each replica creates an [Election] on the same lease key with [New] and
// calls [Election.Run], which campaigns, runs [Config.OnStartedLeading] with
// a context that ends when the term ends (the client keeps the term's lease
// alive meanwhile), and campaigns again afterwards, until its context ends:
// then it resigns and returns nil (a stop asked for is not a failure). Followers learn of
// every change of leadership ([Config.OnLeader], [Election.Observe]): the
// leader's term, holder id and the value it publishes ([Term.Proclaim], like
// etcd's Proclaim). [Election.IsLeader], [Election.Leader] and
// [Election.Health] (for a readiness probe) answer questions; [Election.Resign]
// steps down. Candidates race for each vacancy, or, with
// [leases.AcquireOptions.Fair] in the Config, lead in the order they began to
// campaign (like etcd's Campaign).
//
// A [Term] implements pgfence.Lease: pgfence.Write(ctx, db, term, fn) and
// pgfence.Exec fence the resource named by the election's key with the
// term's token, so once a later term has written, the database refuses the
// writes of every earlier one — a leader that was paused, cut off or
// replaced cannot overwrite its successor's work, whatever it believes.
//
// The election is a lease like any other: its key is subject to prefix
// grants (pgfence.grant_prefix) for members of pgfence_app, operators see it
// in `pgfence leases list`, `pgfence leases watch KEY` follows it, and
// `pgfence leases release KEY --force` deposes a leader.
//
// # Guarantees
//
//   - At most one leader at a time by the database clock: a term is a grant
//     of the election's lease, and the database grants a key to one holder
//     at a time (see package leases).
//   - A leader stops leading before another can be elected: the term's
//     context (and [Election.IsLeader], [Term.Err], which read the clock)
//     ends when the lease's local trust window runs out — the send time of
//     the last confirmed grant or renewal + TTL − safety margin by the local
//     monotonic clock — which is before the database lets the lease expire,
//     as long as the two clocks' rates differ by less than the margin. This
//     holds whatever stops the renewals: a refusal, an unreachable database,
//     a pause of the process (a resumed process sees its term over at once).
//   - Terms strictly increase, and a write fenced with a term is refused once
//     a write of a later term was accepted for the election's key (the
//     fencing-token contract of package pgfence). A leader that must not
//     write after its term ends, even before its successor wrote, writes
//     with pgfence.Checked(term): the database then checks the term's lease
//     is live.
//   - Followers observe every change of leadership in the order the
//     database recorded it (grants, published values, ends), without gaps
//     unless the database pruned the election's history (about the newest
//     100 transitions) before they read it.
//   - A resigning leader's successor is elected at once (the release is
//     announced); a leader that dies is replaced right after its lease
//     expires by the database clock: at most the TTL after its last renewal,
//     plus one read and one grant.
//   - With Fair, candidates lead in the order they joined the database's
//     queue of candidates: when Run began, and for a leader when its term
//     ended (after a resignation: once another was elected). A replica
//     without Fair can still take a vacancy first.
//   - Idle followers of a leader send the database nothing (without Fair;
//     fair candidates poll their place in the queue), however many
//     they are: the leader announces each renewal, signed by the database
//     (pgfence.announce_renewal), followers move their timers to the
//     announced expiry, and read the election only when a term ends or
//     begins, or at the leader's expiry if its renewals stop. `pgfence bench
//     curves --curves failover,followers` measures the time from a leader's
//     death to the next leader and the followers' statements per second on
//     a database of yours.
//
// # Failure handling
//
//   - The leader's renewals fail (database unreachable, outcome unknown):
//     keep-alive retries within the trust window; when it runs out, or after
//     [leases.AcquireOptions.MaxFailures] failures in a row, the term ends with
//     the lease's error (wrapping [pgfence.ErrLeaseLost]), OnStartedLeading's context
//     ends, and Run campaigns again once the lease's end is seen.
//   - The leader is paused (GC, SIGSTOP, a frozen VM) past its trust window:
//     when it resumes, its term is over (the clock says so before any timer
//     does); its fenced writes are refused once its successor wrote.
//   - The database restarts or fails over: connections break, renewals fail
//     and are retried; a term survives when a renewal succeeds within its
//     trust window, and ends otherwise. Followers' watches retry with
//     backoff; [Election.Health] reports the failing reads. A standby
//     answers [pgfence.ErrNotPrimary]; Run keeps retrying.
//   - A follower misses notifications (LISTEN connection down): it reads at
//     the leader's last known expiry and every [leases.Config.BackoffMax],
//     and re-reads when the LISTEN connection is back. Behind PgBouncer in transaction
//     mode, disable wake-ups in the client ([leases.Config.DisableWakeups]):
//     followers then read every [leases.Config.BackoffMax] and at the
//     leader's expiry.
//   - Notifications are hints: anyone who can connect can send one. A
//     renewal announcement is believed only with the database's tag for that
//     key, grant and expiry, and only when it moves the expiry later: a
//     forged, altered or replayed one cannot delay a follower's read of a
//     dead leader's expiry. Other notifications only make followers read.
//     None makes anyone a leader, which only the database's grant does.
//   - OnStartedLeading must return when its context ends: Run releases the
//     lease (and lets the next leader in) only after it returned, so a
//     resigning leader hands over cleanly; a callback that does not return
//     keeps the lease (renewed) and blocks Run.
//   - A fair candidate that stops polling its place without leaving the
//     queue (paused, cut off, killed) keeps it until the queue's
//     patience runs out (about twice its client's PollInterval): the
//     candidates behind it wait that much longer for their turn.
//   - The election's key is refused for a role without a granted prefix
//     ([pgfence.ErrNotGranted]): Run returns the error.
package election
