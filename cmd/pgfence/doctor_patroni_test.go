package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/patroni"
)

// Run against each node of a Patroni cluster, the doctor says what the node
// is: the primary and its timeline, a standby with the timeline it replays
// and the node it streams from; through the multi-host URL it reaches the
// primary. After a switchover the roles and the timeline follow.
func TestDoctorUnderPatroni(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := patroni.Start(ctx, nil)
	if err != nil {
		if errors.Is(err, patroni.ErrNotInstalled) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(c.Close)

	check := func(when string, primary, standby *patroni.Node, timeline string) {
		t.Helper()
		wantPrimary := "primary on timeline " + timeline + " "
		if got := doctorCheck(t, map[string]string{"DATABASE_URL": primary.ConnString("postgres")}, "server"); got.Status != statusOK || !strings.Contains(got.Detail, wantPrimary) {
			t.Errorf("%s: doctor on %s = %+v, want %q", when, primary.Name, got, wantPrimary)
		}
		// A standby that just started following reports its upstream once
		// its WAL receiver streams: wait for that, boundedly.
		wantStandby := "is a standby (in recovery) on timeline " + timeline + ", streaming from " + primary.Addr()
		var got check
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			got = doctorCheck(t, map[string]string{"DATABASE_URL": standby.ConnString("postgres")}, "server")
			if got.Status == statusFail && strings.Contains(got.Detail, wantStandby) || time.Now().After(deadline) {
				break
			}
		}
		if got.Status != statusFail || !strings.Contains(got.Detail, wantStandby) {
			t.Errorf("%s: doctor on %s = %+v, want %q", when, standby.Name, got, wantStandby)
		}
		if got := doctorCheck(t, map[string]string{"DATABASE_URL": c.ConnString("postgres")}, "server"); !strings.Contains(got.Detail, wantPrimary) {
			t.Errorf("%s: doctor on the multi-host URL = %+v, want %q", when, got, wantPrimary)
		}
		if got := doctorCheck(t, map[string]string{"DATABASE_URL": primary.ConnString("postgres")}, "replication"); !strings.Contains(got.Detail, "1 asynchronous standby") {
			t.Errorf("%s: doctor's replication check on %s = %+v, want 1 asynchronous standby", when, primary.Name, got)
		}
	}
	nodes := c.Nodes()
	check("after bootstrap", nodes[0], nodes[1], "1")
	if err := c.Switchover(ctx, nodes[0], nodes[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitFor(ctx, "node1 leads on timeline 2 and node0 streams from it", func(ms []patroni.Member) bool {
		return len(ms) == 2 && ms[1].Role == patroni.RoleLeader && ms[1].Timeline == 2 &&
			ms[0].State == "running" && ms[0].Timeline == 2 && ms[0].Lag != nil
	}); err != nil {
		t.Fatal(err)
	}
	check("after a switchover", nodes[1], nodes[0], "2")
}
