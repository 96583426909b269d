package console

import (
	"slices"
	"strconv"
	"strings"
)

// timeline is a key's history drawn as SVG: one lane per token, a bar
// across each grant's recorded life (to the right edge for the live one), one mark per event in the order the
// database recorded them (evenly spaced: the order matters, the gaps would
// hide it), rejected writes in red on the lane of the token they presented.
type timeline struct {
	Width, Height int
	Axis          int // the y of the time stamps
	Lanes         []lane
	Marks         []mark
}

type lane struct {
	Y, X1, X2 int
	Token     int64
}

type mark struct {
	Seq, X, Y int
	Kind      string // the CSS class: the event, or "rejected"
	Label     string
	Title     string // the tooltip
	Stamp     string
}

const (
	laneLeft  = 110
	laneTop   = 70
	laneGap   = 34
	markStep  = 72
	axisSpace = 70
)

func draw(items []item, live int64) timeline {
	var tokens []int64
	for _, it := range items {
		if !slices.Contains(tokens, it.Token) {
			tokens = append(tokens, it.Token)
		}
	}
	slices.Sort(tokens)
	axis := laneTop + max(len(tokens), 1)*laneGap
	t := timeline{Width: laneLeft + max(len(items), 1)*markStep + 40, Height: axis + axisSpace, Axis: axis}
	for _, tok := range tokens {
		t.Lanes = append(t.Lanes, lane{Token: tok, Y: laneTop + slices.Index(tokens, tok)*laneGap, X1: -1})
	}
	for i, it := range items {
		l := &t.Lanes[slices.Index(tokens, it.Token)]
		x := laneLeft + i*markStep + markStep/2
		if l.X1 < 0 {
			l.X1 = x
		}
		l.X2 = x
		title := strings.Join(slices.DeleteFunc([]string{stamp(it.At), it.Kind, "token " + strconv.FormatInt(it.Token, 10), it.Holder, it.Detail}, func(s string) bool { return s == "" }), " · ")
		t.Marks = append(t.Marks, mark{Seq: it.Seq, X: x, Y: l.Y, Kind: it.Kind, Label: strings.ReplaceAll(it.Kind, "_", " "),
			Title: title, Stamp: it.At.UTC().Format("15:04:05.000")})
	}
	for i := range t.Lanes {
		if t.Lanes[i].Token == live {
			t.Lanes[i].X2 = t.Width - 10
		}
	}
	return t
}
