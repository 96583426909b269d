package robustness

import (
	"fmt"
	"hash/fnv"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// AcceptedWrite is one fenced write the database accepted, read back from an
// audit table written in the same transaction as the business row.
type AcceptedWrite struct {
	Key   string `json:"key"`
	Token int64  `json:"token"`
	Value string `json:"value"`
	// Seq orders the accepted writes of one key in commit order (the audit
	// row is inserted while the writer holds the business row's lock).
	Seq int64 `json:"seq"`
}

// Grant is one lease grant, as pgfence.lease_events recorded it.
type Grant struct {
	Key    string `json:"key"`
	Token  int64  `json:"token"`
	Holder string `json:"holder,omitempty"`
	Seq    int64  `json:"seq"` // lease_events.id
	// Event is "acquired", or "taken_over" when the grant replaced one that
	// had expired without a release.
	Event string `json:"event,omitempty"`
}

// Register is the business state of one resource: the last accepted write.
type Register struct {
	Token int64  `json:"token"`
	Value string `json:"value"`
}

// Truth is the ground truth read back from the database after a run, once
// every client has stopped and no transaction of theirs is left.
type Truth struct {
	Writes []AcceptedWrite     `json:"writes"`
	Final  map[string]Register `json:"final"`
	Grants []Grant             `json:"grants"`
	// Effects lists, per intent, the result of every side effect that
	// happened (one row per execution in the effects table).
	Effects map[string][]string `json:"effects"`
	// Stored is the result the idempotency store keeps per intent.
	Stored map[string]string `json:"stored"`
}

// Report is the verdict on one history.
type Report struct {
	Ops          int
	Unknown      int                   // operations with an unknown outcome
	Linearizable porcupine.CheckResult // Ok, Illegal, or Unknown (checker timed out)
	Violations   []string
	info         porcupine.LinearizationInfo
	ops          []porcupine.Operation
}

// OK reports whether the history passed: no invariant violated and not proven
// non-linearizable.
func (r Report) OK() bool { return len(r.Violations) == 0 && r.Linearizable != porcupine.Illegal }

// Visualize writes porcupine's HTML view of the history (with the longest
// linearizable prefixes), for a failing run.
func (r Report) Visualize(w io.Writer) error { return porcupine.Visualize(model, r.info, w) }

// Check checks a history against the ground truth: the invariants of
// the fault scenarios (final state, token order, no repeats, one effect per
// key) and, with porcupine, linearizability of every resource's fenced
// register, every lease's token sequence and every intent's stored result,
// each ending with a read of the ground truth. timeout bounds porcupine.
func Check(ops []Op, truth Truth, timeout time.Duration) Report {
	rep := Report{Ops: len(ops)}
	for _, op := range ops {
		if op.Outcome == Unknown {
			rep.Unknown++
		}
	}
	rep.Violations = invariants(ops, truth)
	history := withFinalReads(resolveUnknown(ops, truth), truth)
	rep.ops = make([]porcupine.Operation, len(history))
	for i, op := range history {
		ret := op.Return
		if op.Outcome == Unknown {
			ret = Never
		}
		rep.ops[i] = porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Output: nil, Return: ret}
	}
	rep.Linearizable, rep.info = porcupine.CheckOperationsVerbose(model, rep.ops, timeout)
	if rep.Linearizable == porcupine.Illegal {
		rep.Violations = append(rep.Violations, "history is not linearizable (porcupine): some operation's outcome contradicts every order consistent with real time")
	}
	return rep
}

// resolveUnknown settles unknown outcomes with the ground truth before the
// linearizability check, as etcd's robustness tests patch their histories:
// the audit log holds every accepted write and the effects table every
// executed intent, so an unknown write or effect that is in them took effect
// (at some time after its call: its return stays Never) and one that is not
// never did (it is dropped). An unknown acquire, release or renewal changes
// nothing the model tracks and is dropped. The invariants still see the
// original history.
func resolveUnknown(ops []Op, truth Truth) []Op {
	type wkey struct{ key, value string }
	applied := map[wkey]bool{}
	for _, w := range truth.Writes {
		applied[wkey{w.Key, w.Value}] = true
	}
	executed := map[wkey]bool{}
	for key, results := range truth.Effects {
		for _, r := range results {
			executed[wkey{key, r}] = true
		}
	}
	out := make([]Op, 0, len(ops))
	for _, op := range ops {
		if op.Outcome == Unknown {
			switch {
			case op.Kind == Write && applied[wkey{op.Key, op.Value}]:
				op.Outcome = OK
			case op.Kind == Effect && executed[wkey{op.Key, op.Value}]:
				op.Outcome, op.Result = OK, op.Value
			default:
				continue
			}
			op.Return = Never
		}
		out = append(out, op)
	}
	return out
}

// withFinalReads appends the ground truth as reads that start after every
// operation that returned: one per resource and one per intent.
func withFinalReads(ops []Op, truth Truth) []Op {
	var end int64
	resources, intents := map[string]bool{}, map[string]bool{}
	for _, op := range ops {
		if op.Return != Never && op.Return > end {
			end = op.Return
		}
		if op.Call > end {
			end = op.Call
		}
		switch op.Kind {
		case Write, Read:
			resources[op.Key] = true
		case Effect, EffectRead:
			intents[op.Key] = true
		}
	}
	for k := range truth.Final {
		resources[k] = true
	}
	for k := range truth.Stored {
		intents[k] = true
	}
	out := append([]Op(nil), ops...)
	client := -1
	for _, k := range sortedKeys(resources) {
		f := truth.Final[k]
		out = append(out, Op{Client: client, Kind: Read, Key: k, Token: f.Token, Value: f.Value, Outcome: OK, Call: end + 1, Return: end + 2})
	}
	for _, k := range sortedKeys(intents) {
		out = append(out, Op{Client: client, Kind: EffectRead, Key: k, Result: truth.Stored[k], Outcome: OK, Call: end + 1, Return: end + 2})
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// invariants checks what must hold whatever the interleaving.
func invariants(ops []Op, truth Truth) []string {
	var v []string
	add := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }

	// Accepted fenced tokens never decrease per resource, and the final state
	// is the write of the highest accepted token.
	byKey := map[string][]AcceptedWrite{}
	for _, w := range truth.Writes {
		byKey[w.Key] = append(byKey[w.Key], w)
	}
	for key, ws := range byKey {
		sort.Slice(ws, func(i, j int) bool { return ws[i].Seq < ws[j].Seq })
		var max int64
		for i, w := range ws {
			if i > 0 && w.Token < ws[i-1].Token {
				add("resource %s: accepted token %d (value %s) after token %d: accepted tokens decreased", key, w.Token, w.Value, ws[i-1].Token)
			}
			if w.Token > max {
				max = w.Token
			}
		}
		last := ws[len(ws)-1]
		if f, ok := truth.Final[key]; !ok || f.Token != last.Token || f.Value != last.Value {
			add("resource %s: final state %+v is not the last accepted write %+v", key, truth.Final[key], last)
		}
		if last.Token != max {
			add("resource %s: final token %d is not the highest accepted token %d", key, last.Token, max)
		}
	}
	for key, f := range truth.Final {
		if len(byKey[key]) == 0 && (f.Token != 0 || f.Value != "") {
			add("resource %s: final state %+v was written by no accepted write", key, f)
		}
	}

	// Every accepted write was sent by a caller who was told OK or does not
	// know; every write a caller was told OK was accepted.
	type wkey struct{ key, value string }
	sent := map[wkey]Op{}
	for _, op := range ops {
		if op.Kind == Write {
			sent[wkey{op.Key, op.Value}] = op
		}
	}
	applied := map[wkey]bool{}
	for _, w := range truth.Writes {
		k := wkey{w.Key, w.Value}
		if applied[k] {
			add("resource %s: write %s was applied twice", w.Key, w.Value)
		}
		applied[k] = true
		op, ok := sent[k]
		switch {
		case !ok:
			add("resource %s: accepted write %s (token %d) was sent by nobody", w.Key, w.Value, w.Token)
		case op.Token != w.Token:
			add("resource %s: write %s was accepted with token %d but sent with %d", w.Key, w.Value, w.Token, op.Token)
		case op.Outcome != OK && op.Outcome != Unknown:
			add("resource %s: write %s (token %d) was applied although its caller was told %q", w.Key, w.Value, w.Token, op.Outcome)
		}
	}
	for k, op := range sent {
		if op.Outcome == OK && !applied[k] {
			add("resource %s: write %s (token %d) was acknowledged but is not in the database", k.key, k.value, op.Token)
		}
	}

	// Tokens never repeat and strictly increase per key, in the database and
	// as callers received them.
	grants := map[string][]Grant{}
	for _, g := range truth.Grants {
		grants[g.Key] = append(grants[g.Key], g)
	}
	for key, gs := range grants {
		sort.Slice(gs, func(i, j int) bool { return gs[i].Seq < gs[j].Seq })
		for i := 1; i < len(gs); i++ {
			if gs[i].Token <= gs[i-1].Token {
				add("lease %s: grant token %d after %d: tokens must strictly increase", key, gs[i].Token, gs[i-1].Token)
			}
		}
	}
	type tkey struct {
		key   string
		token int64
	}
	granted := map[tkey]Op{}
	for _, op := range ops {
		if op.Kind != Acquire || op.Outcome != OK {
			continue
		}
		k := tkey{op.Key, op.Token}
		if prev, dup := granted[k]; dup {
			add("lease %s: token %d granted twice (clients %d and %d)", op.Key, op.Token, prev.Client, op.Client)
		}
		granted[k] = op
	}

	// At most one effect per intent; every caller told OK got the stored
	// result, and that result is the effect that happened.
	for key, results := range truth.Effects {
		if len(results) > 1 {
			add("intent %s: %d side effects %v, want at most one", key, len(results), results)
		}
		if len(results) == 1 && truth.Stored[key] != results[0] {
			add("intent %s: stored result %q but the effect that happened is %q", key, truth.Stored[key], results[0])
		}
	}
	for _, op := range ops {
		if op.Kind != Effect {
			continue
		}
		if op.Outcome == OK && op.Result != truth.Stored[op.Key] {
			add("intent %s: caller %d got result %q, stored result is %q", op.Key, op.Client, op.Result, truth.Stored[op.Key])
		}
	}
	sort.Strings(v)
	return v
}

// state is the sequential state of one partition: a fenced register (token,
// value), a lease (token: the last granted), or an intent (value: the stored
// result, "" when none).
type state struct {
	token int64
	value string
}

var model = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		groups := map[string][]porcupine.Operation{}
		for _, o := range history {
			k := partition(o.Input.(Op))
			groups[k] = append(groups[k], o)
		}
		out := make([][]porcupine.Operation, 0, len(groups))
		for _, k := range sortedKeys(func() map[string]bool {
			m := map[string]bool{}
			for k := range groups {
				m[k] = true
			}
			return m
		}()) {
			out = append(out, groups[k])
		}
		return out
	},
	Init: func() []any { return []any{state{}} },
	Step: func(s, input, _ any) []any {
		next := step(s.(state), input.(Op))
		out := make([]any, len(next))
		for i, n := range next {
			out[i] = n
		}
		return out
	},
	Equal: func(a, b any) bool { return a.(state) == b.(state) },
	Hash: func(s any) uint64 {
		h := fnv.New64a()
		st := s.(state)
		fmt.Fprintf(h, "%d/%s", st.token, st.value)
		return h.Sum64()
	},
	DescribeOperation: func(input, _ any) string { return input.(Op).String() },
	DescribeState: func(s any) string {
		st := s.(state)
		return fmt.Sprintf("token=%d value=%q", st.token, st.value)
	},
}).ToModel()

func partition(op Op) string {
	switch op.Kind {
	case Acquire, Release, Renew:
		return "lease/" + op.Key
	case Effect, EffectRead:
		return "intent/" + op.Key
	default:
		return "resource/" + op.Key
	}
}

// step returns every state the partition may be in after op, none if op's
// outcome is impossible in s.
func step(s state, op Op) []state {
	switch op.Kind {
	case Acquire:
		if op.Outcome != OK {
			return []state{s} // an unknown grant only consumes a token
		}
		if op.Token > s.token {
			return []state{{token: op.Token}}
		}
		return nil
	case Write:
		applies := op.Token >= s.token
		applied := state{token: op.Token, value: op.Value}
		switch op.Outcome {
		case OK:
			if applies {
				return []state{applied}
			}
			return nil
		case Stale:
			if !applies {
				return []state{s}
			}
			return nil
		case Unknown:
			if applies {
				return []state{s, applied}
			}
			return []state{s}
		}
		return []state{s}
	case Read:
		if op.Outcome == OK && (op.Token != s.token || op.Value != s.value) {
			return nil
		}
		return []state{s}
	case Effect:
		switch op.Outcome {
		case OK:
			if s.value == "" && op.Result == op.Value || s.value != "" && op.Result == s.value {
				return []state{{value: op.Result}}
			}
			return nil
		case Unknown:
			if s.value == "" {
				return []state{s, {value: op.Value}}
			}
		}
		return []state{s}
	case EffectRead:
		if op.Result != s.value {
			return nil
		}
		return []state{s}
	}
	return []state{s} // Release and anything else: no observable state
}

// Part is one kind of completed operation and how many a run completed.
type Part struct {
	Name  string
	Count int
}

// Summary is what a run proved, printed at its end.
type Summary struct {
	Seed       int64
	Duration   time.Duration
	Scenarios  []string
	Faults     map[string]int
	Ops        int
	ByOutcome  map[Outcome]int
	Accepted   int // accepted fenced writes in the database
	Grants     int
	Effects    int
	Parts      []Part // completed operations of each kind the run exercises
	Result     porcupine.CheckResult
	Violations []string
}

func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "robustness summary (seed %d, %v)\n", s.Seed, s.Duration.Round(time.Millisecond))
	if len(s.Scenarios) > 0 {
		fmt.Fprintf(&b, "  scenarios:   %s\n", strings.Join(s.Scenarios, ", "))
	}
	total := 0
	names := make([]string, 0, len(s.Faults))
	for k, n := range s.Faults {
		names = append(names, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	sort.Strings(names)
	fmt.Fprintf(&b, "  faults:      %d (%s)\n", total, strings.Join(names, " "))
	outcomes := make([]string, 0, len(s.ByOutcome))
	for k, n := range s.ByOutcome {
		outcomes = append(outcomes, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(outcomes)
	fmt.Fprintf(&b, "  operations:  %d (%s)\n", s.Ops, strings.Join(outcomes, " "))
	fmt.Fprintf(&b, "  database:    %d accepted fenced writes, %d lease grants, %d side effects\n", s.Accepted, s.Grants, s.Effects)
	if len(s.Parts) > 0 {
		width := 0
		for _, p := range s.Parts {
			width = max(width, len(p.Name))
		}
		fmt.Fprintf(&b, "  completed:\n")
		for _, p := range s.Parts {
			fmt.Fprintf(&b, "    %-*s %8d\n", width, p.Name, p.Count)
		}
	}
	fmt.Fprintf(&b, "  porcupine:   %s\n", s.Result)
	fmt.Fprintf(&b, "  violations:  %d\n", len(s.Violations))
	for _, v := range s.Violations {
		fmt.Fprintf(&b, "    - %s\n", v)
	}
	return b.String()
}
