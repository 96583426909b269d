package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// try_acquire turns a caller away at once while another transaction is
// granting the same key (the contention filter), and what the filter
// consults is out of every other role's reach: the lease row's lock needs
// UPDATE on pgfence.leases. A lease-checked write's share lock is no grant:
// a takeover waits for it.
func TestContentionFilter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	_, app := loginRole(t, db, "pgfence_app")
	_, outsider := loginRole(t, db, "")

	// What makes a key look busy is out of the outsider's and the
	// application role's reach: every row lock needs UPDATE, on the table
	// and on the view over it.
	mustExecPool(t, app, `SELECT pgfence.release('busy', holder, token) FROM pgfence.try_acquire('busy', interval '1 minute')`)
	for who, pool := range map[string]*pgxpool.Pool{"outsider": outsider, "pgfence_app": app} {
		for _, rel := range []string{"pgfence.leases", "pgfence.lease_status"} {
			for _, mode := range []string{"UPDATE", "NO KEY UPDATE", "SHARE", "KEY SHARE"} {
				q := `SELECT 1 FROM ` + rel + ` WHERE key = 'busy' FOR ` + mode
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				_, err = tx.Exec(ctx, q)
				_ = tx.Rollback(ctx)
				denied(t, who+": "+q, err)
			}
		}
	}

	// A grant in progress: its row lock, as the granting transaction holds
	// it between its update and its commit.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = 'busy' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// Without the filter the call would queue on the row lock until the
	// statement timeout.
	other, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if _, err := other.Exec(ctx, `SET LOCAL statement_timeout = '5s'`); err != nil {
		t.Fatal(err)
	}
	var acquired bool
	if err := other.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire('busy', interval '1 minute')`).Scan(&acquired); err != nil {
		t.Fatalf("try_acquire during another grant: %v, want an immediate 'not acquired'", err)
	}
	if acquired {
		t.Fatal("try_acquire granted a key whose grant another transaction holds locked")
	}
	// pgfence.acquire says so, rather than "held for another 00:00:00".
	_, err = app.Exec(ctx, `SELECT * FROM pgfence.acquire('busy', interval '1 minute')`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "PF003" || !strings.Contains(pe.Message, "is being granted to another holder right now") {
		t.Fatalf("acquire during another grant: %v, want PF003 saying the key is being granted", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// A lease-checked write's share lock on a lease that expired meanwhile:
	// the takeover waits for the write's transaction, then takes the lease.
	mustExecPool(t, app, `SELECT 1 FROM pgfence.try_acquire('shared', interval '1 millisecond')`)
	write, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = write.Rollback(ctx) }()
	if _, err := write.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = 'shared' FOR SHARE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var acquired bool
		err := app.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire('shared', interval '1 minute')`).Scan(&acquired)
		if err == nil && !acquired {
			err = errors.New("the takeover was turned away instead of waiting for the write")
		}
		done <- err
	}()
	waitForLockWaits(t, db.Pool, 1)
	select {
	case err := <-done:
		t.Fatalf("takeover while a lease-checked write holds the row: %v, want it to wait", err)
	default:
	}
	if err := write.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Two takeovers behind one lease-checked write: both wait, one gets the
	// lease when the write ends, the other is told it is held. Neither keeps
	// a share lock of its own while it waits (two that did would each wait
	// for the other: deadlock detected).
	mustExecPool(t, app, `SELECT 1 FROM pgfence.try_acquire('shared2', interval '1 millisecond')`)
	write, err = db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = write.Rollback(ctx) }()
	if _, err := write.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = 'shared2' FOR SHARE`); err != nil {
		t.Fatal(err)
	}
	// The lease expires while the write holds its row.
	if _, err := write.Exec(ctx, `SELECT pg_sleep(0.01)`); err != nil {
		t.Fatal(err)
	}
	type attempt struct {
		acquired bool
		err      error
	}
	attempts := make(chan attempt, 2)
	for range 2 {
		go func() {
			var a attempt
			a.err = app.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire('shared2', interval '1 minute')`).Scan(&a.acquired)
			attempts <- a
		}()
	}
	waitForLockWaits(t, db.Pool, 2)
	if err := write.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wins := 0
	for range 2 {
		a := <-attempts
		if a.err != nil {
			t.Fatalf("a takeover queued behind a lease-checked write: %v", a.err)
		}
		if a.acquired {
			wins++
		}
	}
	if wins != 1 {
		t.Fatalf("%d of 2 takeovers behind a lease-checked write got the lease, want 1", wins)
	}
}

// waitForLockWaits waits until n backends of the database wait for a lock.
func waitForLockWaits(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	for range 2000 {
		var waiting int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("fewer than %d backends waited for a lock", n)
}

// A pgfence_app member granted only its own prefix cannot block another
// service's grants: in one open transaction it holds the advisory locks a
// grant once took for the other service's new keys (advisory locks are one
// namespace for every role), ROW EXCLUSIVE on pgfence.leases by granting a
// key of its own, and has called every pgfence function that locks a lease
// row on the other service's keys (each refused, in a savepoint). Every
// first grant of the other service's 1000 new keys succeeds, also of a key
// whose row retention deleted, and so do its grants of keys it released and
// its lease-checked writes, none of them waiting.
func TestHostileRoleCannotBlockFirstGrants(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	service := func(prefix string) *pgxpool.Pool {
		name, pool := loginRole(t, db, "pgfence_app")
		for _, q := range []string{`SELECT pgfence.revoke_prefix($1::text::regrole, '')`, `SELECT pgfence.grant_prefix($1::text::regrole, $2)`} {
			args := []any{name}
			if strings.Contains(q, "$2") {
				args = append(args, prefix)
			}
			if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
				t.Fatal(err)
			}
		}
		return pool
	}
	orders := service("stock:")
	hostile := service("tb/")

	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("stock:new-%d", i+1)
	}
	// One key had a row that retention deleted: its next grant is a first
	// grant again.
	mustExecPool(t, orders, `SELECT pgfence.release('stock:new-1', holder, token) FROM pgfence.try_acquire('stock:new-1', interval '1 minute')`)
	mustExecPool(t, db.Pool, `DELETE FROM pgfence.leases WHERE key = 'stock:new-1'`)
	// Keys granted and released before, and one live grant, whose holder
	// and token the hostile role is assumed to know.
	old := []string{"stock:old-1", "stock:old-2", "stock:old-3"}
	for _, k := range old {
		if _, err := orders.Exec(ctx, `SELECT pgfence.release($1, holder, token) FROM pgfence.try_acquire($1, interval '1 minute')`, k); err != nil {
			t.Fatal(err)
		}
	}
	var live struct {
		holder string
		token  int64
	}
	if err := orders.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.try_acquire('stock:live', interval '1 minute')`).Scan(&live.holder, &live.token); err != nil {
		t.Fatal(err)
	}

	squat, err := hostile.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = squat.Rollback(ctx) }()
	b := &pgx.Batch{}
	for _, k := range append(append([]string{}, keys...), old...) {
		// The hashes a grant used to lock, and the keys' plain hashes.
		b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended('pgfence.lease:' || $1, 0)), pg_advisory_xact_lock(hashtext($1))`, k)
	}
	if err := squat.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	var acquired bool
	if err := squat.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire('tb/x', interval '1 minute')`).Scan(&acquired); err != nil || !acquired {
		t.Fatalf("the hostile role's own grant: %v %v", acquired, err)
	}
	var rowExclusive bool
	if err := squat.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid()
   AND relation = 'pgfence.leases'::regclass AND mode = 'RowExclusiveLock' AND granted)`).Scan(&rowExclusive); err != nil || !rowExclusive {
		t.Fatalf("the hostile transaction holds no ROW EXCLUSIVE on pgfence.leases: %v %v", rowExclusive, err)
	}
	// Every function that locks a lease row, on the other service's keys:
	// refused before it locks, and a savepoint keeps the transaction open.
	holder, token := `'`+live.holder+`'::uuid`, strconv.FormatInt(live.token, 10)
	for _, q := range []string{
		`SELECT pgfence.check_lease('stock:live', ` + holder + `, ` + token + `)`,
		`SELECT * FROM pgfence.renew('stock:live', ` + holder + `, ` + token + `, interval '1 minute')`,
		`SELECT * FROM pgfence.release('stock:live', ` + holder + `, ` + token + `)`,
		`SELECT pgfence.set_holder_info('stock:live', ` + holder + `, ` + token + `, 'mine')`,
		`SELECT * FROM pgfence.job_slot_begin('stock:live', ` + holder + `, ` + token + `, 'slot')`,
		`SELECT * FROM pgfence.grant_probe('stock:old-1', gen_random_uuid())`,
		`SELECT * FROM pgfence.grant_probe('stock:new-2', gen_random_uuid())`,
		`SELECT * FROM pgfence.try_acquire('stock:old-2', interval '1 minute')`,
		`SELECT * FROM pgfence.try_acquire('stock:new-3', interval '1 minute')`,
		`SELECT pgfence.fence('stock:live', ` + token + `)`,
	} {
		if _, err := squat.Exec(ctx, `SAVEPOINT attempt`); err != nil {
			t.Fatal(err)
		}
		_, err := squat.Exec(ctx, q)
		if code := pgerr.Code(err); code != "PF014" {
			t.Errorf("hostile role: %s: %v, want PF014 (not granted)", q, err)
		}
		if _, err := squat.Exec(ctx, `ROLLBACK TO SAVEPOINT attempt`); err != nil {
			t.Fatal(err)
		}
	}

	conn, err := orders.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// Nothing may wait either: a blocked call fails here instead of hanging.
	if _, err := conn.Exec(ctx, `SET statement_timeout = '10s'`); err != nil {
		t.Fatal(err)
	}
	granted := 0
	for _, k := range append(append([]string{}, keys...), old...) {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire($1, interval '1 minute')`, k).Scan(&ok); err != nil {
			t.Fatalf("grant of %s while another role squats it: %v", k, err)
		}
		if ok {
			granted++
		}
	}
	if want := len(keys) + len(old); granted != want {
		t.Fatalf("%d of %d grants succeeded while another role held their advisory locks and ROW EXCLUSIVE on pgfence.leases", granted, want)
	}
	for _, q := range []string{
		`SELECT pgfence.check_lease('stock:live', ` + holder + `, ` + token + `)`,
		`SELECT * FROM pgfence.renew('stock:live', ` + holder + `, ` + token + `, interval '1 minute')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Errorf("%s while another role squats the key: %v", q, err)
		}
	}
}
