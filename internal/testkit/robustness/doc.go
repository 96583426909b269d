// Package robustness proves pgfence under faults: the acceptance scenarios
// of a lock service with fencing as tests, and a randomized run in the style of etcd's robustness
// tests whose history is checked here.
//
// A history is a list of [Op]s recorded by the test driver: every lease
// acquire, renewal and release, fenced write, idempotent side effect and
// read, with monotonic call and return times and the outcome its caller saw.
// An outcome the caller could not learn (a lost reply, a cut around COMMIT, a
// worker stopped past its caller's deadline) is [Unknown]: it may take effect
// at any later time, so its return time is [Never]; one the caller read back
// before returning (pgfence.Resolve, a retry with the same idempotency key)
// is what the read-back said, and the check holds the read-back to it. After
// the run the ground truth ([Truth]) is read back from the database: every
// accepted fenced write (from an audit table written in the same
// transaction), the final business rows, every lease grant (a trigger copies
// them out of pgfence.lease_events, which is pruned), every side effect and
// every stored idempotent result.
//
// [Check] then verifies:
//
//   - accepted fenced tokens never decrease per resource, and the final
//     business state is the write of the highest accepted token;
//   - every accepted write was acknowledged or unknown to its caller (a write
//     reported stale or failed never lands), and every acknowledged write is
//     in the database;
//   - lease tokens never repeat and strictly increase per key;
//   - at most one side effect per idempotency key, and every caller got the
//     stored result;
//   - with github.com/anishathalye/porcupine, that the history is
//     linearizable: each resource is a fenced register (a write with token t
//     is accepted iff no higher token was accepted), each lease a strictly
//     increasing token sequence, each intent a write-once result, and the
//     ground truth is a final read of each.
//
// # Running
//
// The tests need local PostgreSQL server binaries (pgfencetest.NewCluster):
// scenarios that restart, stop or fail over the server get a cluster of their
// own. The scenario tests are TestScenario* (simultaneous acquire, holder
// crash, pause beyond the lease, lost renewal, takeover, an old request
// arriving late, double release, duplicate business request, unknown commit
// outcome, a stale write through an unchecked path, database restart,
// database unreachable, hot-key contention, failover). The randomized run is
// TestRobustnessRandomized:
//
//	go test -race -run TestRobustnessRandomized -v ./internal/testkit/robustness
//	go test -race -run TestRobustnessRandomized -v ./internal/testkit/robustness -robustness.duration=10m -timeout=30m
//	go test -race -run TestRobustnessRandomized -v ./internal/testkit/robustness -robustness.seed=N
//
// TestScenarioPatroni runs the clients through Patroni failovers (kill -9,
// SIGSTOP past the TTL, switchover; synchronous_mode off and on) on an
// etcd + Patroni cluster of internal/testkit/patroni, once per fault in CI
// (about four minutes); a longer run repeats the cycle:
//
//	go test -race -run TestScenarioPatroni -v ./internal/testkit/robustness -patroni.rounds=5 -timeout=60m
//
// The randomized run prints a summary: the random seed, the faults injected
// by kind, the operations by outcome, what the database accepted, how many
// operations of each part of a cycle completed (lease grants, takeovers,
// renewals refused, fenced writes accepted and refused as stale, idempotent
// effects, unknown outcomes resolved, releases), porcupine's verdict and the
// violations (which must be none). A run fails if a part never completed.
//
// # Guarantees
//
// [Check] reports every violation it finds with the resource and values
// involved; a test feeds it known-bad histories to prove it catches them.
// Failing histories are saved as JSON ([Save]) under testdata/ and re-checked
// by the tests, so they stay as regression data.
//
// # Failure handling
//
// porcupine's search is bounded by a timeout; a check that times out reports
// [porcupine.Unknown] (not a violation, but printed in the summary). The
// invariants are checked regardless.
package robustness
