package benchreport

import (
	"fmt"
	"io"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/bench"
)

// Compare writes the report of `pgfence bench compare`: each ratio between
// two cases (a pgfence case against its floor, mostly) round by round, one
// line per concurrency.
func Compare(w io.Writer, r *bench.Report) error {
	var charts []*chart
	byPair := map[string]*chart{}
	for _, ratio := range r.Ratios {
		key := ratio.Of + "/" + ratio.To + " " + ratio.Measure
		c := byPair[key]
		if c == nil {
			c = &chart{title: fmt.Sprintf("%s ÷ %s, %s, by round", ratio.Of, ratio.To, ratio.Measure), x: "round", y: ratio.Measure + " ratio"}
			byPair[key] = c
			charts = append(charts, c)
		}
		for i, v := range ratio.Rounds {
			c.add(fmt.Sprintf("%d workers", ratio.Workers), float64(i+1), v)
		}
	}
	return write(w, "pgfence bench compare", charts, r.WriteText)
}
