package demo

import (
	"strings"
	"testing"
	"time"
)

// A long detail line goes under WHAT, cut, and does not widen the columns:
// the TOKEN column starts right after the longest action.
func TestPrintDemoColumns(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	rep := &Report{OK: true, Database: "embedded", Timeline: []Event{
		{At: at, Actor: "A", Action: "acquire lease k", Token: 7, Result: "granted", Detail: strings.Repeat("d", 500)},
		{At: at, Actor: "B", Action: "a somewhat longer action", Result: "rejected"},
	}}
	var b strings.Builder
	rep.WriteText(&b)
	lines := strings.Split(b.String(), "\n")
	var header, detail, row string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "DB TIME"):
			header = l
		case strings.Contains(l, "ddd"):
			detail = l
		case strings.Contains(l, "a somewhat longer action"):
			row = l
		}
	}
	if want := strings.Index(header, "TOKEN"); want != len("10:00:00.000  B    a somewhat longer action  ") || strings.Index(row, "-") != want {
		t.Errorf("TOKEN column at %d, row's token at %d, want right after the longest action:\n%s", want, strings.Index(row, "-"), b.String())
	}
	if !strings.HasPrefix(detail, strings.Repeat(" ", len("10:00:00.000  A    ")+2)+"ddd") || !strings.HasSuffix(detail, "...") ||
		len(strings.TrimSpace(detail)) != demoDetailWidth {
		t.Errorf("detail line %q: want it indented under WHAT and cut to %d characters", detail, demoDetailWidth)
	}
}
