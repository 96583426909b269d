package migrations_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// holdLock writes the lock row a migrator paused mid-run (lease > 0) or
// one that crashed (lease < 0) would have left, as the schema's owner.
func holdLock(t *testing.T, pool *pgxpool.Pool, application string, lease time.Duration) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO pgfence.migration_lock (holder, host, pid, application, db_user, locked_at, lease_until)
		VALUES (gen_random_uuid(), 'build-7', 4242, $1, current_user, clock_timestamp(), clock_timestamp() + make_interval(secs => $2))
		ON CONFLICT (singleton) DO UPDATE SET application = excluded.application, lease_until = excluded.lease_until`,
		application, lease.Seconds()); err != nil {
		t.Fatal(err)
	}
}

func lockRows(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pgfence.migration_lock`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func appliedVersions(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT version_id FROM pgfence.goose_db_version WHERE version_id > 0 ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// applyScript applies a script in one transaction, as `pgfence migrate sql`
// tells users to.
func applyScript(ctx context.Context, pool *pgxpool.Pool, script string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, script)
		return err
	})
}

func installScript(t *testing.T) string {
	t.Helper()
	script, err := migrations.Script(0, migrations.Latest())
	if err != nil {
		t.Fatal(err)
	}
	return script
}

// A migration that holds the lock (paused mid-run) makes Up and DownTo
// give up after LockTimeout with an error that names it; reading the
// status does not wait for it.
func TestLockHeldTimesOut(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	if _, err := db.Pool.Exec(ctx, `DELETE FROM pgfence.goose_db_version WHERE version_id = $1`, migrations.Latest()); err != nil {
		t.Fatal(err) // one migration pending, so that Up has work to wait for
	}
	holdLock(t, db.Pool, "paused-migrator", time.Hour)
	m, err := migrations.New(db.Pool, &migrations.Config{LockTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	for name, run := range map[string]func() error{
		"Up":     func() error { _, err := m.Up(ctx); return err },
		"DownTo": func() error { _, err := m.DownTo(ctx, 0); return err },
	} {
		start := time.Now()
		err := run()
		var le *migrations.LockedError
		if !errors.As(err, &le) || !errors.Is(err, migrations.ErrLocked) {
			t.Fatalf("%s with the lock held: %v, want a *LockedError", name, err)
		}
		if le.Holder.Host != "build-7" || le.Holder.PID != 4242 || le.Holder.Application != "paused-migrator" || le.Holder.LeaseUntil.Before(time.Now()) {
			t.Errorf("%s: holder %+v, want the row's", name, le.Holder)
		}
		if waited := time.Since(start); le.Waited < 300*time.Millisecond || waited < 300*time.Millisecond {
			t.Errorf("%s gave up after %s (reported %s), before LockTimeout", name, waited, le.Waited)
		}
		for _, want := range []string{"build-7", "4242", "paused-migrator", "DELETE FROM pgfence.migration_lock"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error does not say %q: %v", name, want, err)
			}
		}
	}
	// Readers take no lock.
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	if _, err := m.Status(rctx); err != nil {
		t.Fatalf("Status while the lock is held: %v", err)
	}
	if cur, _, err := m.Version(rctx); err != nil || cur == migrations.Latest() {
		t.Fatalf("Version while the lock is held: %d, %v; want the version before the pending one", cur, err)
	}
	if pending, err := pendingOf(rctx, m); err != nil || len(pending) != 1 {
		t.Fatalf("Pending while the lock is held: %v, %v", pending, err)
	}
	if vs := appliedVersions(t, db.Pool); len(vs) != len(migrations.Versions())-1 {
		t.Fatalf("versions %v changed while the lock was held", vs)
	}

	// The caller's context bounds the wait too, under the default LockTimeout.
	patient := newMigrator(t, db.Pool)
	cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer ccancel()
	_, err = patient.Up(cctx)
	var le *migrations.LockedError
	if !errors.As(err, &le) || !errors.Is(err, context.DeadlineExceeded) || le.Holder.Application != "paused-migrator" {
		t.Fatalf("Up with a 300ms context and the lock held: %v, want a *LockedError with DeadlineExceeded", err)
	}
}

// A crashed migrator's lock (its lease lapsed) is taken over, and every run
// leaves no lock behind, also when a migration fails.
func TestLockCrashedHolderTakenOver(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := blankDatabase(t)
	m := newMigrator(t, db.Pool)
	// The migrator creates the schema and the lock table even when a
	// migration fails: make the first one fail.
	mustExecPool(t, db.Pool, `CREATE SCHEMA pgfence`)
	mustExecPool(t, db.Pool, `CREATE TABLE pgfence.token_floor (x int)`)
	if _, err := m.Up(ctx); err == nil {
		t.Fatal("Up over a conflicting table succeeded")
	}
	if n := lockRows(t, db.Pool); n != 0 {
		t.Fatalf("a failed Up left %d lock rows", n)
	}
	mustExecPool(t, db.Pool, `DROP TABLE pgfence.token_floor`)

	holdLock(t, db.Pool, "crashed-migrator", -time.Second)
	m2, err := migrations.New(db.Pool, &migrations.Config{LockTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if rs, err := m2.Up(ctx); err != nil || len(rs) != len(migrations.Versions()) {
		t.Fatalf("Up after a crashed migrator: %d applied, %v", len(rs), err)
	}
	if n := lockRows(t, db.Pool); n != 0 {
		t.Fatalf("Up left %d lock rows", n)
	}
	// Up with nothing to do takes and releases the lock too.
	holdLock(t, db.Pool, "crashed-migrator", -time.Second)
	if rs, err := m2.Up(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("second Up: %v, %v", rs, err)
	}
	if n := lockRows(t, db.Pool); n != 0 {
		t.Fatalf("second Up left %d lock rows", n)
	}
}

// The lock is the schema owner's alone: a role that can connect, even one
// granted pgfence_operator, can neither take, hold nor clear it, and the
// advisory lock the migrator took before no longer stops anything.
func TestLockOutsiders(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := blankDatabase(t)
	_, outsider := loginRole(t, db, "")
	_, operator := loginRole(t, db, "pgfence_operator")

	// Outsiders hold the advisory locks of the old migration lock and of
	// goose's default one, on a blank database and on an installed one.
	for _, key := range []int64{0x2f0e1ce5a3b1d0c7, 5887940537704921958} {
		conn, err := outsider.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
			t.Fatal(err)
		}
	}
	uctx, ucancel := context.WithTimeout(ctx, 20*time.Second)
	defer ucancel()
	m := newMigrator(t, db.Pool)
	if _, err := m.Up(uctx); err != nil {
		t.Fatalf("Up while an outsider holds advisory locks: %v", err)
	}
	if _, err := m.Status(uctx); err != nil {
		t.Fatalf("Status while an outsider holds advisory locks: %v", err)
	}

	for name, pool := range map[string]*pgxpool.Pool{"outsider": outsider, "operator": operator} {
		for _, q := range []string{
			`INSERT INTO pgfence.migration_lock (holder, host, pid, application, db_user, locked_at, lease_until)
			 VALUES (gen_random_uuid(), 'x', 1, 'x', 'x', now(), now() + interval '1 day')`,
			`SELECT 1 FROM pgfence.migration_lock FOR UPDATE`,
			`SELECT 1 FROM pgfence.migration_lock FOR KEY SHARE`,
			`LOCK TABLE pgfence.migration_lock IN ACCESS SHARE MODE`,
			`DELETE FROM pgfence.migration_lock`,
			`UPDATE pgfence.migration_lock SET lease_until = now()`,
		} {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, q)
			_ = tx.Rollback(ctx)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || (pe.Code != "42501" && pe.Code != "3F000") {
				t.Errorf("%s: %s: %v, want permission denied", name, q, err)
			}
		}
	}
}

// A migration commits only while its migrator holds the lock: when the
// lock is taken over while a run is paused, the run's next migration rolls
// back and Up says the lock was lost.
func TestLockLostRollsBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	vs := migrations.Versions()
	if _, err := newMigrator(t, db.Pool).DownTo(ctx, vs[len(vs)-2]); err != nil {
		t.Fatal(err)
	}
	before := appliedVersions(t, db.Pool)

	// Pause the run right after it took the lock.
	resume, done := pausedUp(t, ctx, db.Pool)
	// Meanwhile its lease lapsed and another migrator took the lock over.
	if _, err := db.Pool.Exec(ctx, `UPDATE pgfence.migration_lock SET holder = gen_random_uuid(), application = 'usurper'`); err != nil {
		t.Fatal(err)
	}
	resume()
	err := <-done
	if !errors.Is(err, migrations.ErrLockLost) {
		t.Fatalf("Up after losing the lock: %v, want ErrLockLost", err)
	}
	if after := appliedVersions(t, db.Pool); len(after) != len(before) {
		t.Fatalf("a migration committed without the lock: versions %v, before %v", after, before)
	}
	// The usurper's lock stays.
	var app string
	if err := db.Pool.QueryRow(ctx, `SELECT application FROM pgfence.migration_lock`).Scan(&app); err != nil || app != "usurper" {
		t.Fatalf("lock row after the lost run: %q, %v; want the usurper's", app, err)
	}
}

// pausedUp starts a Migrator's Up on pool and returns once it has taken the
// migration lock and stopped there; resume lets it go on, done gets Up's
// error.
func pausedUp(t *testing.T, ctx context.Context, pool *pgxpool.Pool) (resume func(), done <-chan error) {
	t.Helper()
	paused := &pauseHandler{at: "took the migration lock", reached: make(chan struct{}), resume: make(chan struct{})}
	m, err := migrations.New(pool, &migrations.Config{Logger: slog.New(paused)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	errc := make(chan error, 1)
	go func() {
		_, err := m.Up(ctx)
		errc <- err
	}()
	select {
	case <-paused.reached:
	case err := <-errc:
		t.Fatalf("Up returned before it took the lock: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("Up did not take the migration lock within a minute")
	}
	var once sync.Once
	resume = func() { once.Do(func() { close(paused.resume) }) }
	t.Cleanup(resume) // a test that fails before resuming does not leave Up blocked (runs before Close)
	return resume, errc
}

// pauseHandler blocks the first log record whose message is at until
// resume is closed, and closes reached when it gets there.
type pauseHandler struct {
	at      string
	reached chan struct{}
	resume  chan struct{}
	once    sync.Once
}

func (h *pauseHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *pauseHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *pauseHandler) WithGroup(string) slog.Handler            { return h }
func (h *pauseHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.at {
		h.once.Do(func() {
			close(h.reached)
			<-h.resume
		})
	}
	return nil
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	if _, err := migrations.New(pool, &migrations.Config{LockTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "LockTimeout") {
		t.Fatalf("New with a negative LockTimeout: %v, want an error naming the field", err)
	}
	// lock_timeout's largest value works; beyond it every run would fail.
	longest := math.MaxInt32 * time.Millisecond
	m, err := migrations.New(pool, &migrations.Config{LockTimeout: longest})
	if err != nil {
		t.Fatalf("New with LockTimeout %s: %v", longest, err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatalf("Up with LockTimeout %s: %v", longest, err)
	}
	m.Close()
	if _, err := migrations.New(pool, &migrations.Config{LockTimeout: longest + time.Millisecond}); err == nil || !strings.Contains(err.Error(), "Config.LockTimeout: must be at most") {
		t.Fatalf("New with LockTimeout beyond lock_timeout's range: %v, want an error naming the field", err)
	}
	// DownTo a version that is not a migration is refused before anything runs.
	m, err = migrations.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, v := range []int64{5, migrations.Latest() + 1} {
		if _, err := m.DownTo(context.Background(), v); err == nil || !strings.Contains(err.Error(), "not a pgfence migration") {
			t.Errorf("DownTo(%d): %v, want refused", v, err)
		}
	}
	if cur, _, err := m.Version(context.Background()); err != nil || cur != migrations.Latest() {
		t.Fatalf("after the refused DownTo: version %d, %v; want %d", cur, err, migrations.Latest())
	}
	cfg := pool.Config()
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if _, err := migrations.New(one, nil); err == nil || !strings.Contains(err.Error(), "MaxConns") {
		t.Fatalf("New on a one-connection pool: %v, want an error naming MaxConns", err)
	}
}

// A script takes the same lock for its transaction: a Migrator waits for it,
// and a script refuses to run while a Migrator holds the lock.
func TestScriptTakesTheLock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := blankDatabase(t)
	script := installScript(t)

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, script); err != nil {
		t.Fatal(err)
	}
	// The schema exists for the script's transaction only: the migrator
	// creates it too, then waits for the script's uncommitted lock row.
	m, err := migrations.New(db.Pool, &migrations.Config{LockTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, err = m.Up(ctx)
	var le *migrations.LockedError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "has not committed") {
		t.Fatalf("Up while a script runs: %v, want a *LockedError", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if rs, err := m.Up(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("Up after the script: %v, %v", rs, err)
	}

	down, err := migrations.Script(migrations.Latest(), 0)
	if err != nil {
		t.Fatal(err)
	}
	holdLock(t, db.Pool, "paused-migrator", time.Hour)
	err = applyScript(ctx, db.Pool, down)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55P03" || !strings.Contains(pe.Message, "paused-migrator") || !strings.Contains(pe.Hint, "DELETE FROM pgfence.migration_lock") {
		t.Fatalf("script while a migrator holds the lock: %v, want 55P03 naming it", err)
	}
	if n := lockRows(t, db.Pool); n != 1 {
		t.Fatalf("%d lock rows, want the holder's", n)
	}
	mustExecPool(t, db.Pool, `DELETE FROM pgfence.migration_lock`)
	if err := applyScript(ctx, db.Pool, down); err != nil {
		t.Fatalf("down script: %v", err)
	}
	if n := lockRows(t, db.Pool); n != 0 {
		t.Fatalf("the script left %d lock rows", n)
	}
}

// ReadLock says who holds the migration lock and whether its lease lapsed,
// without waiting for it.
func TestReadLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	if h, lapsed, err := migrations.ReadLock(ctx, db.Pool); h != nil || lapsed || err != nil {
		t.Fatalf("ReadLock of a free lock: %+v, %v, %v", h, lapsed, err)
	}
	holdLock(t, db.Pool, "deploy", time.Minute)
	h, lapsed, err := migrations.ReadLock(ctx, db.Pool)
	if err != nil || h == nil || lapsed || h.Host != "build-7" || h.PID != 4242 || h.Application != "deploy" || h.LeaseUntil.Before(h.LockedAt) {
		t.Fatalf("ReadLock of a held lock: %+v, %v, %v", h, lapsed, err)
	}
	holdLock(t, db.Pool, "crashed", -time.Minute)
	if h, lapsed, err = migrations.ReadLock(ctx, db.Pool); err != nil || h == nil || !lapsed || h.Application != "crashed" {
		t.Fatalf("ReadLock of a lapsed lock: %+v, %v, %v", h, lapsed, err)
	}
	// Not installed at all: free.
	blank := blankDatabase(t)
	if h, lapsed, err := migrations.ReadLock(ctx, blank.Pool); h != nil || lapsed || err != nil {
		t.Fatalf("ReadLock without a lock table: %+v, %v, %v", h, lapsed, err)
	}
}
