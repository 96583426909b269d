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
