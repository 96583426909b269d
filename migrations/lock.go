package migrations

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/pressly/goose/v3/database"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// LockTable is the table whose one row is the migration lock. The migrator
// creates it (and a script from [Script] does) in [Schema], with privileges
// for its owner only, so that no other role can take, hold or clear the lock.
const LockTable = Schema + ".migration_lock"

const (
	// lockTimeoutDefault is how long [Migrator.Up] and [Migrator.DownTo]
	// wait for the migration lock when [Config.LockTimeout] is zero.
	lockTimeoutDefault = 5 * time.Minute

	// lockLease is how long the migration lock stays taken without a
	// heartbeat. A migrator renews it every lockLease/3 while it runs, so the
	// lock of a migrator that crashed or lost the database is free at most
	// lockLease after its last renewal.
	lockLease = 30 * time.Second
)

// ErrLocked is wrapped by a [*LockedError]: another migration held the
// migration lock for as long as the caller was willing to wait.
var ErrLocked = errors.New("migrations: another migration holds the migration lock")

// ErrLockLost is returned when a migrator lost the migration lock while it
// ran: its lease lapsed (the process was paused, or could not reach the
// database, for longer than 30 seconds) and another migrator took it over,
// or an operator cleared it. The migration in progress rolled back, since
// each migration commits only while its migrator holds the lock; the ones
// before it stay applied. Run Up again.
var ErrLockLost = errors.New("migrations: lost the migration lock while migrating (its lease lapsed and another migrator took it, or it was cleared); the migration in progress rolled back")

// LockHolder is what a migrator records in the lock row when it takes the
// migration lock.
type LockHolder struct {
	Host        string    // the migrator's host name (for a script: the client's address)
	PID         int       // the migrator's process id (for a script: its server backend)
	Application string    // the program, or the connection's application_name
	User        string    // the database role it connected as
	LockedAt    time.Time // when it took the lock, by the database clock
	LeaseUntil  time.Time // when the lock expires unless renewed, by the database clock
}

// LockedError is returned by [Migrator.Up] and [Migrator.DownTo] when the
// migration lock stayed taken for [Config.LockTimeout] or until the caller's
// context ended. It names the holder. errors.Is(err, [ErrLocked]) is true,
// and so is errors.Is(err, context.DeadlineExceeded) (or Canceled) when the
// caller's context ended the wait.
type LockedError struct {
	Holder LockHolder    // the holder seen last
	Waited time.Duration // how long this migrator waited
	Err    error         // the caller's context error, nil when LockTimeout ended the wait
}

func (e *LockedError) Error() string {
	h := e.Holder
	if h.LeaseUntil.IsZero() {
		return fmt.Sprintf("migrations: another migration holds the migration lock in a transaction that has not committed (such as a script from `pgfence migrate sql` being applied); gave up after %s. Let it finish and migrate again",
			e.Waited.Round(time.Millisecond))
	}
	return fmt.Sprintf("migrations: another migration holds the migration lock: host %s, pid %d, application %q, role %s, since %s, lease until %s; gave up after %s. "+
		"Let it finish and migrate again. If that process is gone, its lease lapses at %s and the next migration takes the lock over; "+
		"to clear it at once, make sure it no longer runs, then, as the schema's owner: DELETE FROM %s",
		h.Host, h.PID, h.Application, h.User, h.LockedAt.UTC().Format(time.RFC3339), h.LeaseUntil.UTC().Format(time.RFC3339Nano),
		e.Waited.Round(time.Millisecond), h.LeaseUntil.UTC().Format(time.RFC3339Nano), LockTable)
}

// Unwrap returns [ErrLocked] and, when the caller's context ended the wait,
// its error.
func (e *LockedError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrLocked, e.Err}
	}
	return []error{ErrLocked}
}

// lockTableDDL creates the lock table, for its owner only. The migrator runs
// it with search_path pinned to pg_catalog, pg_temp, and a script after
// pinning it.
const lockTableDDL = `CREATE TABLE IF NOT EXISTS ` + LockTable + ` (
    singleton   boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    holder      uuid        NOT NULL,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    application text        NOT NULL,
    db_user     text        NOT NULL,
    locked_at   timestamptz NOT NULL,
    lease_until timestamptz NOT NULL
);
REVOKE ALL ON TABLE ` + LockTable + ` FROM PUBLIC;
COMMENT ON TABLE ` + LockTable + ` IS 'The pgfence migration lock: one row while a migration runs. Clear a stuck one only once the process it names no longer runs.';
`

// Every statement below is a single statement in its own transaction, so
// that it works through a transaction-mode pooler, and names every built-in
// by schema. The database clock decides expiry.
const (
	// lockReadSQL reads the lock row: a migrator only tries to take the lock
	// when it is free or expired, so that a waiting migrator never locks
	// the row (which would wait behind the holder's commit).
	lockReadSQL = `SELECT l.holder::pg_catalog.text, l.host, l.pid, l.application, l.db_user, l.locked_at, l.lease_until,
       pg_catalog.clock_timestamp()
  FROM ` + LockTable + ` l`

	// lockTakeSQL takes the lock when there is no row or its lease lapsed.
	// ON CONFLICT's WHERE runs once the row is locked, so of two migrators
	// that find it expired only one takes it.
	lockTakeSQL = `INSERT INTO ` + LockTable + ` AS l (holder, host, pid, application, db_user, locked_at, lease_until)
VALUES ($1::pg_catalog.uuid, $2, $3, $4, SESSION_USER, pg_catalog.clock_timestamp(),
        pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => $5))
ON CONFLICT (singleton) DO UPDATE
   SET holder = excluded.holder, host = excluded.host, pid = excluded.pid, application = excluded.application,
       db_user = excluded.db_user, locked_at = excluded.locked_at, lease_until = excluded.lease_until
 WHERE l.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()
RETURNING l.holder::pg_catalog.text`

	// lockRenewSQL is the heartbeat. It renews the lock of this holder only:
	// when a takeover changed the row first, it finds nothing.
	lockRenewSQL = `UPDATE ` + LockTable + ` l
   SET lease_until = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => $2)
 WHERE l.holder OPERATOR(pg_catalog.=) $1::pg_catalog.uuid`

	// lockReleaseSQL frees the lock of this holder only.
	lockReleaseSQL = `DELETE FROM ` + LockTable + ` l WHERE l.holder OPERATOR(pg_catalog.=) $1::pg_catalog.uuid`

	// lockFenceSQL runs in the transaction of each migration, just before
	// goose records it: the row lock it takes makes a takeover wait until
	// the migration committed, so a migration commits only while its
	// migrator holds the lock.
	lockFenceSQL = `SELECT l.holder::pg_catalog.text FROM ` + LockTable + ` l FOR UPDATE`
)

// holderKey carries the holder id of the lock a run holds, from the run to
// the version store's fence.
type holderKey struct{}

func newHolderID() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// heldLock is the migration lock while a run holds it.
type heldLock struct {
	m      *Migrator
	holder string
	end    context.CancelCauseFunc // ends the run's context
	stop   context.CancelFunc      // stops the heartbeat
	done   chan struct{}           // closed when the heartbeat stopped
}

// lock takes the migration lock, waiting at most m.lockTimeout and while ctx
// lasts, and starts its heartbeat. The returned context carries the holder
// id for the fence and ends, with cause [ErrLockLost], when the heartbeat
// finds the lock taken over.
func (m *Migrator) lock(ctx context.Context) (_ *heldLock, _ context.Context, err error) {
	holder := newHolderID()
	defer func() {
		if err != nil {
			// An insert whose reply was lost may have taken the lock: free
			// it rather than leave it to lapse.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_, _ = m.db.ExecContext(rctx, lockReleaseSQL, holder)
		}
	}()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, m.lockTimeout)
	defer cancel()
	var last *LockHolder
	logged := false
	backoff := 50 * time.Millisecond
	for {
		h, wait, waitingOnRow, err := m.tryLock(wctx, holder)
		if err != nil {
			switch {
			case wctx.Err() != nil && last != nil:
				return nil, nil, m.lockedError(ctx, *last, start)
			case wctx.Err() != nil && waitingOnRow:
				// The insert waited for an uncommitted lock row: a script.
				return nil, nil, m.lockedError(ctx, LockHolder{}, start)
			}
			return nil, nil, fmt.Errorf("taking the migration lock: %w", err)
		}
		if h == nil {
			break
		}
		last = h
		if !logged {
			m.logger.InfoContext(ctx, "waiting for the migration lock",
				slog.String("host", h.Host), slog.Int("pid", h.PID), slog.String("application", h.Application),
				slog.Time("lease_until", h.LeaseUntil))
			logged = true
		}
		// Poll: back off up to 1 s, never sleep past the holder's lease, and
		// add jitter so that waiting migrators spread out.
		sleep := min(backoff, max(wait, 10*time.Millisecond))
		sleep = sleep/2 + time.Duration(rand.Int64N(int64(sleep/2)+1))
		backoff = min(2*backoff, time.Second)
		t := time.NewTimer(sleep)
		select {
		case <-wctx.Done():
			t.Stop()
			return nil, nil, m.lockedError(ctx, *last, start)
		case <-t.C:
		}
	}
	m.logger.DebugContext(ctx, "took the migration lock", slog.String("holder", holder))

	runCtx, end := context.WithCancelCause(context.WithValue(ctx, holderKey{}, holder))
	hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	l := &heldLock{m: m, holder: holder, end: end, stop: stop, done: make(chan struct{})}
	go l.heartbeat(hctx)
	return l, runCtx, nil
}

func (m *Migrator) lockedError(ctx context.Context, h LockHolder, start time.Time) error {
	return &LockedError{Holder: h, Waited: time.Since(start), Err: ctx.Err()}
}

// tryLock takes the lock for holder, or returns who holds it and how long
// its lease has left. inserting reports that an error came from the insert,
// which waits while another transaction holds an uncommitted lock row.
func (m *Migrator) tryLock(ctx context.Context, holder string) (h *LockHolder, wait time.Duration, inserting bool, err error) {
	for {
		h, now, err := scanLock(m.db.QueryRowContext(ctx, lockReadSQL).Scan)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, 0, false, err
		case h.LeaseUntil.After(now):
			return &h, h.LeaseUntil.Sub(now), false, nil
		}
		var got string
		err = m.db.QueryRowContext(ctx, lockTakeSQL, holder, m.host, m.pid, m.application, lockLease.Seconds()).Scan(&got)
		switch {
		case err == nil && got == holder:
			return nil, 0, false, nil
		case err == nil:
			return nil, 0, true, fmt.Errorf("lock row names holder %s, want %s", got, holder)
		case errors.Is(err, sql.ErrNoRows):
			// Another migrator took it between the read and the insert:
			// read who.
		default:
			return nil, 0, true, err
		}
	}
}

// heartbeat renews the lease every lockLease/3 until stopped. When the lock
// is no longer this holder's, it ends the run with [ErrLockLost]; the fence
// rolls back a migration that would commit anyway.
func (l *heldLock) heartbeat(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(lockLease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, lockLease/3)
		renewed, err := rowsAffected(l.m.db.ExecContext(rctx, lockRenewSQL, l.holder, lockLease.Seconds()))
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			l.m.logger.WarnContext(ctx, "could not renew the migration lock; it lapses unless a later renewal succeeds",
				slog.Duration("lease", lockLease), slog.Any("error", err))
		case renewed == 0:
			l.m.logger.ErrorContext(ctx, "lost the migration lock; stopping the migration")
			l.end(ErrLockLost)
			return
		}
	}
}

// release stops the heartbeat and frees the lock. A release that fails is
// logged, not returned: the migrations committed, and the lock lapses after
// lockLease.
func (l *heldLock) release(ctx context.Context) {
	l.stop()
	<-l.done
	defer l.end(nil)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := l.m.db.ExecContext(rctx, lockReleaseSQL, l.holder); err != nil {
		l.m.logger.WarnContext(ctx, "could not release the migration lock; it lapses by itself",
			slog.Duration("lease", lockLease), slog.Any("error", err))
		return
	}
	l.m.logger.DebugContext(ctx, "released the migration lock", slog.String("holder", l.holder))
}

// fencedStore is goose's version store whose writes first check, in the
// migration's own transaction, that the run still holds the migration lock.
type fencedStore struct {
	database.Store
}

func (s fencedStore) Insert(ctx context.Context, db database.DBTxConn, req database.InsertRequest) error {
	if err := fence(ctx, db); err != nil {
		return err
	}
	return s.Store.Insert(ctx, db, req)
}

func (s fencedStore) Delete(ctx context.Context, db database.DBTxConn, version int64) error {
	if err := fence(ctx, db); err != nil {
		return err
	}
	return s.Store.Delete(ctx, db, version)
}

func fence(ctx context.Context, db database.DBTxConn) error {
	want, _ := ctx.Value(holderKey{}).(string)
	if want == "" {
		return errors.New("migrations: a migration ran without the migration lock")
	}
	var got string
	err := db.QueryRowContext(ctx, lockFenceSQL).Scan(&got)
	switch {
	case errors.Is(err, sql.ErrNoRows) || (err == nil && got != want):
		return ErrLockLost
	case err != nil:
		return fmt.Errorf("checking the migration lock: %w", err)
	}
	return nil
}

// rowsAffected is the row count of an Exec's result, or its error.
func rowsAffected(r sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// lockIdentity is what a migrator records as its holder.
// application is the connection's application_name, when known.
func lockIdentity(application string) (host string, pid int, _ string) {
	host, _ = os.Hostname()
	if host == "" {
		host = "unknown"
	}
	if application == "" {
		application = filepath.Base(os.Args[0])
	}
	return host, os.Getpid(), application
}

// ReadLock reads the migration lock: who holds it, nil when it is free (or
// when [LockTable] does not exist yet), and whether the holder's lease has
// lapsed by the database clock, so that the next migration takes it over.
// It takes no lock and never waits; a lock row that a transaction has not
// committed yet (a script from [Script] being applied) is invisible to it.
// Only the schema's owner may read [LockTable]: other roles get a
// permission error.
func ReadLock(ctx context.Context, q Querier) (holder *LockHolder, lapsed bool, err error) {
	rows, err := q.Query(ctx, lockReadSQL)
	if err == nil {
		defer rows.Close()
		if rows.Next() {
			h, now, err := scanLock(rows.Scan)
			if err == nil {
				return &h, !h.LeaseUntil.After(now), nil
			}
			return nil, false, err
		}
		err = rows.Err()
	}
	if pgerr.Code(err) == "42P01" { // undefined_table: nothing migrated yet
		return nil, false, nil
	}
	return nil, false, err
}

// scanLock scans a row of lockReadSQL: the holder and the database's clock.
func scanLock(scan func(dest ...any) error) (h LockHolder, now time.Time, err error) {
	var id string
	err = scan(&id, &h.Host, &h.PID, &h.Application, &h.User, &h.LockedAt, &h.LeaseUntil, &now)
	return h, now, err
}
