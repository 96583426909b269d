package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
)

func TestMedianRun(t *testing.T) {
	runs := []benchrun.Result{
		{OpsPerS: 300, P50: 3 * time.Millisecond},
		{OpsPerS: 100, P50: 1 * time.Millisecond, Errors: 2, FirstError: "first"},
		{OpsPerS: 200, P50: 2 * time.Millisecond, Errors: 1, FirstError: "second"},
	}
	m := medianRun(runs)
	if m.OpsPerS != 200 || m.P50 != 2*time.Millisecond {
		t.Errorf("median of 100, 200, 300 ops/s: %+v", m)
	}
	if m.Errors != 3 || m.FirstError != "first" {
		t.Errorf("errors %d (%q), want every run's 3 and the first one's text", m.Errors, m.FirstError)
	}
	if m := medianRun(runs[:2]); m.OpsPerS != 100 {
		t.Errorf("median of two runs: %v ops/s, want the lower", m.OpsPerS)
	}
	if m := medianRun(runs[:1]); m.OpsPerS != 300 {
		t.Errorf("one run: %v ops/s", m.OpsPerS)
	}
}

// A peer that overruns its deadline is interrupted (so it can stop its
// redis-server), never left running, and its row says why it has no figure.
func TestPeerDeadline(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mark := filepath.Join(dir, "mark")
	peer := filepath.Join(dir, "hanging-peer")
	script := "#!/bin/sh\ntrap 'echo interrupted > " + mark + "; kill $!; exit 1' INT\nsleep 30 &\nwait $!\n"
	if err := os.WriteFile(peer, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var progress strings.Builder
	p := &peerRunner{progress: &progress, resolved: true, bin: peer, grace: 300 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := p.measure(ctx, "memory", 1, Timing{Duration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.Skipped, "did not finish within 400ms") || r.Ops != 0 {
		t.Errorf("%+v, want skipped for the deadline", r)
	}
	if got, err := os.ReadFile(mark); err != nil || strings.TrimSpace(string(got)) != "interrupted" {
		t.Errorf("the peer was not interrupted (%q, %v)", got, err)
	}
}

// Ratios between cases are taken round by round, between runs that ran next
// to each other; rounds where a side did not run are left out.
func TestCompareRoundByRound(t *testing.T) {
	run := func(name string, p50ms, ops float64) benchrun.Result {
		return benchrun.Result{Case: name, Workers: 1, Ops: 100, P50: time.Duration(p50ms * float64(time.Millisecond)), OpsPerS: ops}
	}
	skipped := benchrun.Result{Case: "redis-durable", Workers: 1, Skipped: "no redis-server"}
	out, ratios := compare([][]benchrun.Result{
		{run("raw-update", 1, 0), run("raw-update", 2, 0), run("raw-update", 1, 0)},
		// Chosen by themselves, the median runs would be 2.4 against 1: 2.4×.
		{run("fenced-update", 1.1, 0), run("fenced-update", 2.4, 0), run("fenced-update", 1.3, 0)},
		{run("leases", 0, 90), run("leases", 0, 80), run("leases", 0, 50)},
		{run("raw-lock-upsert", 0, 100), run("raw-lock-upsert", 0, 100), run("raw-lock-upsert", 0, 50)},
		{skipped, run("redis-durable", 0, 40), skipped},
	})
	want := []string{
		"  1 workers: leases acquire+release at 90% (3 rounds: 80% to 100%) of the raw inline-upsert floor's ops/s (goal ≥ 95%)",
		"  1 workers: leases acquire+release at 200% of durable Redis (redsync) ops/s (goal at 8 workers: ≥ 100%)",
		"  1 workers: fenced write (pgfence.Exec) p50 1.20× (3 rounds: 1.10× to 1.30×) the unfenced UPDATE",
	}
	if !slices.Equal(out, want) {
		t.Errorf("compare:\n%s\nwant:\n%s", strings.Join(out, "\n"), strings.Join(want, "\n"))
	}
	// The same ratios, each round's kept for the HTML report's curves.
	var got []string
	for _, r := range ratios {
		got = append(got, fmt.Sprintf("%s/%s %s %d: %.2f", r.Of, r.To, r.Measure, r.Workers, r.Rounds))
	}
	wantRatios := []string{
		"leases/raw-lock-upsert ops/s 1: [0.90 0.80 1.00]",
		"leases/redis-durable ops/s 1: [NaN 2.00 NaN]",
		"fenced-update/raw-update p50 1: [1.10 1.20 1.30]",
	}
	if !slices.Equal(got, wantRatios) {
		t.Errorf("ratios:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantRatios, "\n"))
	}
}

// The scale verdicts compare the largest size with 10^3, not with the
// resources curve's first point (one row every worker writes), and show each
// floor beside pgfence's curve.
func TestCurveVerdictsFromOneThousand(t *testing.T) {
	point := func(curve string, x int64, p50ms float64) Point {
		return Point{Curve: curve, X: x, Result: benchrun.Result{Ops: 100, P50: time.Duration(p50ms * float64(time.Millisecond))}}
	}
	out := curveVerdicts([]Point{
		point("floor-acquire-vs-lock-rows", 1000, 1), point("acquire-vs-lease-rows", 1000, 1.2),
		point("floor-acquire-vs-lock-rows", 10_000_000, 1.3), point("acquire-vs-lease-rows", 10_000_000, 1.8),
		point("floor-write-vs-fence-rows", 1, 9), point("fenced-write-vs-resources", 1, 9),
		point("floor-write-vs-fence-rows", 1000, 0.5), point("fenced-write-vs-resources", 1000, 0.8),
		point("floor-write-vs-fence-rows", 10_000_000, 0.6), point("fenced-write-vs-resources", 10_000_000, 1.0),
		point("claim-vs-keys", 10_000, 1.4),
	}, nil)
	want := []string{
		"acquire + release, by lease rows: p50 at 10000000 rows is 1.50× that at 1000 (goal ≤ 1.5× from 10^3 to 10^7)",
		"the hand-written lock floor, by lock rows: p50 at 10000000 rows is 1.30× that at 1000 (the same growth without pgfence)",
		"fenced write, by fenced resources: p50 at 10000000 rows is 1.25× that at 1000 (goal ≤ 1.5× from 10^3 to 10^7)",
		"the hand-written fence row floor, by fence rows: p50 at 10000000 rows is 1.20× that at 1000 (the same growth without pgfence)",
	}
	if !slices.Equal(out, want) {
		t.Errorf("verdicts:\n%s\nwant:\n%s", strings.Join(out, "\n"), strings.Join(want, "\n"))
	}
}
