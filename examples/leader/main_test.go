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

func TestLeader(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	defer pool.Close() // its connections' goroutines end before the leak check (the harness's Close is then a no-op)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var out bytes.Buffer
	res, err := run(ctx, pool, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	// Three terms: the frozen leader's, its successor's (another replica)
	// and, once the woken leader has exited, the one after the resignation:
	// the third replica's.
	if len(res.Leaders) != 3 || res.Leaders[0] != "replica-1" || res.Leaders[1] == "replica-1" ||
		res.Leaders[2] == "replica-1" || res.Leaders[1] == res.Leaders[2] {
		t.Errorf("leaders %v, want replica-1, another, and the third", res.Leaders)
	}
	if !res.StaleRejected || !res.TicksInOrder || res.Overlap {
		t.Errorf("stale rejected %t, ticks in order %t, overlap %t", res.StaleRejected, res.TicksInOrder, res.Overlap)
	}
	// Each replica saw every term from its start on, in order, without a gap.
	for name, seen := range res.Seen {
		for i := range seen {
			if seen[i] != seen[0]+i {
				t.Errorf("%s saw terms %v", name, seen)
				break
			}
		}
	}
	// The replica running to the end saw the last term.
	for name, seen := range res.Seen {
		if name != res.Leaders[1] && name != "replica-1" && (len(seen) == 0 || seen[len(seen)-1] != 3) {
			t.Errorf("%s, running to the end, saw terms %v", name, seen)
		}
	}
	if len(res.Seen) != 3 {
		t.Errorf("terms seen %v, want every replica's", res.Seen)
	}
}
