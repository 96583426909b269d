package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// Both modes lock and unlock through a real redis-server; the figures are not
// asserted (speed is measured, never tested), only that the work was done and
// counted: each op is one SET NX PX and one compare-and-delete script.
func TestMeasure(t *testing.T) {
	if findServer() == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not found; CI must install it")
		}
		t.Skip("redis-server not found")
	}
	for _, mode := range []Mode{Durable, Memory} {
		t.Run(string(mode), func(t *testing.T) {
			r, err := Measure(context.Background(), mode, 2, 200*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if r.Skipped != "" || r.Ops == 0 || r.Errors != 0 || r.Case != "redis-"+string(mode) || r.Workers != 2 {
				t.Fatalf("%+v", r)
			}
			if r.StatementsPerOp < 2 || r.StatementsPerOp > 2.1 {
				t.Fatalf("%.2f commands per op, want 2 (SET NX PX + EVALSHA)", r.StatementsPerOp)
			}
		})
	}
}

// Without redis-server the result says so instead of pretending to measure.
func TestMeasureWithoutServer(t *testing.T) {
	t.Setenv("REDIS_SERVER", "/nonexistent/redis-server")
	r, err := Measure(context.Background(), Memory, 1, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.Skipped, "redis-server not found") || r.Ops != 0 {
		t.Fatalf("%+v", r)
	}
}

func TestUnknownMode(t *testing.T) {
	if _, err := Measure(context.Background(), "fast", 1, time.Millisecond); err == nil {
		t.Fatal("mode fast accepted")
	}
}
