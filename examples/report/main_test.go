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

func TestReport(t *testing.T) {
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
		t.Error("gen-1's stale file was not rejected")
	}
	// The newest file covers all five sales (775 in total) and was written by
	// the last of gen-2/gen-3 with the highest token.
	if want := "daily sales: 5 orders, total 775"; res.Content != want {
		t.Errorf("file holds %q, want %q", res.Content, want)
	}
	if res.Writer == "gen-1" || res.Token != res.HighestWritten {
		t.Errorf("file written by %s with token %d, highest accepted token %d", res.Writer, res.Token, res.HighestWritten)
	}
}
