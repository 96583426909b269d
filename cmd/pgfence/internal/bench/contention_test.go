package bench

import (
	"strings"
	"testing"
)

// Each reconciliation check can fail, on the kind of table it is there to
// catch, and all hold on a table that matches what the workers saw.
func TestReconcile(t *testing.T) {
	keys := []string{"k/0", "k/1"}
	writes := []grantWrite{{key: 0, token: 1, accepted: true}, {key: 0, token: 2}, {key: 0, token: 3, accepted: true}, {key: 1, token: 1, accepted: true}}
	good := []completion{{key: "k/0", token: 1, n: 1}, {key: "k/1", token: 1, n: 1}, {key: "k/0", token: 3, n: 2}}
	counters := map[string]int64{"k/0": 2, "k/1": 1}

	held := func(checks []ContentionCheck) map[string]bool {
		m := map[string]bool{}
		for _, c := range checks {
			m[c.Check] = c.Held
		}
		return m
	}
	per, checks := reconcile(keys, writes, good, counters)
	for _, c := range checks {
		if !c.Held {
			t.Errorf("a matching table fails %q: %s", c.Check, c.Detail)
		}
	}
	if len(checks) != 4 {
		t.Fatalf("%d checks, want 4", len(checks))
	}
	if p := per[0]; p.Accepted != 2 || p.Rejected != 1 || p.Completions != 2 || p.Counter != 2 || p.LastToken != 3 {
		t.Errorf("key k/0: %+v", p)
	}

	for name, tc := range map[string]struct {
		table    []completion
		counters map[string]int64
		fails    []string // checks, by their first word after "the"/"each"/…
	}{
		"a row missing": {table: good[:2], counters: map[string]int64{"k/0": 1, "k/1": 1},
			fails: []string{"the completions"}},
		"a counter off": {table: good, counters: map[string]int64{"k/0": 3, "k/1": 1},
			fails: []string{"each key's counter"}},
		"a lost update": {table: []completion{good[0], good[1], {key: "k/0", token: 3, n: 1}}, counters: counters,
			fails: []string{"each key's counter"}},
		"tokens out of order": {table: []completion{{key: "k/0", token: 3, n: 1}, good[1], {key: "k/0", token: 1, n: 2}}, counters: counters,
			fails: []string{"tokens strictly", "no stale write"}},
		"a rejected write's row": {table: []completion{good[0], good[1], {key: "k/0", token: 2, n: 2}, {key: "k/0", token: 3, n: 3}}, counters: map[string]int64{"k/0": 3, "k/1": 1},
			fails: []string{"the completions", "no stale write"}},
	} {
		_, checks := reconcile(keys, writes, tc.table, tc.counters)
		for check, ok := range held(checks) {
			want := true
			for _, f := range tc.fails {
				if strings.HasPrefix(check, f) {
					want = false
				}
			}
			if ok != want {
				t.Errorf("%s: check %q held = %v, want %v", name, check, ok, want)
			}
		}
	}
}
