package benchreport

import (
	"io"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/bench"
)

// Contention writes the report of `pgfence bench contention`: its
// coordination and business figures over the run, as rates between one
// sample of the workers' counters and the next.
func Contention(w io.Writer, r *bench.ContentionReport) error {
	return write(w, "pgfence bench contention", contentionCharts(r), r.WriteText)
}

func contentionCharts(r *bench.ContentionReport) []*chart {
	if r.Options.Mode == bench.ModeTasks {
		return tasksCharts(r)
	}
	coordination := &chart{title: "coordination over the run", x: "seconds since the start", y: "per second"}
	business := &chart{title: "business writes over the run", x: "seconds since the start", y: "per second"}
	var prev bench.ContentionSample
	for _, s := range r.Samples {
		d := (s.At - prev.At).Seconds()
		if d <= 0 {
			continue
		}
		t := s.At.Seconds()
		rate := func(now, before int64) float64 { return float64(now-before) / d }
		coordination.add("acquisitions", t, rate(s.Acquisitions, prev.Acquisitions))
		coordination.add("give-ups", t, rate(s.GiveUps, prev.GiveUps))
		coordination.add("renewals", t, rate(s.Renewals, prev.Renewals))
		coordination.add("expiries", t, rate(s.Expiries, prev.Expiries))
		business.add("accepted", t, rate(s.Accepted, prev.Accepted))
		business.add("fence rejections", t, rate(s.Rejected, prev.Rejected))
		business.add("stopped before writing", t, rate(s.Stopped, prev.Stopped))
		prev = s
	}
	return []*chart{coordination, business}
}

// tasksCharts draws --mode tasks: the floor's inserts, the tasks enqueued
// and applied, each as rates over its own part of the run, and the backlog.
func tasksCharts(r *bench.ContentionReport) []*chart {
	floor := &chart{title: "the floor over its run", x: "seconds since the start", y: "per second"}
	tasks := &chart{title: "ordered tasks over the run", x: "seconds since the start", y: "per second"}
	backlog := &chart{title: "backlog over the run", x: "seconds since the start", y: "tasks enqueued, not yet applied"}
	var prev bench.ContentionSample
	for _, s := range r.FloorSamples {
		if d := (s.At - prev.At).Seconds(); d > 0 {
			floor.add("bare INSERTs", s.At.Seconds(), float64(s.FloorInserts-prev.FloorInserts)/d)
			prev = s
		}
	}
	prev = bench.ContentionSample{}
	for _, s := range r.Samples {
		if d := (s.At - prev.At).Seconds(); d > 0 {
			t := s.At.Seconds()
			tasks.add("enqueued", t, float64(s.Enqueued-prev.Enqueued)/d)
			tasks.add("applied", t, float64(s.Applied-prev.Applied)/d)
			backlog.add("backlog", t, float64(s.Backlog))
			prev = s
		}
	}
	return []*chart{floor, tasks, backlog}
}
