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

func TestInventory(t *testing.T) {
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
	// 8 orders of 2 on 10 units: exactly 5 fit, whatever the order.
	if res.Accepted != initialStock/quantity || res.Deducted != initialStock || res.FinalStock != 0 {
		t.Errorf("accepted %d orders (%d units), final stock %d; want 5 orders, 10 units, 0 left", res.Accepted, res.Deducted, res.FinalStock)
	}
	if res.OutOfStock != orders-1-res.Accepted {
		t.Errorf("%d out of stock, want %d", res.OutOfStock, orders-1-res.Accepted)
	}
	if res.OrdersInTable != res.Accepted {
		t.Errorf("%d orders stored, %d accepted", res.OrdersInTable, res.Accepted)
	}
	if !res.StaleRejected {
		t.Error("the frozen worker's late write was not rejected")
	}
	if !res.UnfencedRejected {
		t.Error("the direct UPDATE without a token was not rejected")
	}
}
