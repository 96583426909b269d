// Package benchreport writes a report of `pgfence bench compare`, `curves`
// or `contention` as one self-contained HTML page: the tables the command
// prints, and their curves as inline SVG drawn by gonum's plot. The page
// loads nothing (no script, no style sheet, no font, no image from
// elsewhere) and every value in it is escaped.
package benchreport

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"image/color"
	"io"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// ErrNoCurves is returned when a report has nothing to draw: no point of
// any curve measured something. Nothing is written then.
var ErrNoCurves = errors.New("the run has no curve to draw")

// chart is one figure: its series of (x, y) points.
type chart struct {
	title, x, y string
	// logX asks for a logarithmic x axis, for sizes in powers; it is
	// linear when the points do not span a factor of 10.
	logX   bool
	series []series
}

type series struct {
	name string
	xys  plotter.XYs
}

// add appends (x, y) to the series named name, which it creates (in the
// order of the calls) when it is new. Values that are not finite are left
// out.
func (c *chart) add(name string, x, y float64) {
	if math.IsNaN(y) || math.IsInf(y, 0) {
		return
	}
	i := slices.IndexFunc(c.series, func(s series) bool { return s.name == name })
	if i < 0 {
		c.series = append(c.series, series{name: name})
		i = len(c.series) - 1
	}
	c.series[i].xys = append(c.series[i].xys, plotter.XY{X: x, Y: y})
}

// svg draws c; its y axis starts at 0.
func (c *chart) svg() (template.HTML, error) {
	p := plot.New() // its title is the figure's caption
	p.X.Label.Text, p.Y.Label.Text = c.x, c.y
	// The legend goes to the right of the plot, where it hides no point.
	legend := plot.NewLegend()
	legend.Top = true
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, s := range c.series {
		line, points, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return "", fmt.Errorf("%s, %s: %w", c.title, s.name, err)
		}
		line.Color = plotutil.Color(i)
		points.Shape, points.Color, points.Radius = draw.CircleGlyph{}, plotutil.Color(i), vg.Points(2.5)
		p.Add(line, points)
		legend.Add(s.name, line, points)
		for _, xy := range s.xys {
			lo, hi = min(lo, xy.X), max(hi, xy.X)
		}
	}
	if c.logX && lo > 0 && hi >= 10*lo {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	p.Y.Min = min(p.Y.Min, 0)
	p.Add(plotter.NewGrid())
	p.BackgroundColor = color.White
	canvas := vgsvg.New(8*vg.Inch, 4*vg.Inch)
	dc := draw.New(canvas)
	r := legend.Rectangle(dc)
	p.Draw(draw.Crop(dc, 0, r.Min.X-r.Max.X-vg.Millimeter*3, 0, 0))
	legend.Draw(dc)
	var b bytes.Buffer
	if _, err := canvas.WriteTo(&b); err != nil {
		return "", err
	}
	// Inline in HTML, the SVG element goes without its XML declaration.
	s := b.String()
	return template.HTML(s[strings.Index(s, "<svg"):]), nil // vgsvg escaped every text it wrote
}

var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<title>{{.Title}}</title>
<style>
body { font-family: sans-serif; margin: 2em auto; max-width: 80em; padding: 0 1em; }
figure { margin: 2em 0; }
figure svg { max-width: 100%; height: auto; }
figcaption { font-weight: bold; }
pre { overflow-x: auto; background: #f6f6f6; padding: 1em; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
{{range .Figures}}<figure>
<figcaption>{{.Caption}}</figcaption>
{{.SVG}}
</figure>
{{end}}<h2>Tables</h2>
<pre>{{.Text}}</pre>
</body>
</html>
`))

type figure struct {
	SVG     template.HTML
	Caption string
}

// write renders the page: title, the charts that have a point, and the
// text output of the command.
func write(w io.Writer, title string, charts []*chart, text func(io.Writer)) error {
	var figures []figure
	for _, c := range charts {
		if len(c.series) == 0 {
			continue
		}
		svg, err := c.svg()
		if err != nil {
			return err
		}
		figures = append(figures, figure{SVG: svg, Caption: c.title})
	}
	if len(figures) == 0 {
		return ErrNoCurves
	}
	var b strings.Builder
	text(&b)
	return page.Execute(w, struct {
		Title   string
		Figures []figure
		Text    string
	}{title, figures, b.String()})
}
