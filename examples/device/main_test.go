package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

func TestDevice(t *testing.T) {
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
	if !res.StaleRejected {
		t.Error("the gateway did not reject the frozen controller's command")
	}
	if len(res.Applied) != 2 {
		t.Fatalf("device applied %d commands, want 2 (ctl-2 and ctl-3): %+v", len(res.Applied), res.Applied)
	}
	for _, c := range res.Applied {
		if c.Controller == "ctl-1" {
			t.Errorf("the device applied ctl-1's late command %+v", c)
		}
	}
	// The final state is the command of the highest token.
	if a, b := res.Applied[0], res.Applied[1]; b.Token <= a.Token || res.Final != b {
		t.Errorf("applied %+v then %+v, final %+v", a, b, res.Final)
	}
}
