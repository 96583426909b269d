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

func TestPayment(t *testing.T) {
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
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		if res.Charges[order] != 1 || res.Payments[order] != 1 {
			t.Errorf("%s: %d charges, %d payment rows; want 1, 1", order, res.Charges[order], res.Payments[order])
		}
		if !strings.HasPrefix(res.Results[order], order+" paid with ch_") {
			t.Errorf("%s: a retry got %q", order, res.Results[order])
		}
	}
	// order-1 crashed after the charge: the completer asked the provider
	// again (deduplicated by the derived key); order-2 crashed after its
	// recovery point: the completer only recorded it.
	if res.Calls["order-1"] != 2 || res.Calls["order-2"] != 1 || res.Calls["order-3"] != 1 {
		t.Errorf("provider calls %v, want order-1: 2, order-2: 1, order-3: 1", res.Calls)
	}
	if !strings.HasSuffix(res.Resumed["order-1"], `from ""`) || !strings.HasSuffix(res.Resumed["order-2"], `from "charged"`) || res.Resumed["order-3"] != "" {
		t.Errorf("resumed %v, want order-1 from the start and order-2 from \"charged\"", res.Resumed)
	}
	if res.Recovered.Resumed != 2 || res.Recovered.Released != 0 {
		t.Errorf("completers: %+v, want 2 orders resumed between them", res.Recovered)
	}
}
