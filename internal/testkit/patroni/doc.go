// Package patroni starts a throwaway high-availability PostgreSQL cluster for
// tests: one etcd member and a primary and replica managed by Patroni, as
// teams that outgrow one server run it.
//
// Everything listens on 127.0.0.1 on free ports and lives in one temp
// directory. The servers are the PostgreSQL binaries the other tests use
// (pgcluster.FindBinaries); etcd, Patroni and PostgreSQL run as the
// unprivileged postgres user when the caller is root. [Cluster.Close] stops
// them and removes the directory; directories that dead test processes left
// are swept (their processes killed) when the next cluster starts.
//
// Patroni's timings are short so that a failover takes seconds: by default
// ttl 8 s (the leader key's lifetime), loop_wait 1 s (the HA loop's period)
// and retry_timeout 3 s (how long a DCS or PostgreSQL call is retried), which
// keeps Patroni's rule loop_wait + 2 × retry_timeout ≤ ttl.
// primary_start_timeout is 0: a crashed primary is failed over at once
// instead of restarted in place. pg_rewind is on (use_pg_rewind, data
// checksums), so an old primary rejoins as a replica of the new timeline.
// Replication slots are on, and synchronous_mode is a [Config] choice.
//
// Clients connect with a multi-host URL ([Cluster.ConnString]: every node,
// target_session_attrs=read-write) and reach whichever node is the primary.
//
// # Guarantees
//
//   - [Start] returns once the leader runs and every replica streams from it
//     (with SynchronousMode, once one replica is the synchronous standby).
//   - Every wait is bounded and fails with what Patroni last reported and the
//     tails of the logs.
//   - [Cluster.Close] leaves no process and no file behind, also for a node
//     that a test froze (SIGSTOP) or whose postmaster it killed.
//
// # Failure handling
//
// A missing binary (patroni, etcd, or the PostgreSQL server) is
// [ErrNotInstalled]: tests skip on it, except under CI=true, where they fail.
package patroni
