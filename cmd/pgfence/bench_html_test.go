package main

import (
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/pgfence/pgfence/internal/testkit/browser"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// benchHTMLReport runs a short `pgfence bench curves --html` on a fresh
// database and returns the report's path, the text the command printed and
// the captions of the curves the report draws, one <svg> each: the rows
// curve beside its floor, the resources curve beside its floor, and the
// hand-off against waiters. A browser test opens the file and expects one
// rendered SVG per caption.
func benchHTMLReport(t *testing.T) (path, out string, captions []string) {
	t.Helper()
	db := pgfencetest.NewDatabase(t)
	path = filepath.Join(t.TempDir(), "report.html")
	code, out, errOut := cli(t, map[string]string{"DATABASE_URL": db.URL}, "bench", "curves", "--curves", "rows,resources,waiters",
		"--duration", "100ms", "--warmup", "0s", "--workers", "2", "--max-rows", "1e4", "--max-resources", "10", "--max-waiters", "4", "--html", path)
	if code != exitOK {
		t.Fatalf("bench curves --html: code %d\n%s%s", code, out, errOut)
	}
	return path, out, []string{
		"acquire + release p50 by lease rows, beside the hand-written lock floor",
		"fenced write p50 by resources, beside the hand-written fence row floor",
		"hot key hand-off by waiters",
	}
}

// htmlFigure is what a test reads of one <figure> of a report: its caption,
// its <svg> elements and the circles they draw (one per data point and one
// per legend entry).
type htmlFigure struct {
	caption       string
	svgs, circles int
}

// readHTMLReport parses the report at path as XML (it is written well
// formed) and returns its figures and the text of its <pre>, the tables.
func readHTMLReport(t *testing.T, path string) ([]htmlFigure, string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := xml.NewDecoder(f)
	var (
		figures []htmlFigure
		pre     string
		open    []string
	)
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return figures, pre
		}
		if err != nil {
			t.Fatalf("%s does not parse: %v", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			open = append(open, tok.Name.Local)
			switch tok.Name.Local {
			case "figure":
				figures = append(figures, htmlFigure{})
			case "svg":
				figures[len(figures)-1].svgs++
			case "path":
				for _, a := range tok.Attr {
					if a.Name.Local == "d" && strings.Contains(a.Value, "A") {
						figures[len(figures)-1].circles++
					}
				}
			case "script", "img", "link", "iframe", "object":
				t.Errorf("%s has a <%s> element: it must load nothing", path, tok.Name.Local)
			}
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			switch {
			case len(open) == 0:
			case open[len(open)-1] == "figcaption":
				figures[len(figures)-1].caption += string(tok)
			case open[len(open)-1] == "pre":
				pre += string(tok)
			}
		}
	}
}

// --html writes one page with a figure per curve, each one SVG with its data
// points, and the tables the command printed.
func TestBenchHTML(t *testing.T) {
	t.Parallel()
	t.Run("curves", func(t *testing.T) {
		t.Parallel()
		path, out, captions := benchHTMLReport(t)
		figures, pre := readHTMLReport(t, path)
		var got []string
		for _, f := range figures {
			got = append(got, f.caption)
			// Two sizes on every line, two lines in every figure (a curve
			// and its floor; the hand-off's p50 and p99), and a legend.
			if f.svgs != 1 || f.circles != 2*2+2 {
				t.Errorf("figure %q: %d svg, %d circles; want 1 svg and 4 points plus 2 legend entries", f.caption, f.svgs, f.circles)
			}
		}
		if !slices.Equal(got, captions) {
			t.Errorf("figures %q, want %q", got, captions)
		}
		if pre != out || !strings.Contains(pre, "P50 MS") {
			t.Errorf("the report's tables are not the command's output:\n%s\nwant:\n%s", pre, out)
		}
		if b, err := os.ReadFile(path); err != nil || strings.Contains(string(b), "src=") || strings.Contains(string(b), "href=") || strings.Contains(string(b), "url(") {
			t.Errorf("the report refers to something outside it (%v)", err)
		}
	})
	t.Run("compare", func(t *testing.T) {
		t.Parallel()
		db := pgfencetest.NewDatabase(t)
		path := filepath.Join(t.TempDir(), "compare.html")
		code, out, errOut := cli(t, map[string]string{"DATABASE_URL": db.URL}, "bench", "compare", "--cases", "leases,raw-lock-upsert",
			"--workers", "1,2", "--rounds", "2", "--duration", "100ms", "--warmup", "0s", "--peers", "none", "--json", "--html", path)
		if code != exitOK {
			t.Fatalf("bench compare --html: code %d\n%s%s", code, out, errOut)
		}
		benchJSON(t, out) // stdout still has the JSON
		figures, pre := readHTMLReport(t, path)
		// One ratio, a line per concurrency, a point per round.
		if len(figures) != 1 || figures[0].caption != "leases ÷ raw-lock-upsert, ops/s, by round" || figures[0].svgs != 1 || figures[0].circles != 2*2+2 {
			t.Errorf("figures %+v", figures)
		}
		if !strings.Contains(pre, "raw-lock-upsert") || !strings.Contains(pre, "Against the goals") {
			t.Errorf("no tables in the report:\n%s", pre)
		}
	})
	t.Run("contention", func(t *testing.T) {
		t.Parallel()
		db := pgfencetest.NewDatabase(t)
		path := filepath.Join(t.TempDir(), "contention.html")
		code, out, errOut := cli(t, map[string]string{"DATABASE_URL": db.URL}, "bench", "contention", "--workers", "2", "--keys", "1",
			"--duration", "300ms", "--pause-rate", "0", "--html", path)
		if code != exitOK {
			t.Fatalf("bench contention --html: code %d\n%s%s", code, out, errOut)
		}
		figures, pre := readHTMLReport(t, path)
		// At least the sample at the end, on 4 and 3 lines with their
		// legend entries (how many more the ticker took depends on the
		// machine's load).
		if len(figures) != 2 || figures[0].caption != "coordination over the run" || figures[1].caption != "business writes over the run" ||
			figures[0].circles < 4+4 || figures[1].circles < 3+3 || figures[0].svgs != 1 || figures[1].svgs != 1 {
			t.Errorf("figures %+v", figures)
		}
		if pre != out || !strings.Contains(pre, "Reconciliation: reconciled") {
			t.Errorf("the report's tables are not the command's output:\n%s", pre)
		}
	})
	t.Run("contention tasks", func(t *testing.T) {
		t.Parallel()
		db := pgfencetest.NewDatabase(t)
		path := filepath.Join(t.TempDir(), "tasks.html")
		code, out, errOut := cli(t, map[string]string{"DATABASE_URL": db.URL}, "bench", "contention", "--mode", "tasks", "--workers", "2", "--keys", "1",
			"--duration", "300ms", "--html", path)
		if code != exitOK {
			t.Fatalf("bench contention --mode tasks --html: code %d\n%s%s", code, out, errOut)
		}
		figures, pre := readHTMLReport(t, path)
		// At least the sample at the end of each part, on 1, 2 and 1
		// lines with their legend entries.
		if len(figures) != 3 || figures[0].caption != "the floor over its run" || figures[1].caption != "ordered tasks over the run" ||
			figures[2].caption != "backlog over the run" || figures[0].circles < 1+1 || figures[1].circles < 2+2 || figures[2].circles < 1+1 {
			t.Errorf("figures %+v", figures)
		}
		if pre != out || !strings.Contains(pre, "ORDERED TASKS") {
			t.Errorf("the report's tables are not the command's output:\n%s", pre)
		}
	})
}

// A report that cannot be written fails before the run; a run with nothing
// to draw prints its figures, says why there is no report and writes none.
func TestBenchHTMLBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct{ path, msg string }{
		{filepath.Join(dir, "missing", "r.html"), "--html: cannot write " + filepath.Join(dir, "missing", "r.html")},
		{dir, "--html: " + dir + " is a directory"},
	} {
		// No database: the file is checked before one is opened.
		code, out, errOut := cli(t, nil, "bench", "compare", "--html", tc.path, "--database-url", "postgres://app@127.0.0.1:1/x")
		if code != exitUsage || !strings.Contains(errOut, tc.msg) || out != "" {
			t.Errorf("--html %s: code %d, want %d with %q\n%s%s", tc.path, code, exitUsage, tc.msg, out, errOut)
		}
	}

	db := pgfencetest.NewDatabase(t)
	path := filepath.Join(dir, "r.html")
	code, out, errOut := cli(t, map[string]string{"DATABASE_URL": db.URL}, "bench", "compare", "--cases", "raw-update",
		"--workers", "1", "--duration", "100ms", "--warmup", "0s", "--peers", "none", "--html", path)
	if code != exitUsage || !strings.Contains(errOut, "--html: the run has no curve to draw, so "+path+" was not written") ||
		!strings.Contains(errOut, "hint: the report draws the ratios between two cases") || !strings.Contains(out, "raw-update") {
		t.Errorf("compare of one case: code %d\n%s%s", code, out, errOut)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("files left in %s: %v", dir, left)
	}
}

// TestBenchHTMLInChromium opens the report of a short run in Chromium, as
// the person who asked for it will: every curve's figure renders one SVG
// with a drawing area and its points, under its caption, and the page loads
// nothing from elsewhere.
func TestBenchHTMLInChromium(t *testing.T) {
	path, _, captions := benchHTMLReport(t)
	ctx := browser.New(t)
	if err := chromedp.Do(ctx, chromedp.Navigate("file://"+path)); err != nil {
		t.Fatal(err)
	}
	type figure struct {
		Caption       string
		SVGs, Circles int
		Width, Height float64
	}
	figures, err := chromedp.Run(ctx, chromedp.Evaluate[[]figure](`[...document.querySelectorAll("figure")].map(f => {
		const svg = f.querySelector("svg"), box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
		return {Caption: (f.querySelector("figcaption") || {}).textContent || "", SVGs: f.querySelectorAll("svg").length,
		        Circles: [...f.querySelectorAll("path")].filter(p => (p.getAttribute("d") || "").includes("A")).length, Width: box.width, Height: box.height};
	})`))
	if err != nil {
		t.Fatal(err)
	}
	parsed, _ := readHTMLReport(t, path)
	if len(figures) != len(captions) || len(parsed) != len(captions) {
		t.Fatalf("Chromium shows %d figures, the file has %d, want %d (one per curve): %+v", len(figures), len(parsed), len(captions), figures)
	}
	for i, f := range figures {
		if !strings.Contains(f.Caption, captions[i]) {
			t.Errorf("figure %d: caption %q, want %q", i, f.Caption, captions[i])
		}
		// The points (arcs) Chromium finds are the ones the file holds.
		if f.SVGs != 1 || f.Circles < 2 || f.Circles != parsed[i].circles || f.Width < 100 || f.Height < 100 {
			t.Errorf("figure %q: %d SVGs, %d points (the file has %d), %.0f×%.0f px; want one SVG with its points, at least 100×100",
				f.Caption, f.SVGs, f.Circles, parsed[i].circles, f.Width, f.Height)
		}
	}
	external, err := chromedp.Run(ctx, chromedp.Evaluate[int](`performance.getEntriesByType("resource").length`))
	if err != nil {
		t.Fatal(err)
	}
	if external != 0 {
		t.Errorf("the report loaded %d resources; it must be self-contained", external)
	}
	browser.Screenshot(t, ctx, "bench-curves-report")
}
