package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

func TestAgent(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	defer pool.Close() // its connections' goroutines end before the leak check (the harness's Close is then a no-op)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var out bytes.Buffer
	res, err := run(ctx, pool, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	// One refund and one e-mail happened. The refund tool was called once (the
	// recovery point skipped it after the crash); the mail tool twice, the
	// second call deduplicated by the derived key.
	if res.Refunds.Effects != 1 || res.Refunds.Calls != 1 {
		t.Errorf("refunds: %d effects, %d calls; want 1, 1", res.Refunds.Effects, res.Refunds.Calls)
	}
	if res.Mails.Effects != 1 || res.Mails.Calls != 2 {
		t.Errorf("mails: %d effects, %d calls; want 1, 2", res.Mails.Effects, res.Mails.Calls)
	}
	if !res.TakenOver {
		t.Error("the completing agent did not take over agent-a's attempt")
	}
	if !res.ZombieRefused {
		t.Error("agent-a's replaced attempt could still complete the task")
	}
	want := "refunded re_1, notified by mail_1"
	for _, name := range []string{"agent-b", "agent-c"} {
		if res.Results[name] != want {
			t.Errorf("%s ended with %q, want %q", name, res.Results[name], want)
		}
	}
	if !strings.Contains(out.String(), `resumes at recovery point "refunded"`) {
		t.Error("the takeover did not resume from the recovery point")
	}
}
