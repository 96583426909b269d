package benchreport

import (
	"io"
	"math"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/bench"
)

// The charts of `pgfence bench curves`: each pgfence curve beside its floor,
// the hand-off against waiters, the idle followers' load and what the
// retention curve left. The churn and failover measurements have no curve:
// they are in the tables.
var (
	// A latency of no operation is no point.
	p50 = func(p bench.Point) float64 { return latency(p, p.P50) }
	p99 = func(p bench.Point) float64 { return latency(p, p.P99) }
	sps = func(p bench.Point) float64 { return p.StatementsPerS }

	curveCharts = []struct {
		title, x, y string
		series      []curveSeries
	}{
		{"acquire + release p50 by lease rows, beside the hand-written lock floor", "rows", "p50 (ms)", []curveSeries{
			{"acquire-vs-lease-rows", "pgfence leases", p50}, {"floor-acquire-vs-lock-rows", "floor: lock rows", p50}}},
		{"idempotency claim p50 by stored keys", "keys", "p50 (ms)", []curveSeries{
			{"claim-vs-keys", "idempotency.Store.Do", p50}}},
		{"fenced write p50 by resources, beside the hand-written fence row floor", "resources", "p50 (ms)", []curveSeries{
			{"fenced-write-vs-resources", "pgfence.Exec", p50}, {"floor-write-vs-fence-rows", "floor: fence rows", p50}}},
		{"hot key hand-off by waiters", "waiters", "hand-off (ms)", []curveSeries{
			{"hot-key-waiters", "p50", p50}, {"hot-key-waiters", "p99", p99}}},
		{"idle followers' statements/s by followers", "followers", "statements/s", []curveSeries{
			{"idle-followers", "followers", sps}, {"idle-followers-leader", "the leader", sps}}},
	}
)

type curveSeries struct {
	curve, name string
	y           func(bench.Point) float64
}

// Curves writes the report of `pgfence bench curves`.
func Curves(w io.Writer, r *bench.CurvesReport) error {
	var charts []*chart
	for _, cc := range curveCharts {
		c := &chart{title: cc.title, x: cc.x, y: cc.y, logX: true}
		for _, s := range cc.series {
			for _, p := range r.Points {
				if p.Curve == s.curve && p.Skipped == "" {
					c.add(s.name, float64(p.X), s.y(p))
				}
			}
		}
		charts = append(charts, c)
	}
	if rt := r.Retention; rt != nil {
		c := &chart{title: "pgfence's tables by one-off resources made, before and after each maintenance", x: "one-off resources", y: "size (kB)"}
		for _, cy := range rt.Cycles {
			c.add("before", float64(cy.Resources), float64(cy.Bytes)/1024)
			c.add("after", float64(cy.Resources), float64(cy.BytesAfter)/1024)
		}
		charts = append(charts, c)
	}
	return write(w, "pgfence bench curves", charts, r.WriteText)
}

func latency(p bench.Point, d time.Duration) float64 {
	if p.Ops == 0 {
		return math.NaN()
	}
	return float64(d) / float64(time.Millisecond)
}
