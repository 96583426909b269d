package tasks

import (
	"errors"
	"sync"

	"github.com/pgfence/pgfence/internal/telemetry"
	"github.com/pgfence/pgfence/pgfence"
)

// recorder gives each enqueue and each applied batch a span (pgfence.task.enqueue,
// pgfence.task.apply) and counts them in pgfence.task.operations by
// pgfence.operation and pgfence.outcome: enqueue {enqueued, duplicate,
// backlog_full, error}, apply {applied, failed, lease_lost, error}, and
// per task applied {task_done} and failed attempts {task_failed}. The
// histogram pgfence.task.duration has the operations' durations and, as
// operation lag, the time from a task's enqueue (database clock) to its
// batch's commit (the consumer's clock). It uses the global providers,
// which delegate to the ones the application sets.
var recorder = sync.OnceValue(func() *telemetry.Recorder {
	return telemetry.New("github.com/pgfence/pgfence/leases/tasks", "pgfence.task", nil, nil)
})

// outcome names err for pgfence.outcome; ok when err is nil.
func outcome(err error, ok string) string {
	switch {
	case err == nil:
		return ok
	case errors.Is(err, pgfence.ErrBacklogFull):
		return "backlog_full"
	case errors.Is(err, pgfence.ErrLeaseLost):
		return "lease_lost"
	}
	return "error"
}
