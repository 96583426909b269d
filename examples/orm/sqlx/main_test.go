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

func TestSQLXIdempotentHandler(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, db.URL, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.FinalStock != initialStock-4 || res.Orders["A"] != 0 || res.Orders["B"] != 2 {
		t.Errorf("stock %d, orders %v; want %d, none by the stale A, 2 by B", res.FinalStock, res.Orders, initialStock-4)
	}
	if res.Replayed != 1 || res.Conflicts != 1 {
		t.Errorf("%d replayed, %d conflicts; want 1 and 1", res.Replayed, res.Conflicts)
	}
}
