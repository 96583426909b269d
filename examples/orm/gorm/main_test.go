package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

func TestGORMInventory(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, db.URL, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !res.StaleRejected {
		t.Error("the stale holder's deduction was not refused")
	}
	if res.FinalStock != initialStock-quantity || len(res.Orders) != 1 || res.Orders[0] != "B" {
		t.Errorf("stock %d, orders by %v; want %d and only B's", res.FinalStock, res.Orders, initialStock-quantity)
	}
}
