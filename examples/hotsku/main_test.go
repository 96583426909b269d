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

func TestHotSKU(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	defer pool.Close() // its connections' goroutines end before the leak check
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var out bytes.Buffer
	res, err := run(ctx, pool, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for way, o := range map[string]outcome{"lock": res.Lock, "tasks": res.Tasks} {
		if o.Sold != stock || o.Refused != orders-stock || o.Left != 0 {
			t.Errorf("%s way: sold %d, refused %d, %d left; want %d, %d, 0", way, o.Sold, o.Refused, o.Left, stock, orders-stock)
		}
	}
	if !res.Tasks.InSeqOrder {
		t.Error("the ordered tasks did not sell to the first orders in sequence order")
	}
}
