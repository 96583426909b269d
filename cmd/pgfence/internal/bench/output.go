package bench

import (
	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
)

// The JSON that `pgfence bench compare --json` and `pgfence bench curves
// --json` print: the CLI's rules (snake_case keys, an object at the top,
// durations as integer milliseconds in keys ending _ms), except for latency
// percentiles, which are integer microseconds in keys ending _us: a
// fraction of a millisecond is what they measure.

// ResultJSON is one case, or one curve point, at one concurrency.
type ResultJSON struct {
	// Case names the case; absent in a curve's point, named by its curve.
	Case       string `json:"case,omitempty"`
	Group      string `json:"group,omitempty"`
	What       string `json:"what,omitempty"`
	Workers    int    `json:"workers"`
	Ops        int    `json:"ops"`
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// Held counts attempts that found their random key held by another worker.
	Held            int     `json:"held"`
	ElapsedMS       int64   `json:"elapsed_ms"`
	OpsPerS         float64 `json:"ops_per_s"`
	P50US           int64   `json:"p50_us"`
	P99US           int64   `json:"p99_us"`
	Statements      int64   `json:"statements"`
	StatementsPerOp float64 `json:"statements_per_op"`
	StatementsPerS  float64 `json:"statements_per_s"`
	// Skipped, when set, says why the case did not run; its figures are 0.
	Skipped string `json:"skipped,omitempty"`
}

func resultJSON(r benchrun.Result) ResultJSON {
	return ResultJSON{Case: r.Case, Group: r.Group, What: r.What, Workers: r.Workers, Ops: r.Ops, Errors: r.Errors,
		FirstError: r.FirstError, Held: r.Held, ElapsedMS: r.Elapsed.Milliseconds(), OpsPerS: r.OpsPerS,
		P50US: r.P50.Microseconds(), P99US: r.P99.Microseconds(), Statements: r.Statements,
		StatementsPerOp: r.StatementsPerOp, StatementsPerS: r.StatementsPerS, Skipped: r.Skipped}
}

// CompareJSON is the output of `pgfence bench compare --json`.
type CompareJSON struct {
	Machine     string       `json:"machine"`
	Settings    string       `json:"settings"`
	DurationMS  int64        `json:"duration_ms"`
	WarmupMS    int64        `json:"warmup_ms"`
	Rounds      int          `json:"rounds"`
	Results     []ResultJSON `json:"results"`
	Comparisons []string     `json:"comparisons"`
}

// JSON returns the report as `pgfence bench compare --json` prints it.
func (r *Report) JSON() CompareJSON {
	out := CompareJSON{Machine: r.Machine, Settings: r.Settings, DurationMS: r.Timing.Duration.Milliseconds(), WarmupMS: r.Timing.Warmup.Milliseconds(),
		Rounds: r.Rounds, Results: make([]ResultJSON, 0, len(r.Results)), Comparisons: nonNil(r.Comparisons)}
	for _, res := range r.Results {
		out.Results = append(out.Results, resultJSON(res))
	}
	return out
}

// PointJSON is one point of a curve: the curve's size X and what was measured
// there.
type PointJSON struct {
	Curve string `json:"curve"`
	X     int64  `json:"x"`
	ResultJSON
}

// TableStatsJSON is what the churn curve read of pgfence.leases and
// pgfence.lease_events, named as in pg_stat_user_tables.
type TableStatsJSON struct {
	LiveTuples         int64 `json:"n_live_tup"`
	DeadTuples         int64 `json:"n_dead_tup"`
	Updates            int64 `json:"n_tup_upd"`
	HotUpdates         int64 `json:"n_tup_hot_upd"`
	Vacuums            int64 `json:"autovacuum_count"`
	TotalBytes         int64 `json:"total_bytes"`
	EventRows          int64 `json:"lease_events_rows"`
	EventsBytes        int64 `json:"lease_events_total_bytes"`
	EventsDeadTuples   int64 `json:"lease_events_n_dead_tup"`
	EventsVacuumsCount int64 `json:"lease_events_autovacuum_count"`
}

func tableStatsJSON(s TableStats) TableStatsJSON {
	return TableStatsJSON{LiveTuples: s.LiveTuples, DeadTuples: s.DeadTuples, Updates: s.Updates, HotUpdates: s.HotUpdates,
		Vacuums: s.Vacuums, TotalBytes: s.TotalBytes, EventRows: s.EventRows, EventsBytes: s.EventsBytes,
		EventsDeadTuples: s.EventsDead, EventsVacuumsCount: s.EventsVacuums}
}

// ChurnJSON is the churn measurement.
type ChurnJSON struct {
	Cycles     int64          `json:"cycles"`
	Keys       int            `json:"keys"`
	ElapsedMS  int64          `json:"elapsed_ms"`
	CyclesPerS float64        `json:"cycles_per_s"`
	Before     TableStatsJSON `json:"before"`
	After      TableStatsJSON `json:"after"`
	Settings   string         `json:"settings"`
}

// CurvesJSON is the output of `pgfence bench curves --json`.
type CurvesJSON struct {
	Machine    string      `json:"machine"`
	Settings   string      `json:"settings"`
	DurationMS int64       `json:"duration_ms"`
	WarmupMS   int64       `json:"warmup_ms"`
	Workers    int         `json:"workers"`
	Points     []PointJSON `json:"points"`
	// Churn is absent unless the churn curve ran.
	Churn *ChurnJSON `json:"churn,omitempty"`
	// Retention is absent unless the retention curve ran.
	Retention     *RetentionJSON `json:"retention,omitempty"`
	Comparisons   []string       `json:"comparisons"`
	FenceRowsKept bool           `json:"fence_rows_kept"`
}

// JSON returns the report as `pgfence bench curves --json` prints it.
func (r *CurvesReport) JSON() CurvesJSON {
	out := CurvesJSON{Machine: r.Machine, Settings: r.Settings, DurationMS: r.Timing.Duration.Milliseconds(), WarmupMS: r.Timing.Warmup.Milliseconds(),
		Workers: r.Workers, Points: make([]PointJSON, 0, len(r.Points)), Comparisons: nonNil(r.Comparisons), FenceRowsKept: r.FenceRowsKept}
	for _, p := range r.Points {
		r := resultJSON(p.Result)
		r.Case = ""
		out.Points = append(out.Points, PointJSON{Curve: p.Curve, X: p.X, ResultJSON: r})
	}
	if c := r.Churn; c != nil {
		out.Churn = &ChurnJSON{Cycles: c.Cycles, Keys: c.Keys, ElapsedMS: c.Elapsed.Milliseconds(), CyclesPerS: c.CyclesPerS,
			Before: tableStatsJSON(c.Before), After: tableStatsJSON(c.After), Settings: c.Settings}
	}
	if rt := r.Retention; rt != nil {
		out.Retention = &RetentionJSON{Resources: rt.Resources, Cycles: make([]RetentionCycleJSON, 0, len(rt.Cycles))}
		for _, c := range rt.Cycles {
			out.Retention.Cycles = append(out.Retention.Cycles, RetentionCycleJSON(c))
		}
	}
	return out
}

// RetentionJSON is the retention curve: one-off resources made in cycles,
// pgfence's tables before and after each cycle's maintenance.
type RetentionJSON struct {
	Resources int64                `json:"resources"`
	Cycles    []RetentionCycleJSON `json:"cycles"`
}

// RetentionCycleJSON is one cycle; bytes are the leases, fences and
// lease_events tables with their indexes.
type RetentionCycleJSON struct {
	Resources  int64 `json:"resources"`
	Rows       int64 `json:"rows_before"`
	Bytes      int64 `json:"bytes_before"`
	RowsAfter  int64 `json:"rows_after"`
	BytesAfter int64 `json:"bytes_after"`
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
