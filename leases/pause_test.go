package leases_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A paused prefix refuses new grants of its keys only; current holders
// renew, write with their token and release; resume lets grants in again;
// both are recorded with who and why.
func TestPauseGrants(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, time.Minute)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})

	holding, err := c.TryAcquire(ctx, "deploy:a", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if added, err := c.PauseGrants(ctx, "deploy:", "rollout v2"); err != nil || !added {
		t.Fatalf("PauseGrants = %v, %v; want a new pause", added, err)
	}
	if added, err := c.PauseGrants(ctx, "deploy:", "rollout v2, take two"); err != nil || added {
		t.Fatalf("PauseGrants again = %v, %v; want the existing pause", added, err)
	}

	for _, key := range []string{"deploy:b", "deploy:"} {
		_, err := c.TryAcquire(ctx, key, time.Minute, nil)
		if !errors.Is(err, pgfence.ErrGrantsPaused) || pgerr.Code(err) != pgerr.CodeGrantsPaused {
			t.Errorf("TryAcquire(%q) while paused: want ErrGrantsPaused (PF011), got %v", key, err)
		}
	}
	// Keys outside the prefix, and keys that only match it as a pattern.
	if _, err := c.PauseGrants(ctx, "a_%", "pattern characters are literal"); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"other:b", "deplo", "abc", "a_"} {
		l, err := c.TryAcquire(ctx, key, time.Minute, nil)
		if err != nil {
			t.Errorf("TryAcquire(%q) outside the paused prefixes: %v", key, err)
			continue
		}
		_ = l.Release(ctx)
	}
	if _, err := c.TryAcquire(ctx, "a_%x", time.Minute, nil); !errors.Is(err, pgfence.ErrGrantsPaused) {
		t.Errorf("TryAcquire(a_%%x) under the literal prefix a_%%: want ErrGrantsPaused, got %v", err)
	}
	// Raw SQL clients get PF011 from try_acquire and acquire.
	for _, q := range []string{
		`SELECT * FROM pgfence.try_acquire('deploy:c', interval '1 minute')`,
		`SELECT * FROM pgfence.acquire('deploy:c', interval '1 minute')`,
	} {
		if _, err := pool.Exec(ctx, q); pgerr.Code(err) != pgerr.CodeGrantsPaused {
			t.Errorf("%s: want PF011, got %v", q, err)
		}
	}

	// The current holder finishes its work.
	if err := holding.Renew(ctx); err != nil {
		t.Fatalf("Renew while paused: %v", err)
	}
	if _, err := pgfence.Exec(ctx, pool, holding, `SELECT 1`); err != nil {
		t.Fatalf("fenced write by the current holder while paused: %v", err)
	}
	if err := holding.Release(ctx); err != nil {
		t.Fatalf("Release while paused: %v", err)
	}
	// ... and cannot get it back until the resume.
	if _, err := c.TryAcquire(ctx, "deploy:a", time.Minute, nil); !errors.Is(err, pgfence.ErrGrantsPaused) {
		t.Errorf("re-acquire while paused: want ErrGrantsPaused, got %v", err)
	}

	pauses, err := c.Pauses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pauses) != 2 || pauses[1].Prefix != "deploy:" || pauses[1].Reason != "rollout v2, take two" || pauses[1].PausedBy == "" {
		t.Fatalf("Pauses = %+v", pauses)
	}

	if removed, err := c.ResumeGrants(ctx, "deploy:", "v2 is out"); err != nil || !removed {
		t.Fatalf("ResumeGrants = %v, %v", removed, err)
	}
	if removed, err := c.ResumeGrants(ctx, "deploy:", ""); err != nil || removed {
		t.Fatalf("ResumeGrants again = %v, %v; want nothing to resume", removed, err)
	}
	l, err := c.TryAcquire(ctx, "deploy:b", time.Minute, nil)
	if err != nil {
		t.Fatalf("TryAcquire after resume: %v", err)
	}
	_ = l.Release(ctx)

	rows, err := pool.Query(ctx, `SELECT prefix, action, actor = session_user, coalesce(reason, '')
		FROM pgfence.grant_pause_events WHERE prefix = 'deploy:' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type event struct {
		Prefix, Action string
		ByMe           bool
		Reason         string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[event])
	if err != nil {
		t.Fatal(err)
	}
	want := []event{
		{"deploy:", "paused", true, "rollout v2"},
		{"deploy:", "paused", true, "rollout v2, take two"},
		{"deploy:", "resumed", true, "v2 is out"},
	}
	if len(got) != len(want) {
		t.Fatalf("pause history = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("pause history[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}

	// A prefix no key can have is refused by both, naming the limit.
	long := strings.Repeat("p", leases.MaxKeyBytes+1)
	if _, err := c.PauseGrants(ctx, long, "r"); !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), "at most 512 bytes") {
		t.Errorf("PauseGrants of a 513-byte prefix: %v", err)
	}
	if _, err := c.ResumeGrants(ctx, long, ""); !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), "at most 512 bytes") {
		t.Errorf("ResumeGrants of a 513-byte prefix: %v, want ErrInvalid (not 'no pause')", err)
	}
}

// A waiting Acquire treats a pause like a held key: it keeps polling until its
// deadline (then the error wraps ErrGrantsPaused), and is granted once the
// pause is lifted.
func TestAcquireWaitsOutPause(t *testing.T) {
	checkLeaks(t)
	ctx := ctxTimeout(t, time.Minute)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, PollInterval: 50 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	if _, err := c.PauseGrants(ctx, "job:", "maintenance"); err != nil {
		t.Fatal(err)
	}

	// Failing fast would return ErrGrantsPaused without the deadline. (The
	// last attempt's error is usually ErrGrantsPaused too, unless the
	// deadline cut an attempt short.)
	_, err := c.Acquire(ctx, "job:1", time.Minute, &leases.AcquireOptions{MaxWait: 300 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire while paused: want it to wait until its deadline, got %v", err)
	}
	if _, err := c.Get(ctx, "job:1"); !errors.Is(err, pgfence.ErrNotFound) {
		t.Fatalf("a lease row exists for a paused key: %v", err)
	}

	type result struct {
		l   *leases.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := c.Acquire(ctx, "job:1", time.Minute, &leases.AcquireOptions{Fair: true})
		done <- result{l, err}
	}()
	// The fair waiter's queue row shows it is polling.
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_waiters WHERE key = 'job:1'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("Acquire returned while paused: %v, %v", r.l, r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if _, err := c.ResumeGrants(ctx, "job:", ""); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Acquire after resume: %v", r.err)
	}
	_ = r.l.Release(ctx)
}

// Every grant records the client library version: the Go client's, or NULL
// for a plain SQL client, on the lease row and on the grant event.
func TestClientVersionRecorded(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, time.Minute)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})

	if v := leases.ClientVersion(); len(v) <= len("pgfence-go/") || v[:len("pgfence-go/")] != "pgfence-go/" {
		t.Fatalf("ClientVersion() = %q, want pgfence-go/<version>", v)
	}
	l, err := c.TryAcquire(ctx, "v:go", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Get(ctx, "v:go")
	if err != nil {
		t.Fatal(err)
	}
	if st.ClientVersion != leases.ClientVersion() {
		t.Errorf("Status.ClientVersion = %q, want %q", st.ClientVersion, leases.ClientVersion())
	}
	hist, err := c.History(ctx, "v:go", 1)
	if err != nil || len(hist) != 1 || hist[0].Kind != "acquired" || hist[0].ClientVersion != leases.ClientVersion() {
		t.Errorf("History = %+v, %v; want the acquired entry with the client version", hist, err)
	}
	_ = l.Release(ctx)

	// A plain SQL grant of the same key replaces the version with NULL.
	if _, err := pool.Exec(ctx, `SELECT * FROM pgfence.try_acquire('v:go', interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	var version *string
	if err := pool.QueryRow(ctx, `SELECT client_version FROM pgfence.lease_status WHERE key = 'v:go'`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version != nil {
		t.Errorf("lease_status.client_version after a SQL grant = %q, want NULL", *version)
	}
	if _, err := pool.Exec(ctx, `SELECT * FROM pgfence.try_acquire('v:long', interval '1 minute', '', NULL, repeat('x', 129))`); pgerr.Code(err) != pgerr.CodeInvalid {
		t.Errorf("a 129-byte client version: want PF008, got %v", err)
	}
}
