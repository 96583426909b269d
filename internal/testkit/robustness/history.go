package robustness

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// Kind is what an operation did.
type Kind string

// Operation kinds.
const (
	// Acquire asks for the lease on Key; Token is the token granted.
	Acquire Kind = "acquire"
	// Release gives the lease on Key back.
	Release Kind = "release"
	// Write is a fenced write of Value to resource Key with Token.
	Write Kind = "write"
	// Read reads resource Key: Token and Value are the last accepted write's.
	// The final ground-truth reads are Reads.
	Read Kind = "read"
	// Effect runs the business intent Key (an idempotency key) once: Value is
	// this attempt's own result, Result the result the caller got back.
	Effect Kind = "effect"
	// EffectRead reads the stored result of intent Key ("" when none).
	EffectRead Kind = "effect-read"
	// Renew renews the lease on Key (Token: the grant's). It is recorded but
	// not checked: a lost renewal shows up in the grants and writes that
	// follow. Rejected means the database refused it (the grant no longer
	// held the key); a holder that stopped trusting its lease first sends
	// nothing (Failed).
	Renew Kind = "renew"
)

// Outcome is how an operation ended, as its caller saw it.
type Outcome string

// Outcomes.
const (
	// OK: the operation took effect (a read: it returned its data).
	OK Outcome = "ok"
	// Stale: a fenced write was rejected because a higher token was accepted.
	Stale Outcome = "stale"
	// Rejected: refused for another reason that guarantees nothing changed
	// (lease held by another, lease not held, intent in progress).
	Rejected Outcome = "rejected"
	// Failed: an error that guarantees nothing changed (nothing was sent, the
	// server answered with an error, the transaction rolled back).
	Failed Outcome = "failed"
	// Unknown: the request may or may not have taken effect, now or later
	// (lost reply, lost connection around COMMIT, a caller timeout while the
	// worker was stopped).
	Unknown Outcome = "unknown"
)

// Op is one operation of a history.
type Op struct {
	Client  int     `json:"client"`
	Kind    Kind    `json:"kind"`
	Key     string  `json:"key"`
	Token   int64   `json:"token,omitempty"`
	Value   string  `json:"value,omitempty"`
	Result  string  `json:"result,omitempty"`
	Outcome Outcome `json:"outcome"`
	// Call and Return are monotonic nanoseconds since the history began.
	// Return is [Never] for an Unknown outcome: the operation may take effect
	// at any later time.
	Call   int64  `json:"call"`
	Return int64  `json:"return"`
	Err    string `json:"err,omitempty"`
	// Resolved is set when the caller first got no answer and read the
	// outcome back before returning: pgfence.Resolve's answer for a fenced
	// write ("applied" is OK, "not applied" is Failed, "superseded" stays
	// Unknown), "retried" for an effect asked again with the same key.
	Resolved string `json:"resolved,omitempty"`
}

// Never is the return time of an operation whose effect may come at any time.
const Never int64 = math.MaxInt64

func (o Op) String() string {
	s := fmt.Sprintf("c%d %s %s", o.Client, o.Kind, o.Key)
	if o.Token != 0 {
		s += fmt.Sprintf(" t=%d", o.Token)
	}
	if o.Value != "" {
		s += " v=" + o.Value
	}
	if o.Result != "" {
		s += " → " + o.Result
	}
	s += " " + string(o.Outcome)
	if o.Resolved != "" {
		s += " (read back: " + o.Resolved + ")"
	}
	return s
}

// Recorder collects a history from concurrent clients. Times come from the
// monotonic clock of one time.Time taken at creation.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewRecorder starts an empty history now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Now is the monotonic time since the history began, in nanoseconds.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Add records op; an Unknown op's Return is set to [Never].
func (r *Recorder) Add(op Op) {
	if op.Outcome == Unknown {
		op.Return = Never
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op)
}

// MarkUnknown turns the recorded operations that match into Unknown ones
// (return time [Never]) with reason as their error, and returns how many it
// changed. Use it when the test learns later that an acknowledgement does not
// count, e.g. one from a primary lost before its async standby had the change.
func (r *Recorder) MarkUnknown(match func(Op) bool, reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for i := range r.ops {
		if match(r.ops[i]) {
			r.ops[i].Outcome, r.ops[i].Return, r.ops[i].Err = Unknown, Never, reason
			n++
		}
	}
	return n
}

// Ops returns the history so far, ordered by call time.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	ops := append([]Op(nil), r.ops...)
	r.mu.Unlock()
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops
}

// Record is a history with the ground truth read back from the database, as
// saved for a failing run.
type Record struct {
	Seed       int64    `json:"seed"`
	Note       string   `json:"note,omitempty"`
	Ops        []Op     `json:"ops"`
	Truth      Truth    `json:"truth"`
	Violations []string `json:"violations,omitempty"`
}

// Save writes rec as indented JSON to dir/name, creating dir.
func Save(dir, name string, rec Record) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}

// Load reads a record written by [Save].
func Load(path string) (Record, error) {
	var rec Record
	b, err := os.ReadFile(path)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("%s: %w", path, err)
	}
	return rec, nil
}
