package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// bench runs every case without errors; the figures themselves are not
// asserted (speed is measured, never tested).
func TestBench(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	code, out, errOut := cli(t, environ, "bench", "--duration", "300ms", "--workers", "1,2", "--json")
	if code != exitOK {
		t.Fatalf("bench: code %d\n%s%s", code, out, errOut)
	}
	var res struct {
		Results []benchResult
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, out)
	}
	if len(res.Results) != 7*2 {
		t.Fatalf("%d results, want 7 cases × 2 concurrencies", len(res.Results))
	}
	for _, r := range res.Results {
		if r.Ops == 0 || r.Errors != 0 {
			t.Errorf("case %s with %d workers: %d ops, %d errors", r.Case, r.Workers, r.Ops, r.Errors)
		}
	}
	if code, _, errOut := cli(t, environ, "bench", "--cases", "nope"); code != exitUsage || !strings.Contains(errOut, "unknown case") {
		t.Fatalf("bench --cases nope: code %d, %s", code, errOut)
	}
}
