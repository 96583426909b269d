package main

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

func TestHTTPAPI(t *testing.T) {
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
	if res.Orders != 1 || res.HandlerRuns != 1 {
		t.Errorf("%d orders, handler ran %d times; want 1, 1", res.Orders, res.HandlerRuns)
	}
	if len(res.Responses) != clients {
		t.Fatalf("%d responses, want %d", len(res.Responses), clients)
	}
	want := `{"order_id":1,"sku":"sku-1","quantity":2}`
	for i, r := range res.Responses {
		if r.Status != http.StatusCreated || r.Body != want || !r.Replayed {
			t.Errorf("response %d: %+v, want a replayed 201 %s", i, r, want)
		}
	}
	if res.MismatchStatus != http.StatusUnprocessableEntity {
		t.Errorf("same key, other body: %d, want 422", res.MismatchStatus)
	}
}
