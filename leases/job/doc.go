// Package job runs a scheduled job once per period (or per named slot)
// across replicas, restarts and takeovers, with pgfence leases and a
// completion record the database keeps.
//
// Every replica creates a [Runner] for the job's lease key with [New] and
// calls [Runner.RunPeriod] (or [Runner.Run] with a slot name) on its own
// schedule — every minute, say, for a nightly job. The call takes the job's
// lease, skips the slot if it was completed, and otherwise runs the function
// under the kept-alive lease. The function completes the slot with its last
// write, in one transaction ([Slot.Finish], or [Slot.Complete] in its own):
//
//	res, err := runner.RunPeriod(ctx, 24*time.Hour, func(ctx context.Context, s *job.Slot) error {
//		report, err := build(ctx, s.Name())
//		if err != nil {
//			return err // the slot stays unfinished: the next call takes it over
//		}
//		return s.Finish(ctx, func(ctx context.Context, tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, `INSERT INTO reports (day, body) VALUES ($1, $2)`, s.Name(), report)
//			return err
//		})
//	})
//
// The slots live in pgfence.job_slots (the newest 1000 per job),
// written only by the SQL functions pgfence.job_slot_begin,
// pgfence.job_slot_save, pgfence.job_slot_complete and
// pgfence.job_slot_missed, which check the job's lease like
// pgfence.check_lease; a worker in another language can take part by calling
// them.
//
// # Guarantees
//
//   - A slot completes at most once, whatever the replicas, restarts,
//     pauses and takeovers: its completion commits only in a transaction that
//     holds the job's lease row locked (FOR SHARE, so no takeover commits
//     before it ends) with the run's live grant, and only if the slot is still
//     that run's (a takeover moves it to the new run first). Writes in the same
//     transaction ([Slot.Finish], [Slot.Complete]) take effect once too.
//   - A run fences the job's resource with its token when it begins: once a
//     later run began, every fenced write of an earlier one
//     ([pgfence.Write] with [Slot.Lease]) is refused, before it can complete
//     anything, even while the earlier runner still believes it holds the
//     lease (paused, cut off).
//   - A slot whose run did not complete (its runner died or lost the lease,
//     or its function failed) is taken over by the next [Runner.Run] of the
//     slot on any replica, once the lease is free (after the dead runner's
//     TTL): it resumes from the last checkpoint ([Slot.Save]) or restarts
//     ([Config.Restart]). [Slot.Runs] counts the runs.
//   - Every period, at most once, while at least one replica runs: each
//     period is run in its time or late, or reported, never skipped without
//     a trace. When RunPeriod begins a period, it records each earlier
//     period since the job's newest period slot that no run began (the
//     replicas were all busy with an earlier period, waiting out a dead
//     runner's lease, or stopped) as missed, and logs it.
//     [Runner.Unfinished] lists the missed periods and the slots begun and
//     left unfinished until a [Runner.Run] of the slot completes it;
//     [Config.CatchUp] makes RunPeriod run those of the last periods late
//     itself, oldest first. pgfence cannot tell a period in which no replica
//     ran from one in which none began it: both are recorded. A gap longer
//     than 999 periods is recorded from its newest 999 (the database keeps
//     the newest 1000 slots of a job).
//   - Slot names by period come from the database clock, not the replicas'.
//
// # Failure handling
//
//   - The job is running elsewhere: Run waits for the lease like
//     [leases.Client.Do], and then finds the slot completed; with
//     [leases.AcquireOptions.TryOnce] it returns at once with an error wrapping
//     [pgfence.ErrLeaseHeld].
//   - The run's lease is lost (renewals fail past the trust window, MaxHold):
//     the function's context ends; its completion, if it still tries, is
//     refused ([pgfence.ErrLeaseLost] or [pgfence.ErrStaleToken]) and rolls
//     back with the writes of its transaction; Run returns the error and the
//     slot stays unfinished for a takeover. A run longer than one hour must
//     raise [leases.AcquireOptions.MaxHold].
//   - The connection breaks around the completion's commit: the error wraps
//     [pgfence.ErrOutcomeUnknown]; call Run again: it finds the slot completed
//     (then the work committed with it) or takes it over.
//   - Effects outside the database (an e-mail, a third-party API) are not
//     protected by the completion: make them idempotent (derive their keys
//     from the job and slot), record progress with [Slot.Save] and resume.
package job
