package bench

import (
	"cmp"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// ContentionJSON is the output of `pgfence bench contention --json`: the
// run's settings, the coordination figures, the business figures read back
// from the business table, each key's part, and the reconciliation.
type ContentionJSON struct {
	Machine    string  `json:"machine"`
	Settings   string  `json:"settings"`
	Mode       string  `json:"mode"`
	Workers    int     `json:"workers"`
	Keys       int     `json:"keys"`
	DurationMS int64   `json:"duration_ms"`
	TTLMS      int64   `json:"ttl_ms"`
	MaxWaitMS  int64   `json:"max_wait_ms"`
	HoldMS     int64   `json:"hold_ms"`
	PauseRate  float64 `json:"pause_rate"`
	PauseMS    int64   `json:"pause_ms"`
	PauseFirst bool    `json:"pause_first"`
	ElapsedMS  int64   `json:"elapsed_ms"`

	Acquisitions     int64   `json:"acquisitions"`
	AcquisitionsPerS float64 `json:"acquisitions_per_s"`
	WaitP50US        int64   `json:"wait_p50_us"`
	WaitP99US        int64   `json:"wait_p99_us"`
	CycleP50US       int64   `json:"cycle_p50_us"`
	CycleP99US       int64   `json:"cycle_p99_us"`
	GiveUps          int64   `json:"give_ups"`
	Renewals         int64   `json:"renewals"`
	Expiries         int64   `json:"expiries"`
	TakenOver        int64   `json:"taken_over"`
	PausedGrants     int64   `json:"paused_grants"`

	AcceptedWrites   int64 `json:"accepted_writes"`
	FenceRejections  int64 `json:"fence_rejections"`
	PausedRejections int64 `json:"paused_rejections"`
	LateAccepted     int64 `json:"late_accepted"`
	Stopped          int64 `json:"stopped"`
	// Completions are the completion rows read back from the business table.
	Completions     int64   `json:"completions"`
	CompletionsPerS float64 `json:"completions_per_s"`
	// RejectionsRecorded is absent when pgfence.fence_rejections could not
	// be read.
	RejectionsRecorded *int64 `json:"rejections_recorded,omitempty"`
	Errors             int64  `json:"errors"`
	FirstError         string `json:"first_error,omitempty"`

	// Tasks holds the figures of --mode tasks (absent in --mode lock).
	Tasks *ContentionTasksJSON `json:"tasks,omitempty"`

	PerKey     []ContentionKeyJSON   `json:"per_key"`
	Reconciled bool                  `json:"reconciled"`
	Checks     []ContentionCheckJSON `json:"checks"`
}

// ContentionTasksJSON is the ordered-task mode's part of the output: the
// floor (bare INSERTs of the task rows by the same producers), the enqueues,
// and how long after its enqueue started a producer was told its task was
// applied. CompletionsToFloor is completions_per_s over
// floor_inserts_per_s.
type ContentionTasksJSON struct {
	Consumers          int     `json:"consumers"`
	FloorElapsedMS     int64   `json:"floor_elapsed_ms"`
	FloorInserts       int64   `json:"floor_inserts"`
	FloorInsertsPerS   float64 `json:"floor_inserts_per_s"`
	FloorP50US         int64   `json:"floor_p50_us"`
	FloorP99US         int64   `json:"floor_p99_us"`
	Enqueued           int64   `json:"enqueued"`
	EnqueueP50US       int64   `json:"enqueue_p50_us"`
	EnqueueP99US       int64   `json:"enqueue_p99_us"`
	Applied            int64   `json:"applied"`
	AppliedP50US       int64   `json:"enqueue_to_applied_p50_us"`
	AppliedP99US       int64   `json:"enqueue_to_applied_p99_us"`
	BacklogMax         int64   `json:"backlog_max"`
	Batches            int64   `json:"batches"`
	BatchP50US         int64   `json:"batch_interval_p50_us"`
	BatchP99US         int64   `json:"batch_interval_p99_us"`
	WriteP50US         int64   `json:"batch_write_p50_us"`
	WriteP99US         int64   `json:"batch_write_p99_us"`
	Statements         int64   `json:"statements"`
	CompletionsToFloor float64 `json:"completions_to_floor"`
}

// ContentionKeyJSON is one key's part of the run.
type ContentionKeyJSON struct {
	Key             string `json:"key"`
	Acquisitions    int64  `json:"acquisitions"`
	GiveUps         int64  `json:"give_ups"`
	AcceptedWrites  int64  `json:"accepted_writes"`
	FenceRejections int64  `json:"fence_rejections"`
	Completions     int64  `json:"completions"`
	Counter         int64  `json:"counter"`
	// LastToken is 0 when the key has no completion (a run too short or too
	// loaded for one): the key is always present, so the shape never varies.
	LastToken int64 `json:"last_token"`
	// --mode tasks: the tasks enqueued to the key and the sequence number
	// of its last completion row (0 in --mode lock).
	Enqueued int64 `json:"enqueued"`
	LastSeq  int64 `json:"last_seq"`
}

// ContentionCheckJSON is one reconciliation check.
type ContentionCheckJSON struct {
	Check  string `json:"check"`
	Held   bool   `json:"held"`
	Detail string `json:"detail"`
}

func perSecond(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// JSON returns the report as `pgfence bench contention --json` prints it.
func (r *ContentionReport) JSON() ContentionJSON {
	o := r.Options
	out := ContentionJSON{Machine: r.Machine, Settings: r.Settings, Mode: cmp.Or(o.Mode, ModeLock), Workers: o.Workers, Keys: o.Keys,
		DurationMS: o.Duration.Milliseconds(), TTLMS: o.TTL.Milliseconds(), MaxWaitMS: o.MaxWait.Milliseconds(), HoldMS: o.Hold.Milliseconds(),
		PauseRate: o.PauseRate, PauseMS: o.Pause.Milliseconds(), PauseFirst: o.PauseFirst, ElapsedMS: r.Elapsed.Milliseconds(),
		Acquisitions: r.Acquisitions, AcquisitionsPerS: perSecond(r.Acquisitions, r.Elapsed),
		WaitP50US: r.WaitP50.Microseconds(), WaitP99US: r.WaitP99.Microseconds(), CycleP50US: r.CycleP50.Microseconds(), CycleP99US: r.CycleP99.Microseconds(), GiveUps: r.GiveUps, Renewals: r.Renewals,
		Expiries: r.Expiries, TakenOver: r.TakenOver, PausedGrants: r.PausedGrants,
		AcceptedWrites: r.Accepted, FenceRejections: r.Rejected, PausedRejections: r.PausedRejected, LateAccepted: r.LateAccepted,
		Stopped: r.Stopped, Completions: r.Completions, CompletionsPerS: perSecond(r.Completions, r.Elapsed),
		Errors: r.Errors, FirstError: r.FirstError, PerKey: make([]ContentionKeyJSON, 0, len(r.PerKey)),
		Reconciled: r.Reconciled, Checks: make([]ContentionCheckJSON, 0, len(r.Checks))}
	if r.RejectionsRecorded >= 0 {
		n := r.RejectionsRecorded
		out.RejectionsRecorded = &n
	}
	if o.Mode == ModeTasks {
		out.Tasks = &ContentionTasksJSON{Consumers: o.Consumers, FloorElapsedMS: r.FloorElapsed.Milliseconds(), FloorInserts: r.FloorInserts,
			FloorInsertsPerS: perSecond(r.FloorInserts, r.FloorElapsed), FloorP50US: r.FloorP50.Microseconds(), FloorP99US: r.FloorP99.Microseconds(),
			Enqueued: r.Enqueued, EnqueueP50US: r.EnqueueP50.Microseconds(), EnqueueP99US: r.EnqueueP99.Microseconds(), Applied: r.Applied,
			AppliedP50US: r.AppliedP50.Microseconds(), AppliedP99US: r.AppliedP99.Microseconds(), BacklogMax: r.BacklogMax,
			Batches: r.Batches, BatchP50US: r.BatchP50.Microseconds(), BatchP99US: r.BatchP99.Microseconds(),
			WriteP50US: r.WriteP50.Microseconds(), WriteP99US: r.WriteP99.Microseconds(), Statements: r.Statements,
			CompletionsToFloor: r.toFloor()}
	}
	for _, k := range r.PerKey {
		out.PerKey = append(out.PerKey, ContentionKeyJSON{Key: k.Key, Acquisitions: k.Acquisitions, GiveUps: k.GiveUps,
			AcceptedWrites: k.Accepted, FenceRejections: k.Rejected, Completions: k.Completions, Counter: k.Counter, LastToken: k.LastToken,
			Enqueued: k.Enqueued, LastSeq: k.LastSeq})
	}
	for _, c := range r.Checks {
		out.Checks = append(out.Checks, ContentionCheckJSON(c))
	}
	return out
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// toFloor is the tasks' completions per second over the floor's inserts
// per second (0 without a floor).
func (r *ContentionReport) toFloor() float64 {
	if f := perSecond(r.FloorInserts, r.FloorElapsed); f > 0 {
		return perSecond(r.Completions, r.Elapsed) / f
	}
	return 0
}

// WriteText prints the report: coordination and business side by side, each
// key, and the reconciliation.
func (r *ContentionReport) WriteText(w io.Writer) {
	o := r.Options
	if o.Mode == ModeTasks {
		r.writeTasksText(w)
		return
	}
	fmt.Fprintf(w, "%d workers on %d keys for %s (ran %s): TTL %s, max wait %s, hold %s, %.0f%% of grants paused for %s",
		o.Workers, o.Keys, o.Duration, r.Elapsed.Round(time.Millisecond), o.TTL, o.MaxWait, o.Hold, 100*o.PauseRate, o.Pause)
	if o.PauseFirst {
		fmt.Fprint(w, " plus the first of every key")
	}
	fmt.Fprint(w, "\n\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	recorded := "-"
	if r.RejectionsRecorded >= 0 {
		recorded = fmt.Sprint(r.RejectionsRecorded)
	}
	rows := [][2]string{
		{"COORDINATION", "BUSINESS"},
		{fmt.Sprintf("acquisitions\t%d (%.1f/s)", r.Acquisitions, perSecond(r.Acquisitions, r.Elapsed)),
			fmt.Sprintf("completions (read back)\t%d (%.1f/s)", r.Completions, perSecond(r.Completions, r.Elapsed))},
		{fmt.Sprintf("wait p50 / p99\t%.2f / %.2f ms", ms(r.WaitP50), ms(r.WaitP99)),
			fmt.Sprintf("writes accepted (workers)\t%d", r.Accepted)},
		{fmt.Sprintf("give-ups (max wait)\t%d", r.GiveUps),
			fmt.Sprintf("fence rejections\t%d (%d of paused holders; %s recorded)", r.Rejected, r.PausedRejected, recorded)},
		{fmt.Sprintf("renewals\t%d", r.Renewals),
			fmt.Sprintf("late writes accepted\t%d (paused, no newer token written yet)", r.LateAccepted)},
		{fmt.Sprintf("expiries\t%d (%d taken over)", r.Expiries, r.TakenOver),
			fmt.Sprintf("stopped before writing\t%d (trust window ran out)", r.Stopped)},
		{fmt.Sprintf("paused grants\t%d", r.PausedGrants),
			fmt.Sprintf("errors\t%d", r.Errors)},
		{fmt.Sprintf("acquire+write+release p50 / p99\t%.2f / %.2f ms", ms(r.CycleP50), ms(r.CycleP99)), ""},
	}
	for _, row := range rows {
		left := row[0]
		if row == rows[0] {
			left += "\t" // the headings span label and value
		}
		fmt.Fprintf(tw, "%s\t  %s\n", left, row[1])
	}
	tw.Flush()
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", oneLine(r.FirstError))
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "KEY\tACQUISITIONS\tGIVE-UPS\tACCEPTED\tREJECTED\tCOMPLETIONS\tCOUNTER\tLAST TOKEN\t")
	for _, k := range r.PerKey {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", k.Key, k.Acquisitions, k.GiveUps, k.Accepted, k.Rejected, k.Completions, k.Counter, k.LastToken)
	}
	tw.Flush()

	r.writeChecks(w)
}

// writeTasksText is WriteText in the ordered-task mode: the floor and the
// tasks side by side, each key, and the reconciliation.
func (r *ContentionReport) writeTasksText(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "%d producers on %d keys, %d consumers (lease TTL %s): the floor for %s, then the tasks for %s (ran %s)\n\n",
		o.Workers, o.Keys, o.Consumers, o.TTL, r.FloorElapsed.Round(time.Millisecond), o.Duration, r.Elapsed.Round(time.Millisecond))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "FLOOR (bare INSERT of the task rows)\t\t  ORDERED TASKS\n")
	fmt.Fprintf(tw, "rows inserted\t%d (%.1f/s)\t  completions (read back)\t%d (%.1f/s, %.2f× the floor)\n",
		r.FloorInserts, perSecond(r.FloorInserts, r.FloorElapsed), r.Completions, perSecond(r.Completions, r.Elapsed), r.toFloor())
	fmt.Fprintf(tw, "insert p50 / p99\t%.2f / %.2f ms\t  enqueue p50 / p99\t%.2f / %.2f ms\n", ms(r.FloorP50), ms(r.FloorP99), ms(r.EnqueueP50), ms(r.EnqueueP99))
	fmt.Fprintf(tw, "\t\t  enqueue to applied p50 / p99\t%.2f / %.2f ms\n", ms(r.AppliedP50), ms(r.AppliedP99))
	fmt.Fprintf(tw, "\t\t  enqueued / told applied\t%d / %d\n", r.Enqueued, r.Applied)
	fmt.Fprintf(tw, "\t\t  backlog (most at a sample)\t%d\n", r.BacklogMax)
	fmt.Fprintf(tw, "\t\t  batches applied\t%d (%.1f tasks each, %.2f / %.2f ms apart)\n", r.Batches, ratio(r.Completions, r.Batches), ms(r.BatchP50), ms(r.BatchP99))
	fmt.Fprintf(tw, "\t\t  a batch's business write p50 / p99\t%.2f / %.2f ms\n", ms(r.WriteP50), ms(r.WriteP99))
	fmt.Fprintf(tw, "\t\t  statements sent\t%d (%.1f per completion)\n", r.Statements, ratio(r.Statements, r.Completions))
	fmt.Fprintf(tw, "\t\t  errors\t%d\n", r.Errors)
	tw.Flush()
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", oneLine(r.FirstError))
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "KEY\tENQUEUED\tCOMPLETIONS\tCOUNTER\tLAST SEQ\t")
	for _, k := range r.PerKey {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t\n", k.Key, k.Enqueued, k.Completions, k.Counter, k.LastSeq)
	}
	tw.Flush()
	r.writeChecks(w)
}

// writeChecks prints the reconciliation and the settings.
func (r *ContentionReport) writeChecks(w io.Writer) {
	fmt.Fprintln(w)
	verdict := "reconciled"
	if !r.Reconciled {
		verdict = "NOT RECONCILED"
	}
	fmt.Fprintf(w, "Reconciliation: %s\n", verdict)
	for _, c := range r.Checks {
		mark := "ok    "
		if !c.Held {
			mark = "FAILED"
		}
		fmt.Fprintf(w, "  %s %s: %s\n", mark, c.Check, c.Detail)
	}
	fmt.Fprintf(w, "\n%s; %s\n", r.Machine, r.Settings)
}
