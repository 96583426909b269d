package benchreport

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/bench"
	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
)

// drawn is what a test reads of one <figure>: its caption, how many <svg>
// it holds, and how many circles they draw (each data point is one, and so
// is each legend entry).
type drawn struct {
	caption       string
	svgs, circles int
	text          []string // the SVG's text elements: axis labels, ticks, legend
}

// parse reads a report as XML (the page is written so that it is well
// formed) and returns its figures and the text of its <pre>.
func parse(t *testing.T, page []byte) ([]drawn, string) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(page))
	var (
		figures []drawn
		pre     string
		path    []string
	)
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the report does not parse: %v\n%s", err, page)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			path = append(path, tok.Name.Local)
			switch tok.Name.Local {
			case "figure":
				figures = append(figures, drawn{})
			case "svg":
				figures[len(figures)-1].svgs++
			case "path":
				for _, a := range tok.Attr {
					if a.Name.Local == "d" && strings.Contains(a.Value, "A") && slices.Contains(path, "figure") {
						figures[len(figures)-1].circles++
					}
				}
			case "script", "img", "link", "iframe":
				t.Errorf("the report has a <%s> element", tok.Name.Local)
			}
		case xml.EndElement:
			path = path[:len(path)-1]
		case xml.CharData:
			if len(path) == 0 {
				continue
			}
			switch path[len(path)-1] {
			case "figcaption":
				figures[len(figures)-1].caption += string(tok)
			case "text":
				figures[len(figures)-1].text = append(figures[len(figures)-1].text, string(tok))
			case "pre":
				pre += string(tok)
			}
		}
	}
	return figures, pre
}

func point(curve string, x int64, p50 time.Duration) bench.Point {
	return bench.Point{Curve: curve, X: x, Result: benchrun.Result{Case: curve, Workers: 2, Ops: 10, P50: p50, P99: 2 * p50}}
}

// Each curve is one figure beside its floor, one circle per point (and per
// legend entry); what the database or the machine said is escaped, in the
// tables and in the drawings.
func TestCurves(t *testing.T) {
	hostile := `<script>alert(1)</script> & "quotes"`
	rep := &bench.CurvesReport{Machine: "m", Settings: hostile, Points: []bench.Point{
		point("floor-acquire-vs-lock-rows", 1000, time.Millisecond), point("acquire-vs-lease-rows", 1000, 2*time.Millisecond),
		point("floor-acquire-vs-lock-rows", 100_000, time.Millisecond), point("acquire-vs-lease-rows", 100_000, 3*time.Millisecond),
		point("hot-key-waiters", 1, time.Millisecond), point("hot-key-waiters", 4, 2*time.Millisecond), point("hot-key-waiters", 16, 4*time.Millisecond),
		{Curve: "hot-key-waiters", X: 64, Result: benchrun.Result{Skipped: "no"}},
	}}
	var b bytes.Buffer
	if err := Curves(&b, rep); err != nil {
		t.Fatal(err)
	}
	figures, pre := parse(t, b.Bytes())
	var text strings.Builder
	rep.WriteText(&text)
	if pre != text.String() {
		t.Errorf("the tables differ from the text output:\n%s\nwant:\n%s", pre, text.String())
	}
	if !strings.Contains(pre, hostile) || strings.Contains(b.String(), "<script>") {
		t.Errorf("the settings are not there as text, or not escaped")
	}
	want := []drawn{
		{caption: "acquire + release p50 by lease rows, beside the hand-written lock floor", svgs: 1, circles: 4 + 2},
		{caption: "hot key hand-off by waiters", svgs: 1, circles: 6 + 2},
	}
	if len(figures) != len(want) {
		t.Fatalf("%d figures, want %d: %+v", len(figures), len(want), figures)
	}
	for i, f := range figures {
		if f.caption != want[i].caption || f.svgs != want[i].svgs || f.circles != want[i].circles {
			t.Errorf("figure %d: %q, %d svg, %d circles; want %+v", i, f.caption, f.svgs, f.circles, want[i])
		}
	}
	for _, label := range []string{"rows", "p50 (ms)", "pgfence leases", "floor: lock rows", "1000", "100000"} {
		if !slices.Contains(figures[0].text, label) {
			t.Errorf("the first figure has no %q: %q", label, figures[0].text)
		}
	}

	// A name that comes from elsewhere is escaped inside the SVG too.
	c := &chart{title: "t", x: hostile, y: "y"}
	c.add(hostile, 1, 1)
	b.Reset()
	if err := write(&b, "t", []*chart{c}, func(io.Writer) {}); err != nil {
		t.Fatal(err)
	}
	if figures, _ := parse(t, b.Bytes()); len(figures) != 1 || !slices.Contains(figures[0].text, hostile) || strings.Contains(b.String(), "<script>") {
		t.Errorf("the SVG's labels are not escaped text: %+v", figures)
	}
}

// A report with no point to draw writes nothing and says so.
func TestNoCurves(t *testing.T) {
	var b bytes.Buffer
	rep := &bench.CurvesReport{Churn: &bench.Churn{Cycles: 1}, Points: []bench.Point{{Curve: "election-failover", X: 1000, Result: benchrun.Result{Ops: 2}}}}
	if err := Curves(&b, rep); !errors.Is(err, ErrNoCurves) || b.Len() != 0 {
		t.Errorf("curves: %v, %d bytes written", err, b.Len())
	}
	if err := Compare(&b, &bench.Report{Ratios: []bench.Ratio{{Of: "a", To: "b", Measure: "p50", Workers: 1, Rounds: []float64{math.NaN()}}}}); !errors.Is(err, ErrNoCurves) || b.Len() != 0 {
		t.Errorf("compare: %v, %d bytes written", err, b.Len())
	}
}

// The ratios are drawn round by round, a line per concurrency, rounds
// without a ratio left out; the contention figures are rates between
// samples.
func TestCompareAndContention(t *testing.T) {
	var b bytes.Buffer
	rep := &bench.Report{Ratios: []bench.Ratio{
		{Of: "leases", To: "raw-lock-upsert", Measure: "ops/s", Workers: 1, Rounds: []float64{0.9, math.NaN(), 1}},
		{Of: "leases", To: "raw-lock-upsert", Measure: "ops/s", Workers: 8, Rounds: []float64{0.8, 0.85, 0.9}},
		{Of: "fenced-update", To: "raw-fence-row", Measure: "p50", Workers: 1, Rounds: []float64{1.1, 1.2, 1.05}},
	}}
	if err := Compare(&b, rep); err != nil {
		t.Fatal(err)
	}
	figures, _ := parse(t, b.Bytes())
	if len(figures) != 2 || figures[0].circles != 5+2 || figures[1].circles != 3+1 || figures[0].caption != "leases ÷ raw-lock-upsert, ops/s, by round" {
		t.Errorf("compare figures %+v", figures)
	}

	b.Reset()
	crep := &bench.ContentionReport{Samples: []bench.ContentionSample{
		{At: 100 * time.Millisecond, Acquisitions: 10, Accepted: 9},
		{At: 200 * time.Millisecond, Acquisitions: 25, Accepted: 20, Rejected: 1},
		{At: 250 * time.Millisecond, Acquisitions: 25, Accepted: 20, Rejected: 3},
	}}
	if err := Contention(&b, crep); err != nil {
		t.Fatal(err)
	}
	figures, _ = parse(t, b.Bytes())
	// 4 coordination series and 3 business ones, 3 samples each.
	if len(figures) != 2 || figures[0].circles != 4*3+4 || figures[1].circles != 3*3+3 {
		t.Errorf("contention figures %+v", figures)
	}
	// 2 rejections in the last 50ms: 40/s.
	if r := contentionCharts(crep)[1].series[1]; r.name != "fence rejections" || fmt.Sprint(r.xys) != "[{0.1 0} {0.2 10} {0.25 40}]" {
		t.Errorf("%s: %v, want 0, 10 and 40/s", r.name, r.xys)
	}
}
