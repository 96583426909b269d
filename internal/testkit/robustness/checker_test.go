package robustness

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// A good history: two holders, a takeover, a stale write rejected, an unknown
// write that landed and one that did not, an idempotent intent executed once
// and answered twice.
func goodHistory() ([]Op, Truth) {
	ops := []Op{
		{Client: 0, Kind: Acquire, Key: "r", Token: 10, Outcome: OK, Call: 0, Return: 10},
		{Client: 0, Kind: Write, Key: "r", Token: 10, Value: "a1", Outcome: OK, Call: 11, Return: 20},
		{Client: 0, Kind: Effect, Key: "i", Value: "a", Result: "a", Outcome: OK, Call: 21, Return: 30},
		// client 0 pauses; the lease expires; client 1 takes over.
		{Client: 1, Kind: Acquire, Key: "r", Token: 11, Outcome: OK, Call: 40, Return: 50},
		{Client: 1, Kind: Write, Key: "r", Token: 11, Value: "b1", Outcome: Unknown, Call: 51, Return: Never},
		{Client: 1, Kind: Effect, Key: "i", Value: "b", Result: "a", Outcome: OK, Call: 61, Return: 70},
		// client 0 wakes up and writes with its old token: rejected.
		{Client: 0, Kind: Write, Key: "r", Token: 10, Value: "a2", Outcome: Stale, Call: 80, Return: 90},
		{Client: 0, Kind: Write, Key: "r", Token: 10, Value: "a3", Outcome: Unknown, Call: 91, Return: Never},
		{Client: 0, Kind: Release, Key: "r", Outcome: Rejected, Call: 95, Return: 99},
		{Client: 1, Kind: Effect, Key: "i", Value: "c", Outcome: Unknown, Call: 100, Return: Never},
	}
	truth := Truth{
		Writes: []AcceptedWrite{
			{Key: "r", Token: 10, Value: "a1", Seq: 1},
			{Key: "r", Token: 11, Value: "b1", Seq: 2},
		},
		Final:   map[string]Register{"r": {Token: 11, Value: "b1"}},
		Grants:  []Grant{{Key: "r", Token: 10, Seq: 1}, {Key: "r", Token: 11, Seq: 2}},
		Effects: map[string][]string{"i": {"a"}},
		Stored:  map[string]string{"i": "a"},
	}
	return ops, truth
}

func TestCheckerAcceptsAGoodHistory(t *testing.T) {
	ops, truth := goodHistory()
	rep := Check(ops, truth, 10*time.Second)
	if !rep.OK() || rep.Linearizable != porcupine.Ok {
		t.Fatalf("good history rejected: %s %v", rep.Linearizable, rep.Violations)
	}
	if rep.Unknown != 3 {
		t.Fatalf("unknown ops = %d, want 3", rep.Unknown)
	}
}

// Each known-bad history breaks one guarantee; the checker must name it.
func TestCheckerCatchesKnownBadHistories(t *testing.T) {
	cases := []struct {
		name      string
		mutate    func(ops []Op, truth *Truth) []Op
		violation string // substring of the expected invariant violation
		illegal   bool   // porcupine must also reject it
	}{
		{
			name: "stale write accepted after a higher token",
			mutate: func(ops []Op, truth *Truth) []Op {
				ops[4].Outcome, ops[4].Return = OK, 60 // b1 (token 11) acknowledged
				ops[6].Outcome = OK                    // then the old holder's "a2" with token 10 succeeds
				truth.Writes = append(truth.Writes, AcceptedWrite{Key: "r", Token: 10, Value: "a2", Seq: 3})
				truth.Final["r"] = Register{Token: 10, Value: "a2"}
				return ops
			},
			violation: "accepted tokens decreased",
			illegal:   true,
		},
		{
			name: "write reported stale but applied",
			mutate: func(ops []Op, truth *Truth) []Op {
				ops[6].Token = 12 // a write the caller was told is stale lands anyway
				truth.Writes = append(truth.Writes, AcceptedWrite{Key: "r", Token: 12, Value: "a2", Seq: 3})
				truth.Final["r"] = Register{Token: 12, Value: "a2"}
				return ops
			},
			violation: `applied although its caller was told "stale"`,
			illegal:   true,
		},
		{
			name: "acknowledged write lost",
			mutate: func(ops []Op, truth *Truth) []Op {
				truth.Writes = truth.Writes[1:] // a1 was acknowledged but is gone
				return ops
			},
			violation: "acknowledged but is not in the database",
		},
		{
			name: "final state is not the highest token's write",
			mutate: func(ops []Op, truth *Truth) []Op {
				truth.Final["r"] = Register{Token: 10, Value: "a1"}
				return ops
			},
			violation: "is not the last accepted write",
			illegal:   true,
		},
		{
			name: "token issued twice",
			mutate: func(ops []Op, truth *Truth) []Op {
				ops[3].Token = 10
				truth.Grants[1].Token = 10
				return ops
			},
			violation: "granted twice",
			illegal:   true,
		},
		{
			name: "tokens go backwards after a failover",
			mutate: func(ops []Op, truth *Truth) []Op {
				truth.Grants = append(truth.Grants, Grant{Key: "r", Token: 5, Seq: 3})
				return append(ops, Op{Client: 2, Kind: Acquire, Key: "r", Token: 5, Outcome: OK, Call: 200, Return: 210})
			},
			violation: "tokens must strictly increase",
			illegal:   true,
		},
		{
			name: "intent executed twice",
			mutate: func(ops []Op, truth *Truth) []Op {
				ops[5].Result = "b" // the duplicate ran its own effect
				truth.Effects["i"] = []string{"a", "b"}
				return ops
			},
			violation: "2 side effects",
			illegal:   true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ops, truth := goodHistory()
			ops = tc.mutate(ops, &truth)
			rep := Check(ops, truth, 10*time.Second)
			if rep.OK() {
				t.Fatal("the checker accepted a known-bad history")
			}
			found := false
			for _, v := range rep.Violations {
				found = found || strings.Contains(v, tc.violation)
			}
			if !found {
				t.Fatalf("violations %q do not mention %q", rep.Violations, tc.violation)
			}
			if tc.illegal && rep.Linearizable != porcupine.Illegal {
				t.Fatalf("porcupine says %s, want Illegal", rep.Linearizable)
			}
		})
	}
}

// A non-linearizable history that no single invariant catches: a write
// acknowledged with token 10 strictly after a write with token 11 was
// acknowledged, and then overwritten, so the final state looks fine.
func TestPorcupineCatchesWhatInvariantsMiss(t *testing.T) {
	ops := []Op{
		{Client: 0, Kind: Write, Key: "r", Token: 11, Value: "b", Outcome: OK, Call: 0, Return: 10},
		{Client: 1, Kind: Write, Key: "r", Token: 10, Value: "a", Outcome: OK, Call: 20, Return: 30},
		{Client: 0, Kind: Write, Key: "r", Token: 12, Value: "c", Outcome: OK, Call: 40, Return: 50},
	}
	// The database's audit order disagrees with real time (b's commit order
	// was lost): a checker that only looks at the audit log sees nothing.
	truth := Truth{
		Writes: []AcceptedWrite{{Key: "r", Token: 10, Value: "a", Seq: 1}, {Key: "r", Token: 11, Value: "b", Seq: 2}, {Key: "r", Token: 12, Value: "c", Seq: 3}},
		Final:  map[string]Register{"r": {Token: 12, Value: "c"}},
	}
	rep := Check(ops, truth, 10*time.Second)
	if rep.Linearizable != porcupine.Illegal || rep.OK() {
		t.Fatalf("porcupine = %s, violations %v; want Illegal", rep.Linearizable, rep.Violations)
	}
	var html bytes.Buffer
	if err := rep.Visualize(&html); err != nil || html.Len() == 0 {
		t.Fatalf("visualize: %v", err)
	}
}

// Every history saved under testdata/ failed when it was saved (a hand-made
// known-bad one, or one a robustness run caught): the checker must keep
// rejecting it.
func TestSavedFailingHistoriesStayRejected(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no saved histories under testdata/")
	}
	for _, path := range paths {
		rec, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if rep := Check(rec.Ops, rec.Truth, 30*time.Second); rep.OK() {
			t.Errorf("%s: saved failing history (%s) now passes the checker", path, rec.Note)
		}
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	ops, truth := goodHistory()
	dir := t.TempDir()
	path, err := Save(dir, "h.json", Record{Seed: 7, Ops: ops, Truth: truth})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Seed != 7 || len(rec.Ops) != len(ops) || rec.Ops[4].Return != Never || rec.Truth.Final["r"].Value != "b1" {
		t.Fatalf("round trip lost data: %+v", rec)
	}
	if rep := Check(rec.Ops, rec.Truth, 10*time.Second); !rep.OK() {
		t.Fatalf("reloaded good history rejected: %v", rep.Violations)
	}
}
