package job_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/job"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const effects = `CREATE TABLE effects (slot text NOT NULL, token bigint NOT NULL, by text NOT NULL)`

func newRunner(t *testing.T, pool *pgxpool.Pool, cfg *job.Config) *job.Runner {
	t.Helper()
	r, err := job.New(newClient(t, pool, nil), "jobs/nightly", cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// effect is a run's business write, completing the slot with it.
func effect(s *job.Slot, by string) error {
	return s.Finish(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2, $3)`, s.Name(), s.Lease().Token(), by)
		return err
	})
}

func countEffects(t *testing.T, pool *pgxpool.Pool, slot string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE slot = $1`, slot).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Runners of three replicas call Run for the same slot at once: one
// completes it, the others find it completed; the effect exists once.
func TestRunOncePerSlot(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := pool.Exec(ctx, effects); err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results []job.Result
	)
	for _, name := range []string{"a", "b", "c"} {
		r := newRunner(t, pool, nil)
		wg.Go(func() {
			res, err := r.Run(ctx, "2026-12-03", func(ctx context.Context, s *job.Slot) error { return effect(s, name) })
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			results = append(results, res)
			mu.Unlock()
		})
	}
	wg.Wait()
	completed := 0
	for _, res := range results {
		if res.Ran {
			completed++
		} else if res.CompletedAt.IsZero() || res.Token == 0 {
			t.Errorf("result %+v", res)
		}
	}
	if completed != 1 || countEffects(t, pool, "2026-12-03") != 1 {
		t.Fatalf("%d runs completed the slot, %d effects; want 1 and 1: %+v", completed, countEffects(t, pool, "2026-12-03"), results)
	}
}

// A run that fails after saving a checkpoint leaves the slot unfinished; the
// next run takes it over and resumes from the checkpoint, or with Restart
// starts over.
func TestTakeoverResumesOrRestarts(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := pool.Exec(ctx, effects); err != nil {
		t.Fatal(err)
	}
	for _, restart := range []bool{false, true} {
		slot := map[bool]string{false: "resume", true: "restart"}[restart]
		r := newRunner(t, pool, &job.Config{Restart: restart})
		var first int64
		_, err := r.Run(ctx, slot, func(ctx context.Context, s *job.Slot) error {
			first = s.Lease().Token()
			if s.Runs() != 1 || s.Checkpoint() != "" {
				t.Errorf("first run: runs %d, checkpoint %q", s.Runs(), s.Checkpoint())
			}
			if err := s.Save(ctx, "step 1 of 2"); err != nil {
				return err
			}
			return errors.New("step 2 failed")
		})
		if err == nil || !strings.Contains(err.Error(), "step 2 failed") {
			t.Fatalf("failed run: %v", err)
		}
		if got, err := r.Unfinished(ctx); err != nil || len(got) != 1 || got[0] != slot {
			t.Fatalf("Unfinished = %v, %v", got, err)
		}
		res, err := r.Run(ctx, slot, func(ctx context.Context, s *job.Slot) error {
			want := map[bool]string{false: "step 1 of 2", true: ""}[restart]
			if s.Runs() != 2 || job.TakenOverFrom(s) != first || s.Checkpoint() != want {
				t.Errorf("%s: the takeover sees runs %d, taken over from %d, checkpoint %q; want 2, %d, %q", slot, s.Runs(), job.TakenOverFrom(s), s.Checkpoint(), first, want)
			}
			return effect(s, "second")
		})
		if err != nil || !res.Ran || res.Runs != 2 {
			t.Fatalf("takeover: %+v %v", res, err)
		}
		if got, err := r.Unfinished(ctx); err != nil || len(got) != 0 {
			t.Fatalf("Unfinished after the takeover = %v, %v", got, err)
		}
	}
}

// A run frozen past its lease (a GC pause, a stopped container): another
// replica takes the slot over. The frozen run wakes while the takeover is
// still running, before the takeover wrote anything: its completion, with
// its result, is refused (the takeover fenced the job when it began). The
// takeover completes; the effect exists once.
func TestFrozenRunRefused(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := pool.Exec(ctx, effects); err != nil {
		t.Fatal(err)
	}
	frozen := newRunner(t, pool, &job.Config{TTL: 2 * time.Second})
	other := newRunner(t, pool, &job.Config{TTL: 2 * time.Second})

	began := make(chan struct{})
	wake := make(chan struct{})
	late := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		_, err := frozen.Run(ctx, "slot", func(_ context.Context, s *job.Slot) error {
			close(began)
			<-wake // frozen, deaf to its context
			err := effect(s, "frozen")
			late <- err
			return err
		})
		done <- err
	}()
	<-began
	backdate(t, pool, "jobs/nightly") // its lease runs out by the database clock
	res, err := other.Run(ctx, "slot", func(_ context.Context, s *job.Slot) error {
		if s.Runs() != 2 {
			t.Errorf("the takeover is run %d, want 2", s.Runs())
		}
		close(wake)
		var stale *pgfence.StaleTokenError
		if err := <-late; !errors.As(err, &stale) || stale.Presented >= s.Lease().Token() {
			t.Errorf("the frozen run's late completion: %v, want a stale token", err)
		}
		return effect(s, "other")
	})
	if err != nil || !res.Ran {
		t.Fatalf("takeover: %+v %v", res, err)
	}
	if err := <-done; err == nil {
		t.Fatal("the frozen run's Run returned nil")
	}
	if n := countEffects(t, pool, "slot"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	var by string
	if err := pool.QueryRow(ctx, `SELECT by FROM effects`).Scan(&by); err != nil || by != "other" {
		t.Fatalf("effect by %q %v, want the takeover's", by, err)
	}
}

// A run whose lease expired, with nobody having taken over yet, cannot
// complete its slot: the completion checks the lease by the database clock.
func TestExpiredRunCannotComplete(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := pool.Exec(ctx, effects); err != nil {
		t.Fatal(err)
	}
	r := newRunner(t, pool, nil)
	_, err := r.Run(ctx, "slot", func(_ context.Context, s *job.Slot) error {
		backdate(t, pool, "jobs/nightly")
		return effect(s, "expired")
	})
	if !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("completion by an expired run: %v, want ErrLeaseLost", err)
	}
	if n := countEffects(t, pool, "slot"); n != 0 {
		t.Fatalf("%d effects of a refused completion", n)
	}
	if got, err := r.Unfinished(ctx); err != nil || len(got) != 1 {
		t.Fatalf("Unfinished = %v, %v; want the slot", got, err)
	}
}

// Complete in the caller's transaction: the slot completes with the
// transaction's commit, and not when it rolls back.
func TestCompleteInCallersTransaction(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := pool.Exec(ctx, effects); err != nil {
		t.Fatal(err)
	}
	r := newRunner(t, pool, nil)
	inTx := func(commit bool) func(ctx context.Context, s *job.Slot) error {
		return func(ctx context.Context, s *job.Slot) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2, 'tx')`, s.Name(), s.Lease().Token()); err != nil {
				return err
			}
			if err := s.Complete(ctx, tx); err != nil {
				return err
			}
			if !commit {
				return tx.Rollback(ctx) // and, wrongly, no error
			}
			return tx.Commit(ctx)
		}
	}
	if _, err := r.Run(ctx, "s", inTx(false)); err == nil || !strings.Contains(err.Error(), "did not commit") {
		t.Fatalf("a completion rolled back: %v, want an error", err)
	}
	res, err := r.Run(ctx, "s", inTx(true))
	if err != nil || !res.Ran || countEffects(t, pool, "s") != 1 {
		t.Fatalf("a completion committed: %+v %v, %d effects", res, err, countEffects(t, pool, "s"))
	}
	if res, err := r.Run(ctx, "s", inTx(true)); err != nil || res.Ran {
		t.Fatalf("again: %+v %v", res, err)
	}
}

// RunPeriod names the slot by the database clock; a second call in the same
// period skips it. A function that returns nil without finishing completes
// the slot all the same.
func TestRunPeriod(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	r := newRunner(t, pool, nil)
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	ran := 0
	res, err := r.RunPeriod(ctx, 24*time.Hour, func(context.Context, *job.Slot) error { ran++; return nil })
	if err != nil || !res.Ran {
		t.Fatal(res, err)
	}
	if want := now.UTC().Truncate(24 * time.Hour).Format(time.RFC3339); res.Slot != want || !strings.HasSuffix(want, "T00:00:00Z") {
		t.Fatalf("slot %q, want %q", res.Slot, want)
	}
	res, err = r.RunPeriod(ctx, 24*time.Hour, func(context.Context, *job.Slot) error { ran++; return nil })
	if err != nil || res.Ran || ran != 1 {
		t.Fatalf("second call: %+v %v, ran %d", res, err, ran)
	}
	if _, err := r.RunPeriod(ctx, time.Millisecond, func(context.Context, *job.Slot) error { return nil }); !errors.Is(err, pgfence.ErrInvalid) {
		t.Fatalf("a period of 1ms: %v", err)
	}
}

// TryOnce skips the slot while another replica runs the job.
func TestTryOnceSkipsWhileRunning(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	a := newRunner(t, pool, nil)
	b := newRunner(t, pool, &job.Config{AcquireOptions: leases.AcquireOptions{TryOnce: true}})
	running := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := a.Run(ctx, "s", func(context.Context, *job.Slot) error { close(running); <-release; return nil })
		done <- err
	}()
	<-running
	res, err := b.Run(ctx, "s", func(context.Context, *job.Slot) error { t.Error("ran"); return nil })
	if !errors.Is(err, pgfence.ErrLeaseHeld) {
		t.Fatalf("TryOnce while running: %v", err)
	}
	// The result and the error still name the slot that was skipped.
	if res.Slot != "s" || !strings.Contains(err.Error(), `slot "s"`) {
		t.Errorf("TryOnce while running: %+v, %q; want slot s named in both", res, err)
	}
	// A RunPeriod's slot is decided by its grant: none here.
	res, err = b.RunPeriod(ctx, time.Hour, func(context.Context, *job.Slot) error { t.Error("ran"); return nil })
	if !errors.Is(err, pgfence.ErrLeaseHeld) || res.Slot != "" || strings.Contains(err.Error(), "slot") {
		t.Errorf("RunPeriod while running: %+v, %q; want ErrLeaseHeld without a slot", res, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The SQL functions refuse arguments out of bounds (PF008) and a grant that
// does not hold the job's lease (PF002).
func TestSlotFunctionsRefuse(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	c := newClient(t, pool, nil)
	// Driven by hand over SQL, and expired below: not kept alive.
	l, err := c.TryAcquire(ctx, "jobs/x", time.Minute, &leases.AcquireOptions{NoKeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	for q, code := range map[string]string{
		`SELECT * FROM pgfence.job_slot_begin($1, $2, $3, repeat('s', 257))`:              pgerr.CodeInvalid,
		`SELECT * FROM pgfence.job_slot_begin($1, $2, $3, '')`:                            pgerr.CodeInvalid,
		`SELECT * FROM pgfence.job_slot_begin($1, $2, $3::bigint + 1, 's')`:               pgerr.CodeLeaseNotHeld,
		`SELECT pgfence.job_slot_save($1, $2, $3, 's', repeat('x', 65537))`:               pgerr.CodeInvalid,
		`SELECT pgfence.job_slot_complete($1, $2, $3, 'never begun')`:                     pgerr.CodeLeaseNotHeld,
		`SELECT pgfence.job_slot_missed($1, $2, $3, now(), interval '0.5 s')`:             pgerr.CodeInvalid,
		`SELECT pgfence.job_slot_missed($1, $2, $3, NULL, interval '1 day')`:              pgerr.CodeInvalid,
		`SELECT pgfence.job_slot_missed($1, $2, $3::bigint + 1, now(), interval '1 day')`: pgerr.CodeLeaseNotHeld,
	} {
		if _, err := pool.Exec(ctx, q, "jobs/x", l.Holder(), l.Token()); pgerr.Code(err) != code {
			t.Errorf("%s: %v, want %s", q, err, code)
		}
	}

	// Complete needs the transaction of the run's last write.
	begun, err := job.New(c, "jobs/nil-tx", nil)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	if _, err := begun.Run(ctx, "s", func(ctx context.Context, s *job.Slot) error {
		ran = true
		if err := s.Complete(ctx, nil); !errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("Complete(nil): %v, want ErrInvalid", err)
		}
		return errors.New("left unfinished")
	}); err == nil || !ran {
		t.Errorf("Run: ran %v, %v; want fn run and its error", ran, err)
	}

	// New refuses what every Run would: the key's text, a renewal interval
	// the TTL leaves no room for, a holder description over the limit, a
	// lease not kept alive.
	for name, bad := range map[string]func() error{
		"key": func() error { _, err := job.New(c, "jobs/\x00", nil); return err },
		"AcquireOptions.RenewInterval": func() error {
			_, err := job.New(c, "jobs/y", &job.Config{TTL: time.Second, AcquireOptions: leases.AcquireOptions{RenewInterval: time.Second}})
			return err
		},
		"AcquireOptions.HolderInfo": func() error {
			_, err := job.New(c, "jobs/y", &job.Config{AcquireOptions: leases.AcquireOptions{HolderInfo: strings.Repeat("x", leases.MaxHolderInfoBytes+1)}})
			return err
		},
		"Config.NoKeepAlive": func() error {
			_, err := job.New(c, "jobs/y", &job.Config{AcquireOptions: leases.AcquireOptions{NoKeepAlive: true}})
			return err
		},
	} {
		if err := bad(); !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), name) {
			t.Errorf("job.New with a bad %s: %v, want ErrInvalid naming it", name, err)
		}
	}

	// A refused checkpoint says why: the slot was completed by this very run,
	// or begun by an earlier grant's run that this one has not taken over.
	refused := func(l *leases.Lease, slot, want string) {
		t.Helper()
		_, err := pool.Exec(ctx, `SELECT pgfence.job_slot_save($1, $2, $3, $4, 'cp')`, l.Key(), l.Holder(), l.Token(), slot)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != pgerr.CodeLeaseNotHeld || !strings.Contains(pe.Message, want) {
			t.Errorf("save of slot %s by token %d: %v, want PF002 with %q", slot, l.Token(), err, want)
		}
	}
	for _, q := range []string{
		`SELECT * FROM pgfence.job_slot_begin($1, $2, $3, 'done')`,
		`SELECT pgfence.job_slot_complete($1, $2, $3, 'done')`,
		`SELECT * FROM pgfence.job_slot_begin($1, $2, $3, 'left')`,
		`SELECT * FROM pgfence.job_slot_begin($1, $2, $3, '2026-12-01T00:00:00Z')`,
	} {
		if _, err := pool.Exec(ctx, q, "jobs/x", l.Holder(), l.Token()); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	refused(l, "done", "was already completed")
	// The day between the job's last period slot and the given one is missed;
	// a missed slot was begun by no run, not even the grant that recorded it.
	var missed []string
	if err := pool.QueryRow(ctx, `SELECT pgfence.job_slot_missed($1, $2, $3, '2026-12-03T00:00:00Z', interval '1 day')`, "jobs/x", l.Holder(), l.Token()).
		Scan(&missed); err != nil || !slices.Equal(missed, []string{"2026-12-02T00:00:00Z"}) {
		t.Fatalf("job_slot_missed: %v, %v; want the day between", missed, err)
	}
	refused(l, "2026-12-02T00:00:00Z", "was never begun")
	if _, err := pool.Exec(ctx, `SELECT pgfence.job_slot_complete($1, $2, $3, '2026-12-02T00:00:00Z')`, "jobs/x", l.Holder(), l.Token()); pgerr.Code(err) != pgerr.CodeLeaseNotHeld {
		t.Errorf("completing a missed slot never begun: %v, want PF002", err)
	}
	var (
		runs     int
		previous *int64
	)
	if err := pool.QueryRow(ctx, `SELECT runs, previous_token FROM pgfence.job_slot_begin($1, $2, $3, '2026-12-02T00:00:00Z')`, "jobs/x", l.Holder(), l.Token()).
		Scan(&runs, &previous); err != nil || runs != 1 || previous != nil {
		t.Errorf("a missed slot begun: run %d, previous token %v, %v; want run 1, none", runs, previous, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgfence.leases SET expires_at = granted_at WHERE key = 'jobs/x'`); err != nil {
		t.Fatal(err)
	}
	next, err := c.TryAcquire(ctx, "jobs/x", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	refused(next, "left", "was begun by the run of token")
}

// A slot's checkpoint may be saved from several goroutines of the run at
// once: the saves are made one at a time, and the slot's Checkpoint is the
// one the database kept.
func TestConcurrentSaves(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	r := newRunner(t, pool, nil)
	_, err := r.Run(ctx, "s", func(ctx context.Context, s *job.Slot) error {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Go(func() {
				errs <- s.Save(ctx, fmt.Sprintf("part %d", i))
				_ = s.Checkpoint()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return err
			}
		}
		var stored string
		if err := pool.QueryRow(ctx, `SELECT checkpoint FROM pgfence.job_slots WHERE key = 'jobs/nightly' AND slot = 's'`).Scan(&stored); err != nil {
			return err
		}
		if got := s.Checkpoint(); got != stored {
			t.Errorf("Checkpoint %q, the database kept %q", got, stored)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A run whose completion committed is reported completed, also when its
// lease is lost before Run releases it (an operator force-released it).
func TestCompletedRunSurvivesALaterLoss(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	r := newRunner(t, pool, nil)
	operator := newClient(t, pool, nil)
	res, err := r.Run(ctx, "s", func(ctx context.Context, s *job.Slot) error {
		if err := s.Finish(ctx, nil); err != nil {
			return err
		}
		_, err := operator.ForceRelease(ctx, "jobs/nightly", "test: lost after the completion")
		return err
	})
	if err != nil || !res.Ran || res.Slot != "s" {
		t.Fatalf("Run: %+v, %v; want it ran, without an error", res, err)
	}
	again, err := r.Run(ctx, "s", func(context.Context, *job.Slot) error { t.Error("ran again"); return nil })
	if err != nil || again.Ran {
		t.Fatalf("the next Run: %+v, %v; want it completed before", again, err)
	}
}

// A Save waiting for the slot's row while Complete's transaction holds it
// does not block Complete: the transaction commits, the slot completes,
// and the Save then finds the slot completed.
func TestSaveWaitingForCompleteDoesNotBlockIt(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	r := newRunner(t, pool, nil)
	saved := make(chan error, 1)
	res, err := r.Run(ctx, "s", func(ctx context.Context, s *job.Slot) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
		if err := s.Complete(ctx, tx); err != nil {
			return err
		}
		go func() { saved <- s.Save(ctx, "late") }()
		// The Save waits for the slot's row, which tx holds.
		deadline := time.Now().Add(10 * time.Second)
		for {
			var waiting bool
			if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
  WHERE wait_event_type = 'Lock' AND query LIKE '%job_slot_save%')`).Scan(&waiting); err != nil {
				return err
			}
			if waiting {
				break
			}
			if time.Now().After(deadline) {
				return errors.New("the Save never waited for the slot's row")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if got := s.Checkpoint(); got != "" {
			t.Errorf("Checkpoint while a Save waits: %q", got)
		}
		return tx.Commit(ctx)
	})
	if err != nil || !res.Ran {
		t.Fatalf("Run: %+v, %v", res, err)
	}
	if err := <-saved; err == nil {
		t.Error("a Save after the slot completed succeeded")
	}
}

// A run's completion whose COMMIT a pooler forwarded and then answered with
// its FATAL 08P01 (PgBouncer's "server conn crashed?") is an unknown outcome,
// never "not sent": the slot did complete, and the next Run of the slot
// reports it completed by that run's token instead of running it again.
func TestCompletionAnsweredByPoolerFatal(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	if _, err := db.Pool.Exec(ctx, effects); err != nil {
		t.Fatal(err)
	}
	proxy := leasetest.NewProxy(t, db.URL)
	proxy.SetPoolerFatal(true)
	r := newRunner(t, leasetest.ProxiedPool(t, db.URL, proxy), nil)
	var (
		token int64
		trig  *faultproxy.Trigger
	)
	_, err := r.Run(ctx, "2026-12-07", func(ctx context.Context, s *job.Slot) error {
		token = s.Lease().Token()
		trig = proxy.CutAfter(faultproxy.IsCommit) // the completion's, not the slot's begin
		return effect(s, "a")
	})
	<-trig.Done()
	if !trig.Replied() || !errors.Is(err, pgfence.ErrOutcomeUnknown) || errors.Is(err, pgfence.ErrUnavailable) {
		t.Fatalf("completion answered by the pooler's FATAL (server finished %v): %v, want ErrOutcomeUnknown", trig.Replied(), err)
	}
	res, err := newRunner(t, db.Pool, nil).Run(ctx, "2026-12-07", func(ctx context.Context, s *job.Slot) error { return effect(s, "b") })
	if err != nil || res.Ran || res.Token != token || countEffects(t, db.Pool, "2026-12-07") != 1 {
		t.Fatalf("the slot after its completion's reply was lost: %+v, %v, %d effects; want completed by token %d, one effect",
			res, err, countEffects(t, db.Pool, "2026-12-07"), token)
	}
}

// renameSlot backdates a slot of jobs/nightly: it is renamed as the slot of
// an earlier period, as if the job had last run then.
func renameSlot(t *testing.T, pool *pgxpool.Pool, from, to string) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), `UPDATE pgfence.job_slots SET slot = $2 WHERE key = 'jobs/nightly' AND slot = $1`, from, to)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("rename slot %s to %s: %v, %d rows", from, to, err, tag.RowsAffected())
	}
}

// days names the daily slots relative to today's.
func days(t *testing.T, today string) func(int) string {
	t.Helper()
	d, err := time.Parse(time.RFC3339, today)
	if err != nil {
		t.Fatal(err)
	}
	return func(n int) string { return d.AddDate(0, 0, n).Format(time.RFC3339) }
}

// A period in which no run began its slot — the replicas were busy with an
// earlier period, waiting out a dead runner's lease, or stopped — is not lost
// without a trace: the next RunPeriod records it as missed, Unfinished lists
// it, and Run runs it late, once, as its first run. (The job's last run is
// backdated three days.)
func TestRunPeriodRecordsMissedPeriods(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	r := newRunner(t, pool, nil)
	var ran []string
	fn := func(_ context.Context, s *job.Slot) error { ran = append(ran, s.Name()); return nil }
	res, err := r.RunPeriod(ctx, 24*time.Hour, fn)
	if err != nil || !res.Ran {
		t.Fatal(res, err)
	}
	day := days(t, res.Slot)
	renameSlot(t, pool, day(0), day(-3))

	ran = nil
	if res, err := r.RunPeriod(ctx, 24*time.Hour, fn); err != nil || !res.Ran || res.Slot != day(0) {
		t.Fatalf("RunPeriod after three days: %+v, %v", res, err)
	}
	if !slices.Equal(ran, []string{day(0)}) {
		t.Fatalf("ran %v, want only today's slot (no catch-up by default)", ran)
	}
	want := []string{day(-2), day(-1)}
	if got, err := r.Unfinished(ctx); err != nil || !slices.Equal(got, want) {
		t.Fatalf("Unfinished = %v, %v; want the missed days %v", got, err, want)
	}
	var zero int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.job_slots WHERE key = 'jobs/nightly' AND runs = 0`).Scan(&zero); err != nil || zero != 2 {
		t.Fatalf("%d slots recorded with runs = 0 (%v), want 2", zero, err)
	}
	// Again in the same period: nothing more is missed, nothing runs.
	if res, err := r.RunPeriod(ctx, 24*time.Hour, fn); err != nil || res.Ran || len(ran) != 1 {
		t.Fatalf("RunPeriod again: %+v, %v, ran %v", res, err, ran)
	}

	res, err = r.Run(ctx, day(-2), func(_ context.Context, s *job.Slot) error {
		if s.Runs() != 1 || job.TakenOverFrom(s) != 0 || s.Checkpoint() != "" {
			t.Errorf("a missed slot run late: runs %d, taken over from %d, checkpoint %q; want a first run", s.Runs(), job.TakenOverFrom(s), s.Checkpoint())
		}
		return nil
	})
	if err != nil || !res.Ran || res.Runs != 1 {
		t.Fatalf("Run of a missed slot: %+v, %v", res, err)
	}
	if got, err := r.Unfinished(ctx); err != nil || !slices.Equal(got, want[1:]) {
		t.Fatalf("Unfinished after running one late = %v, %v; want %v", got, err, want[1:])
	}
}

// With CatchUp, RunPeriod first runs late, oldest first and under the same
// lease, the periods no run completed among the last CatchUp: missed ones,
// and one whose late run failed (taken over by the next call, before
// anything else). An older one stays listed by Unfinished.
func TestRunPeriodCatchesUp(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	r := newRunner(t, pool, &job.Config{CatchUp: 2})
	var (
		ran  []string
		fail string
	)
	fn := func(_ context.Context, s *job.Slot) error {
		ran = append(ran, fmt.Sprintf("%s run %d", s.Name(), s.Runs()))
		if s.Name() == fail {
			return errors.New("failed")
		}
		return nil
	}
	res, err := r.RunPeriod(ctx, 24*time.Hour, fn)
	if err != nil || !res.Ran {
		t.Fatal(res, err)
	}
	day := days(t, res.Slot)
	renameSlot(t, pool, day(0), day(-4))

	ran, fail = nil, day(-1)
	res, err = r.RunPeriod(ctx, 24*time.Hour, fn)
	if err == nil || res.Slot != day(-1) || !strings.Contains(err.Error(), day(-1)) {
		t.Fatalf("a late run that fails: %+v, %v; want its error and slot", res, err)
	}
	if want := []string{day(-2) + " run 1", day(-1) + " run 1"}; !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
	ran, fail = nil, ""
	res, err = r.RunPeriod(ctx, 24*time.Hour, fn)
	if err != nil || !res.Ran || res.Slot != day(0) || res.Runs != 1 {
		t.Fatalf("RunPeriod: %+v, %v; want today's slot run", res, err)
	}
	if want := []string{day(-1) + " run 2", day(0) + " run 1"}; !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
	var late int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.job_slots WHERE key = 'jobs/nightly' AND slot IN ($1, $2) AND completed_at IS NOT NULL`,
		day(-2), day(-1)).Scan(&late); err != nil || late != 2 {
		t.Fatalf("%d of the last two missed days completed (%v)", late, err)
	}
	if got, err := r.Unfinished(ctx); err != nil || !slices.Equal(got, []string{day(-3)}) {
		t.Fatalf("Unfinished = %v, %v; want the day before the catch-up's reach, %s", got, err, day(-3))
	}
	if _, err := job.New(newClient(t, pool, nil), "jobs/x", &job.Config{CatchUp: 1000}); !errors.Is(err, pgfence.ErrInvalid) {
		t.Errorf("CatchUp 1000: %v, want ErrInvalid", err)
	}
}
