package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/bench"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A short contention run in which the first grant of every key stalls past
// its TTL, until another worker has taken the key over and written, and then
// still writes: the database rejects every one of those writes, and the
// business table read back reconciles with what the workers saw.
func TestBenchContention(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	code, out, errOut := cli(t, environ, "bench", "contention", "--workers", "4", "--keys", "2", "--duration", "2s",
		"--ttl", "200ms", "--pause", "400ms", "--pause-first", "--pause-rate", "0", "--hold", "100ms", "--json")
	if code != exitOK {
		t.Fatalf("bench contention: code %d\n%s%s", code, out, errOut)
	}
	var res bench.ContentionJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench contention --json: %v\n%s", err, out)
	}
	if !res.Reconciled || len(res.Checks) == 0 {
		t.Errorf("not reconciled: %+v", res.Checks)
	}
	for _, c := range res.Checks {
		if !c.Held {
			t.Errorf("check %q failed: %s", c.Check, c.Detail)
		}
	}
	if res.Workers != 4 || res.Keys != 2 || len(res.PerKey) != 2 || res.Errors != 0 {
		t.Errorf("workers %d, keys %d, %d per-key rows, %d errors (%s)", res.Workers, res.Keys, len(res.PerKey), res.Errors, res.FirstError)
	}
	// Every key's first holder paused and was taken over: at least one
	// stale write per key, each refused.
	if testing.Verbose() {
		t.Log(out)
	}
	if res.PausedGrants < 2 || res.PausedRejections < 2 || res.FenceRejections < res.PausedRejections || res.LateAccepted != 0 {
		t.Errorf("%d paused grants, %d of their writes rejected, %d accepted late; %d rejections in all",
			res.PausedGrants, res.PausedRejections, res.LateAccepted, res.FenceRejections)
	}
	if res.Expiries < 2 || res.TakenOver < 2 {
		t.Errorf("%d expiries, %d taken over: every paused grant expired and was taken over", res.Expiries, res.TakenOver)
	}
	if res.Completions == 0 || res.Completions != res.AcceptedWrites {
		t.Errorf("%d completions read back, %d writes accepted", res.Completions, res.AcceptedWrites)
	}
	if res.Acquisitions != res.AcceptedWrites+res.FenceRejections+res.Stopped {
		t.Errorf("%d acquisitions, but %d accepted + %d rejected + %d stopped", res.Acquisitions, res.AcceptedWrites, res.FenceRejections, res.Stopped)
	}
	if res.CycleP50US <= 0 || res.CycleP99US < res.CycleP50US {
		t.Errorf("acquire+write+release p50 %d µs, p99 %d µs", res.CycleP50US, res.CycleP99US)
	}
	if res.Renewals == 0 {
		t.Errorf("no renewals: --hold 100ms renews every 66ms")
	}
	for _, k := range res.PerKey {
		if k.Counter != k.Completions || k.Completions != k.AcceptedWrites || k.FenceRejections == 0 || k.LastToken == 0 {
			t.Errorf("key %s: %+v", k.Key, k)
		}
	}
	if !strings.Contains(errOut, "bench contention: 4 workers on 2 keys") {
		t.Errorf("no progress on stderr:\n%s", errOut)
	}

	code, out, errOut = cli(t, environ, "bench", "contention", "--workers", "2", "--keys", "1", "--duration", "200ms", "--pause-rate", "0")
	if code != exitOK {
		t.Fatalf("bench contention text: code %d\n%s%s", code, out, errOut)
	}
	for _, s := range []string{"COORDINATION", "BUSINESS", "acquisitions", "completions (read back)", "wait p50 / p99", "give-ups",
		"renewals", "expiries", "fence rejections", "acquire+write+release p50 / p99", "Reconciliation: reconciled", "LAST TOKEN", "fsync="} {
		if !strings.Contains(out, s) {
			t.Errorf("text output lacks %q:\n%s", s, out)
		}
	}
}

// A tiny ordered-task run: producers enqueue and are told their task was
// applied; the business table read back equals applying each key's tasks in
// sequence order, and every figure of the report is there (its values are
// timings, not asserted).
func TestBenchContentionTasks(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	code, out, errOut := cli(t, environ, "bench", "contention", "--mode", "tasks", "--workers", "4", "--keys", "2", "--consumers", "2",
		"--duration", "300ms", "--ttl", "2s", "--json")
	if code != exitOK {
		t.Fatalf("bench contention --mode tasks: code %d\n%s%s", code, out, errOut)
	}
	var res bench.ContentionJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench contention --json: %v\n%s", err, out)
	}
	if testing.Verbose() {
		t.Log(out)
	}
	if !res.Reconciled || len(res.Checks) != 5 {
		t.Errorf("not reconciled: %+v", res.Checks)
	}
	for _, c := range res.Checks {
		if !c.Held {
			t.Errorf("check %q failed: %s", c.Check, c.Detail)
		}
	}
	tk := res.Tasks
	if res.Mode != "tasks" || tk == nil || res.Errors != 0 || len(res.PerKey) != 2 {
		t.Fatalf("mode %q, tasks %+v, %d errors (%s), %d keys", res.Mode, tk, res.Errors, res.FirstError, len(res.PerKey))
	}
	if tk.Consumers != 2 || tk.FloorInserts == 0 || tk.Enqueued == 0 || tk.Applied != tk.Enqueued || res.Completions != tk.Enqueued ||
		tk.BacklogMax > 4 || tk.Batches == 0 || tk.Batches > tk.Enqueued || tk.Statements < 2*tk.Enqueued || tk.EnqueueP50US == 0 || tk.AppliedP50US < tk.EnqueueP50US || tk.CompletionsToFloor <= 0 {
		t.Errorf("figures: %d completions, %+v", res.Completions, *tk)
	}
	for _, k := range res.PerKey {
		if k.Enqueued == 0 || k.Completions != k.Enqueued || k.Counter != k.Completions || k.LastSeq != k.Completions || k.Acquisitions != 0 {
			t.Errorf("key %s: %+v", k.Key, k)
		}
	}
	if !strings.Contains(errOut, "bench contention: 4 producers on 2 keys for 300ms, 2 consumers") {
		t.Errorf("no progress on stderr:\n%s", errOut)
	}

	code, out, errOut = cli(t, environ, "bench", "contention", "--mode", "tasks", "--workers", "1", "--keys", "1", "--duration", "200ms")
	if code != exitOK {
		t.Fatalf("bench contention --mode tasks text: code %d\n%s%s", code, out, errOut)
	}
	for _, s := range []string{"FLOOR (bare INSERT of the task rows)", "ORDERED TASKS", "rows inserted", "completions (read back)", "× the floor",
		"enqueue p50 / p99", "enqueue to applied p50 / p99", "backlog", "batches applied", "per completion", "LAST SEQ", "Reconciliation: reconciled", "fsync="} {
		if !strings.Contains(out, s) {
			t.Errorf("text output lacks %q:\n%s", s, out)
		}
	}
}

func TestBenchContentionUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--workers", "0"}, "--workers: 0 is not from 1 to 256"},
		{[]string{"--workers", "257"}, "--workers: 257 is not from 1 to 256"},
		{[]string{"--workers", "many"}, "invalid value"},
		{[]string{"--keys", "0"}, "--keys: 0 is not from 1 to 1000"},
		{[]string{"--duration", "10ms"}, "--duration must be between 100ms and 10m0s"},
		{[]string{"--ttl", "1ms"}, "--ttl must be between 10ms and 10m0s"},
		{[]string{"--max-wait", "-1s"}, "--max-wait must be from 0"},
		{[]string{"--hold", "-1s"}, "--hold must be from 0"},
		{[]string{"--pause-rate", "1.5"}, "--pause-rate must be from 0 to 1"},
		{[]string{"--pause-rate", "-0.1"}, "--pause-rate must be from 0 to 1"},
		{[]string{"--pause-rate", "NaN"}, "--pause-rate must be from 0 to 1"},
		{[]string{"--ttl", "2s", "--pause", "2s"}, "--pause must be longer than --ttl (2s)"},
		{[]string{"--pause-rate", "0", "--pause-first", "--pause", "100ms"}, "--pause must be longer than --ttl (500ms)"},
		{[]string{"extra"}, "takes no arguments"},
		{[]string{"--mode", "queue"}, `--mode: "queue" is neither lock nor tasks`},
		{[]string{"--mode", "tasks", "--hold", "1s", "--pause-rate", "0"}, "--hold, --pause-rate: only with --mode lock"},
		{[]string{"--mode", "tasks", "--max-wait", "1s"}, "--max-wait: only with --mode lock"},
		{[]string{"--consumers", "3"}, "--consumers: only with --mode tasks"},
		{[]string{"--mode", "tasks", "--consumers", "0"}, "--consumers: 0 is not from 1 to 64"},
		{[]string{"--mode", "tasks", "--consumers", "65"}, "--consumers: 65 is not from 1 to 64"},
	} {
		// No database: the flags are checked before any is opened.
		code, _, errOut := cli(t, nil, append([]string{"bench", "contention"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tc.msg) || !strings.Contains(errOut, "hint: ") {
			t.Errorf("%q: code %d, want %d with %q\n%s", tc.args, code, exitUsage, tc.msg, errOut)
		}
	}
	// Without pauses, --pause is not checked.
	if code, _, errOut := cli(t, nil, "bench", "contention", "--pause-rate", "0", "--pause", "1ms", "--database-url", "postgres://app@127.0.0.1:notaport/x"); code != exitUsage || strings.Contains(errOut, "--pause") {
		t.Errorf("--pause-rate 0 --pause 1ms: code %d\n%s", code, errOut)
	}
}
