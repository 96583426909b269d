package leases_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestAcquireRenewRelease(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	var events []leases.LogEvent
	c := newClient(t, pool, nil)
	leases.SetOnEvent(c, func(e leases.LogEvent) { events = append(events, e) })
	ctx := ctxTimeout(t, 30*time.Second)

	// Renewed by hand: the events below count the renewals.
	l, err := c.TryAcquire(ctx, "job", 10*time.Second, &leases.AcquireOptions{HolderInfo: "test", NoKeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	if l.Key() != "job" || l.Token() <= 0 || len(l.Holder()) != 36 || l.Err() != nil {
		t.Fatalf("lease %q %q %d err %v", l.Key(), l.Holder(), l.Token(), l.Err())
	}
	st, err := c.Get(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Live || st.Holder != l.Holder() || st.Token != l.Token() || st.HolderInfo != "test" ||
		st.Remaining <= 9*time.Second || st.Remaining > 10*time.Second || !st.ExpiresAt.Equal(l.ExpiresAt()) {
		t.Fatalf("status %+v, lease expires %v", st, l.ExpiresAt())
	}

	before := l.ExpiresAt()
	time.Sleep(5 * time.Millisecond)
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if !l.ExpiresAt().After(before) {
		t.Fatalf("renewal did not move the expiry: %v -> %v", before, l.ExpiresAt())
	}

	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	default:
		t.Fatal("lease context not done after Release")
	}
	if !errors.Is(l.Err(), leases.ErrReleased) {
		t.Fatalf("Err after release = %v", l.Err())
	}
	if err := l.Renew(ctx); !errors.Is(err, leases.ErrReleased) {
		t.Fatalf("renew after release: %v", err)
	}

	l2, err := c.TryAcquire(ctx, "job", time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l.Token() || l2.Holder() == l.Holder() {
		t.Fatalf("second grant: token %d after %d, holder %s after %s", l2.Token(), l.Token(), l2.Holder(), l.Holder())
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}

	hist, err := c.History(ctx, "job", 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range hist {
		got = append(got, e.Kind)
	}
	if strings.Join(got, ",") != "released,acquired,released,acquired" {
		t.Fatalf("history newest first: %v", got)
	}
	if hist[3].Token != l.Token() || hist[3].Holder != l.Holder() || hist[1].Token != l2.Token() {
		t.Fatalf("history %+v", hist)
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 || list[0].Live || list[0].ReleasedAt.IsZero() {
		t.Fatalf("list %+v %v", list, err)
	}
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, string(e.Kind))
	}
	if strings.Join(kinds, ",") != "acquired,renewed,released,acquired,released" {
		t.Fatalf("events %v", kinds)
	}
}

func TestTryAcquireHeld(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, nil)
	ctx := ctxTimeout(t, 30*time.Second)
	// Not kept alive: it expires below, and learns so at its next renewal.
	l, err := c.TryAcquire(ctx, "k", 20*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.TryAcquire(ctx, "k", 20*time.Second, nil)
	var held *leases.HeldError
	if !errors.As(err, &held) || !errors.Is(err, pgfence.ErrLeaseHeld) {
		t.Fatalf("second TryAcquire: %v", err)
	}
	if held.Key != "k" || held.Remaining <= 19*time.Second || held.Remaining > 20*time.Second || !held.ExpiresAt.Equal(l.ExpiresAt()) {
		t.Fatalf("held %+v", held)
	}
	// A failed acquire writes nothing: no event, the row unchanged.
	hist, _ := c.History(ctx, "k", 10)
	if len(hist) != 1 {
		t.Fatalf("history after a failed acquire: %+v", hist)
	}
	// Acquire gives up at its deadline and says why.
	_, err = c.Acquire(ctx, "k", time.Second, &leases.AcquireOptions{MaxWait: time.Second})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, pgfence.ErrLeaseHeld) {
		t.Fatalf("Acquire on a held key: %v", err)
	}
	// Expiry lets the next holder in, with a larger token.
	backdate(t, pool, "k", -time.Millisecond)
	l2, err := c.TryAcquire(ctx, "k", time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("takeover token %d <= %d", l2.Token(), l.Token())
	}
	hist, _ = c.History(ctx, "k", 1)
	if hist[0].Kind != "taken_over" || !strings.Contains(hist[0].Reason, l.Holder()) {
		t.Fatalf("takeover event %+v", hist[0])
	}
	// The old holder learns it lost the lease at its next renewal.
	if err := l.Renew(ctx); !errors.Is(err, pgfence.ErrLeaseLost) || pgerr.Code(err) != pgerr.CodeLeaseNotHeld {
		t.Fatalf("renew by the old holder: %v", err)
	}
	if !errors.Is(l.Err(), pgfence.ErrLeaseLost) {
		t.Fatalf("old lease Err = %v", l.Err())
	}
	_ = l2.Release(ctx)
}

// A stale release never frees the new holder's lease; a double release is
// harmless.
func TestStaleAndDoubleRelease(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, nil)
	ctx := ctxTimeout(t, 30*time.Second)
	old, err := c.TryAcquire(ctx, "k", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	backdate(t, pool, "k", -time.Millisecond)
	cur, err := c.TryAcquire(ctx, "k", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	// The old holder wakes up late and releases.
	if err := old.Release(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("stale release: %v", err)
	}
	st, err := c.Get(ctx, "k")
	if err != nil || !st.Live || st.Holder != cur.Holder() || st.Token != cur.Token() {
		t.Fatalf("after a stale release: %+v %v", st, err)
	}
	if _, err := c.TryAcquire(ctx, "k", time.Second, nil); !errors.Is(err, pgfence.ErrLeaseHeld) {
		t.Fatalf("key free after a stale release: %v", err)
	}
	// The same stale release sent as plain SQL, as another language would.
	var released bool
	var status string
	if err := pool.QueryRow(ctx, `SELECT released, status FROM pgfence.release($1, $2, $3)`, "k", old.Holder(), old.Token()).Scan(&released, &status); err != nil {
		t.Fatal(err)
	}
	if released || status != "not_held" {
		t.Fatalf("stale SQL release: %v %s", released, status)
	}

	// Double release by the current holder.
	if err := cur.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cur.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if err := pool.QueryRow(ctx, `SELECT released, status FROM pgfence.release($1, $2, $3)`, "k", cur.Holder(), cur.Token()).Scan(&released, &status); err != nil {
		t.Fatal(err)
	}
	if released || status != "already_released" {
		t.Fatalf("repeated SQL release: %v %s", released, status)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_events WHERE key = 'k' AND event = 'released'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("released events: %d %v", n, err)
	}
}

// The renew-after-expiry trap: a renewal that starts while the
// lease is live, then waits for a transaction holding FOR SHARE on the lease
// row while the lease expires, must fail. A bare UPDATE ... WHERE expires_at >
// clock_timestamp() would succeed here; the control at the end proves the
// scenario really sets that trap.
func TestRenewAfterExpiryTrap(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, nil)
	ctx := ctxTimeout(t, 30*time.Second)

	trap := func(renew func() error) error {
		t.Helper()
		backdate(t, pool, "k", 300*time.Millisecond)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE key = 'k' FOR SHARE`); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- renew() }()
		// Wait until the renewal is blocked on the row lock, then let the lease expire.
		waitLocked(t, pool)
		var live bool
		for {
			if err := pool.QueryRow(ctx, `SELECT expires_at > clock_timestamp() FROM pgfence.leases WHERE key = 'k'`).Scan(&live); err != nil {
				t.Fatal(err)
			}
			if !live {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return <-done
	}

	// Renewed by hand only: a background renewal would meet the trap too.
	l, err := c.TryAcquire(ctx, "k", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	if err := trap(func() error { return l.Renew(ctx) }); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("renewal of a lease that expired while it waited: %v", err)
	}
	var live bool
	if err := pool.QueryRow(ctx, `SELECT live FROM pgfence.lease_status WHERE key = 'k'`).Scan(&live); err != nil || live {
		t.Fatalf("lease live after the refused renewal: %v %v", live, err)
	}

	// Control: the naive statement falls into the trap.
	l2, err := c.TryAcquire(ctx, "k", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	err = trap(func() error {
		tag, err := pool.Exec(ctx, `UPDATE pgfence.leases SET expires_at = clock_timestamp() + interval '10 s'
WHERE key = 'k' AND holder = $1::uuid AND token = $2 AND released_at IS NULL AND expires_at > clock_timestamp()`, l2.Holder(), l2.Token())
		if err == nil && tag.RowsAffected() != 1 {
			return errors.New("the naive renewal did not fall into the trap")
		}
		return err
	})
	if err != nil {
		t.Fatalf("control: %v", err)
	}
	_ = l2.Release(ctx)
}

// waitLocked waits until some backend of this database waits for a lock.
func waitLocked(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) {
	t.Helper()
	for i := 0; i < 500; i++ {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no backend ever waited for the row lock")
}

func TestInvalidInput(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, 30*time.Second)
	c := newClient(t, pool, nil)
	long := strings.Repeat("x", 513)
	cases := []struct {
		name  string
		field string
		call  func() error
	}{
		{"empty key", "key", func() error { _, err := c.TryAcquire(ctx, "", time.Second, nil); return err }},
		{"oversize key", "key", func() error { _, err := c.Acquire(ctx, long, time.Second, nil); return err }},
		{"zero ttl", "ttl", func() error { _, err := c.TryAcquire(ctx, "k", 0, nil); return err }},
		{"negative ttl", "ttl", func() error { _, err := c.Acquire(ctx, "k", -time.Second, nil); return err }},
		{"ttl above MaxTTLLimit", "ttl", func() error { _, err := c.TryAcquire(ctx, "k", 25*time.Hour, nil); return err }},
		{"negative wait", "AcquireOptions.MaxWait", func() error {
			_, err := c.Acquire(ctx, "k", time.Second, &leases.AcquireOptions{MaxWait: -time.Second})
			return err
		}},
		{"oversize holder info", "AcquireOptions.HolderInfo", func() error {
			_, err := c.TryAcquire(ctx, "k", time.Second, &leases.AcquireOptions{HolderInfo: strings.Repeat("x", 1025)})
			return err
		}},
		{"history limit", "limit", func() error { _, err := c.History(ctx, "k", 0); return err }},
		{"force release reason", "reason", func() error { _, err := c.ForceRelease(ctx, "k", ""); return err }},
		{"Do without fn", "fn", func() error { return c.Do(ctx, "k", time.Second, nil, nil) }},
		{"negative backoff", "Config.BackoffMin", func() error { _, err := leases.New(pool, &leases.Config{BackoffMin: -1}); return err }},
		// Twice the longest pause is a fair waiter's patience: math.MaxInt64
		// overflowed it into a negative interval the database refused.
		{"BackoffMax above limit", "Config.BackoffMax", func() error {
			_, err := leases.New(pool, &leases.Config{BackoffMax: math.MaxInt64})
			return err
		}},
		{"PollInterval above limit", "Config.PollInterval", func() error {
			_, err := leases.New(pool, &leases.Config{PollInterval: leases.MaxTTLLimit + time.Second})
			return err
		}},
		{"nil pool", "pool", func() error { _, err := leases.New(nil, nil); return err }},
		// Shorter than a millisecond would poll, retry or renew back to back.
		{"PollInterval 1µs", "Config.PollInterval", func() error { _, err := leases.New(pool, &leases.Config{PollInterval: time.Microsecond}); return err }},
		{"BackoffMax 1µs", "Config.BackoffM", func() error {
			_, err := leases.New(pool, &leases.Config{BackoffMin: time.Microsecond, BackoffMax: time.Microsecond})
			return err
		}},
		{"ResolveTimeout above limit", "Config.ResolveTimeout", func() error {
			_, err := leases.New(pool, &leases.Config{ResolveTimeout: leases.MaxTTLLimit + time.Second})
			return err
		}},
		{"watch poll 1µs", "WatchOptions.PollInterval", func() error {
			_, err := c.Watch(ctx, "k", &leases.WatchOptions{PollInterval: time.Microsecond})
			return err
		}},
		{"renew interval 1µs", "AcquireOptions.RenewInterval", func() error {
			return c.Do(ctx, "k", time.Second, &leases.AcquireOptions{RenewInterval: time.Microsecond}, func(context.Context, *leases.Lease) error { return nil })
		}},
		// 2 × these overflowed, and a TTL passed the check with a trust window
		// that had run out at the grant.
		{"SafetyMargin 1<<62", "Config.SafetyMargin", func() error {
			_, err := leases.New(pool, &leases.Config{SafetyMargin: 1 << 62})
			return err
		}},
		{"SafetyMargin MaxInt64", "Config.SafetyMargin", func() error {
			_, err := leases.New(pool, &leases.Config{SafetyMargin: math.MaxInt64})
			return err
		}},
		{"SafetyMargin leaves no TTL", "Config.SafetyMargin", func() error {
			_, err := leases.New(pool, &leases.Config{SafetyMargin: 12 * time.Hour})
			return err
		}},
	}
	for _, tc := range cases {
		err := tc.call()
		if !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v, want ErrInvalid naming %s", tc.name, err, tc.field)
		}
	}
	l, err := c.TryAcquire(ctx, "k", 3*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	// Keep-alive options are refused before the grant, by every call that
	// grants, whether the key is held (k) or free (k2).
	for _, o := range []*leases.AcquireOptions{{RenewInterval: -1}, {RenewInterval: time.Microsecond}, {RenewInterval: 3 * time.Second}, {MaxHold: -1}, {MaxFailures: -1}} {
		for _, key := range []string{"k", "k2"} {
			if _, err := c.TryAcquire(ctx, key, 3*time.Second, o); !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), "AcquireOptions.") {
				t.Errorf("TryAcquire(%s, %+v): %v", key, o, err)
			}
			if _, err := c.Acquire(ctx, key, 3*time.Second, o); !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), "AcquireOptions.") {
				t.Errorf("Acquire(%s, %+v): %v", key, o, err)
			}
			if err := c.Check(key, 3*time.Second, o); !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), "AcquireOptions.") {
				t.Errorf("Check(%s, %+v): %v", key, o, err)
			}
		}
	}
	// Nothing was lost: the lease is intact and the rejected calls wrote nothing.
	if l.Err() != nil {
		t.Fatal(l.Err())
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_events`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("events: %d %v", n, err)
	}

	// The SQL functions reject the same input with PF008.
	for _, q := range []string{
		`SELECT * FROM pgfence.try_acquire('', interval '1 s')`,
		`SELECT * FROM pgfence.try_acquire(repeat('x', 513), interval '1 s')`,
		`SELECT * FROM pgfence.try_acquire('k2', interval '0 s')`,
		`SELECT * FROM pgfence.try_acquire('k2', interval '25 hours')`,
		`SELECT * FROM pgfence.try_acquire('k2', NULL)`,
		`SELECT * FROM pgfence.renew('k', NULL, 1, interval '1 s')`,
		`SELECT * FROM pgfence.release('k', gen_random_uuid(), NULL)`,
		`SELECT * FROM pgfence.force_release('k', '')`,
		`SELECT pgfence.prune_lease_events('k', -1)`,
	} {
		_, err := pool.Exec(ctx, q)
		if pgerr.Code(err) != pgerr.CodeInvalid {
			t.Errorf("%s: %v, want PF008", q, err)
		}
	}
	_ = l.Release(ctx)
}

// An attempt that meets a grant in progress (not yet committed) returns "held"
// at once, without waiting for that transaction's row lock or writing.
func TestAcquireDuringGrantInProgress(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, 30*time.Second)
	granting := sqlConn(t, db.URL)
	other := sqlConn(t, db.URL)
	if _, err := other.Exec(ctx, `SET statement_timeout = '5s'`); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"new", "old"} {
		if key == "old" { // a released row exists: the grant is an update
			var holder string
			var token int64
			if err := db.Pool.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.acquire('old', interval '1 minute')`).Scan(&holder, &token); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Pool.Exec(ctx, `SELECT * FROM pgfence.release('old', $1::uuid, $2)`, holder, token); err != nil {
				t.Fatal(err)
			}
		}
		tx, err := granting.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		if err := tx.QueryRow(ctx, `SELECT acquired FROM pgfence.try_acquire($1, interval '1 minute')`, key).Scan(&ok); err != nil || !ok {
			t.Fatalf("%s: grant in the open transaction: %v %v", key, ok, err)
		}
		var remaining time.Duration
		var us int64
		if err := other.QueryRow(ctx, `SELECT acquired, (extract(epoch FROM remaining) * 1000000)::bigint FROM pgfence.try_acquire($1, interval '1 minute')`, key).Scan(&ok, &us); err != nil {
			t.Fatalf("%s: attempt during a grant in progress: %v", key, err)
		}
		remaining = time.Duration(us) * time.Microsecond
		if ok || remaining != 0 {
			t.Fatalf("%s: attempt during a grant in progress: acquired %v remaining %s", key, ok, remaining)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
