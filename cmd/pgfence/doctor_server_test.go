package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The doctor says what each node is: a primary and the timeline its tokens
// carry, a standby and the timeline it replays from whom, and after a
// promotion the new timeline.
func TestDoctorServerRole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster := pgfencetest.NewCluster(t, &pgfencetest.ClusterOptions{Settings: map[string]string{"fsync": "off"}})
	db := cluster.NewDatabase(t)
	primary := pgcluster.At(cluster.Addr())
	standby, err := primary.StartStandby(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	if err := primary.WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}

	server := func(url string) check {
		t.Helper()
		return doctorCheck(t, map[string]string{"DATABASE_URL": url}, "server")
	}
	if c := server(db.URL); c.Status != statusOK || !strings.Contains(c.Detail, "primary on timeline 1 (the tokens it issues are above 1 << 40)") {
		t.Errorf("doctor on the primary: %+v", c)
	}
	standbyURL := standby.ConnString(db.Name)
	if c := server(standbyURL); c.Status != statusFail ||
		!strings.Contains(c.Detail, "is a standby (in recovery) on timeline 1, streaming from "+primary.Addr()) {
		t.Errorf("doctor on the standby: %+v", c)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if c := server(standbyURL); c.Status != statusOK || !strings.Contains(c.Detail, "primary on timeline 2 (the tokens it issues are above 2 << 40)") {
		t.Errorf("doctor on the promoted standby: %+v", c)
	}
}
