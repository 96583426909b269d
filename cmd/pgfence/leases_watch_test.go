package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// lockedBuffer is a buffer a running command writes while the test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// `leases watch` follows a lease as it changes, one JSON object per line,
// in order, until interrupted (exit 0); in text, one line per event.
func TestLeasesWatchFollows(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for _, format := range []string{"json", "text"} {
		key := "follow/" + format
		var stdout, stderr lockedBuffer
		e := &env{stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return map[string]string{"DATABASE_URL": db.URL}[k] }}
		ctx, interrupt := context.WithCancel(context.Background())
		args := []string{"leases", "watch", key, "--poll", "20ms", "--history", "100"} // the whole history, whenever the watch starts
		if format == "json" {
			args = append(args, "--json")
		}
		code := make(chan int, 1)
		go func() { code <- run(ctx, args, e) }()

		var tokens []int64
		for range 2 {
			l, err := client.TryAcquire(context.Background(), key, time.Minute, &leases.AcquireOptions{HolderInfo: "worker-" + format})
			if err != nil {
				t.Fatal(err)
			}
			tokens = append(tokens, l.Token())
			if err := l.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(20 * time.Second)
		for strings.Count(stdout.String(), "\n") < 4 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		interrupt()
		if c := <-code; c != exitOK {
			t.Fatalf("%s: interrupted watch exited %d\n%s%s", format, c, stdout.String(), stderr.String())
		}
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		if len(lines) != 4 {
			t.Fatalf("%s: %d lines, want 4 (two grants, two releases):\n%s%s", format, len(lines), stdout.String(), stderr.String())
		}
		want := []string{"acquired", "released", "acquired", "released"}
		for i, line := range lines {
			if format == "text" {
				// date, time, event, "token", token, ...
				if f := strings.Fields(line); len(f) < 5 || f[2] != want[i] || f[4] != jsonInt(tokens[i/2]) {
					t.Errorf("text line %d %q, want %s of token %d", i, line, want[i], tokens[i/2])
				}
				continue
			}
			var ev watchEventJSON
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			if ev.Event != want[i] || ev.Token != tokens[i/2] || ev.Key != key || ev.At == nil || ev.ID == 0 {
				t.Errorf("json line %d %+v, want %s of token %d", i, ev, want[i], tokens[i/2])
			}
			if ev.Event == "acquired" && ev.HolderInfo != "worker-json" {
				t.Errorf("grant without its holder info: %+v", ev)
			}
		}
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

// A database without the schema ends the watch at once with exit code 4;
// bad flags with 2.
func TestLeasesWatchRefuses(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	if code, _, errOut := cli(t, environ, "leases", "watch", "k", "--count", "-1"); code != exitUsage {
		t.Errorf("--count -1: code %d\n%s", code, errOut)
	}
	if code, _, errOut := cli(t, environ, "leases", "watch", strings.Repeat("k", 513)); code != exitUsage {
		t.Errorf("a 513-byte key: code %d\n%s", code, errOut)
	}
	// The flag is named, not the library's option.
	if code, _, errOut := cli(t, environ, "leases", "watch", "k", "--poll", "25h"); code != exitUsage || !strings.Contains(errOut, "--poll must be 0 (the default) to 24h0m0s") {
		t.Errorf("--poll 25h: code %d\n%s", code, errOut)
	}
	if _, err := db.Pool.Exec(context.Background(), `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := cli(t, environ, "leases", "watch", "k"); code != exitSchema || !strings.Contains(errOut, "migrate up") {
		t.Errorf("no schema: code %d\n%s", code, errOut)
	}
}
