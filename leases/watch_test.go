package leases_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// next returns the watcher's next event, failing after d.
func next(t *testing.T, w *leases.Watcher, d time.Duration) leases.Event {
	t.Helper()
	select {
	case e, ok := <-w.Events():
		if !ok {
			t.Fatal("watch ended")
		}
		return e
	case <-time.After(d):
		t.Fatalf("no watch event within %s (state %+v)", d, w.State())
	}
	return leases.Event{}
}

// stopWatch ends a watch and waits until its channel is closed.
func stopWatch(cancel context.CancelFunc, w *leases.Watcher) {
	cancel()
	for range w.Events() {
	}
}

// A watcher sees every transition of its key in order, with who, token,
// holder info and database times: grant, holder info change, release,
// expiry (observed), takeover, force-release. With wake-ups and a poll of an
// hour, only announcements and expiries make it read.
func TestWatchSeesEveryTransition(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	watching := newClient(t, db.Pool, &leases.Config{PollInterval: time.Hour})
	holders := newClient(t, db.Pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, time.Minute)

	wctx, cancel := context.WithCancel(ctx)
	w, err := watching.Watch(wctx, "leader", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stopWatch(cancel, w)
	waitListening(t, watching, db.Pool)

	announce := &leases.AcquireOptions{Announce: true, HolderInfo: "host-a"}
	a, err := holders.TryAcquire(ctx, "leader", time.Minute, announce)
	if err != nil {
		t.Fatal(err)
	}
	e := next(t, w, 5*time.Second)
	if e.Kind != "acquired" || e.Holder != a.Holder() || e.Token != a.Token() || e.HolderInfo != "host-a" || e.At.IsZero() {
		t.Fatalf("first event %+v, want a's grant (token %d, holder info host-a, a database time)", e, a.Token())
	}
	if _, err := a.SetHolderInfo(ctx, "host-a:8080"); err != nil {
		t.Fatal(err)
	}
	if e := next(t, w, 5*time.Second); e.Kind != "info_changed" || e.HolderInfo != "host-a:8080" || e.Token != a.Token() {
		t.Fatalf("after SetHolderInfo: %+v", e)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e := next(t, w, 5*time.Second); e.Kind != "released" || e.Token != a.Token() || !e.Ended() {
		t.Fatalf("after Release: %+v", e)
	}

	// b's lease runs out (backdated; not kept alive): the watcher reads at
	// the expiry it knows, finds it expired, and says so.
	b, err := holders.TryAcquire(ctx, "leader", time.Minute, &leases.AcquireOptions{Announce: true, HolderInfo: "host-b", NoKeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	if e := next(t, w, 5*time.Second); e.Kind != "acquired" || e.Token != b.Token() || e.HolderInfo != "host-b" {
		t.Fatalf("b's grant: %+v", e)
	}
	backdate(t, db.Pool, "leader", 0)
	// The watcher still expects b's lease to run a minute: a wake-up makes it
	// read now (as a takeover or a release would).
	if _, err := db.Pool.Exec(ctx, `SELECT pg_notify($1, 'leader')`, leases.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	e = next(t, w, 5*time.Second)
	if e.Kind != "expired" || e.Token != b.Token() || e.ID != 0 || e.HolderInfo != "host-b" {
		t.Fatalf("after b's expiry: %+v", e)
	}
	c, err := holders.TryAcquire(ctx, "leader", time.Minute, announce)
	if err != nil {
		t.Fatal(err)
	}
	if e := next(t, w, 5*time.Second); e.Kind != "taken_over" || e.Token != c.Token() || e.Reason == "" {
		t.Fatalf("c's takeover: %+v", e)
	}
	if _, err := holders.ForceRelease(ctx, "leader", "drill"); err != nil {
		t.Fatal(err)
	}
	if e := next(t, w, 5*time.Second); e.Kind != "force_released" || e.Reason != "drill" {
		t.Fatalf("after ForceRelease: %+v", e)
	}
	if st := w.State(); st.Err != nil || st.Lease.Live || st.Lease.Token != c.Token() {
		t.Fatalf("state %+v", st)
	}
}

// warmUp opens the pool's connections: a new connection can take longer
// than a short test lease's trust window on a loaded machine.
func warmUp(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var conns []*pgxpool.Conn
	for range pool.Config().MaxConns {
		conn, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		conn.Release()
	}
}

// waitListening waits until c's LISTEN connection is up.
func waitListening(t *testing.T, c *leases.Client, pool *pgxpool.Pool) {
	t.Helper()
	for i := 0; ; i++ {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database() AND query LIKE 'LISTEN%'`,
			leases.ListenerApplicationName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if i > 500 {
			t.Fatal("the LISTEN connection did not come up")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A holder that announces its renewals keeps its watchers from reading: they
// do not read again, however many times the lease is renewed past the
// expiry they first read, and a held key is not polled (the poll here is
// 50 ms). Without announcements they read again at every expiry they knew.
func TestWatchFollowsAnnouncedRenewals(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	watching := newClient(t, db.Pool, &leases.Config{PollInterval: 50 * time.Millisecond})
	holders := newClient(t, db.Pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, time.Minute)
	warmUp(t, db.Pool)
	const ttl = time.Second

	for _, announce := range []bool{true, false} {
		key := "announced"
		if !announce {
			key = "silent"
		}
		l, err := holders.TryAcquire(ctx, key, ttl, &leases.AcquireOptions{RenewInterval: ttl / 6, Announce: announce})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		w, err := watching.Watch(wctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		waitListening(t, watching, db.Pool)
		if e := next(t, w, 5*time.Second); e.Kind != "acquired" {
			t.Fatalf("%s: first event %+v", key, e)
		}
		// Reads the listener's (re)connection asked for are done by now.
		time.Sleep(100 * time.Millisecond)
		before := leases.WatchReads(w)
		time.Sleep(3 * ttl)
		reads := leases.WatchReads(w) - before
		if err := l.Err(); err != nil {
			t.Fatalf("%s: lease not kept alive over 3 TTLs: %v", key, err)
		}
		stopWatch(cancel, w)
		_ = l.Release(ctx)
		t.Logf("%s renewals: %d reads over 3 TTLs", key, reads)
		switch {
		case announce && reads != 0:
			t.Errorf("announced renewals: %d reads, want none", reads)
		case !announce && reads < 2:
			t.Errorf("silent renewals: %d reads; the control case should read at each expiry it knew", reads)
		}
	}
}

// Any role may NOTIFY any channel, so a renewal announcement cannot make a
// watcher miss a dead holder's expiry unless the database signed it. The
// holder renews twice, announcing (the first announcement is kept to be
// replayed), then dies. A forger then keeps sending, on the watchers'
// channel: the unsigned form, a genuine tag with a later expiry, a tag made
// with a guessed key, and the first genuine announcement again. The watcher
// (which does not poll a held key) still reads the key at the last genuine
// expiry and reports the grant expired.
func TestWatchIgnoresForgedRenewals(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	watching := newClient(t, db.Pool, &leases.Config{PollInterval: time.Hour})
	ctx := ctxTimeout(t, time.Minute)
	warmUp(t, db.Pool)
	spy, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close(context.Background())
	if _, err := spy.Exec(ctx, `LISTEN `+leases.ChangeNotifyChannel); err != nil {
		t.Fatal(err)
	}
	const key, ttl = "forged", 1500 * time.Millisecond
	var holder string
	var token int64
	if err := db.Pool.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.try_acquire($1, $2::bigint * interval '1 microsecond')`,
		key, ttl.Microseconds()).Scan(&holder, &token); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := watching.Watch(wctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stopWatch(cancel, w)
	waitListening(t, watching, db.Pool)
	if e := next(t, w, 5*time.Second); e.Kind != "acquired" {
		t.Fatalf("first event %+v", e)
	}
	var genuine []string
	var lastExpiry time.Time
	for range 2 {
		time.Sleep(ttl / 3)
		if err := db.Pool.QueryRow(ctx, `SELECT r.expires_at FROM pgfence.renew($1, $2::uuid, $3, $4::bigint * interval '1 microsecond') AS r
			CROSS JOIN LATERAL pgfence.announce_renewal($1, $2::uuid, r.token)`, key, holder, token, ttl.Microseconds()).Scan(&lastExpiry); err != nil {
			t.Fatal(err)
		}
		nctx, ncancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := spy.WaitForNotification(nctx)
		ncancel()
		if err != nil {
			t.Fatal(err)
		}
		genuine = append(genuine, n.Payload)
	}
	// The holder is dead now. The forgeries: none may move the expiry.
	f := strings.SplitN(genuine[1], ":", 6) // renewed, remaining, token, expiry, tag, key
	later := strconv.FormatInt(lastExpiry.Add(time.Hour).UnixMicro(), 10)
	forgeries := []string{
		"renewed:3600000000:" + key,
		strings.Join([]string{"renewed", "3600000000", f[2], later, f[4], key}, ":"),
		strings.Join([]string{"renewed", "3600000000", f[2], later, strings.Repeat("ab", 32), key}, ":"),
		genuine[0],
	}
	forging := make(chan struct{})
	forgerDone := make(chan error, 1)
	go func() {
		for {
			for _, payload := range forgeries {
				if _, err := db.Pool.Exec(ctx, `SELECT pg_notify($1, $2)`, leases.ChangeNotifyChannel, payload); err != nil {
					forgerDone <- err
					return
				}
			}
			select {
			case <-forging:
				forgerDone <- nil
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	e := next(t, w, time.Until(lastExpiry)+10*time.Second)
	close(forging)
	if err := <-forgerDone; err != nil {
		t.Fatal(err)
	}
	if e.Kind != "expired" || e.Token != token {
		t.Fatalf("after the forgeries: %+v, want the grant's expiry", e)
	}
	if late := time.Since(lastExpiry); late > 5*time.Second {
		t.Errorf("expiry seen %s after the last genuine expiry", late)
	}
}

// Without wake-ups a watcher polls, and still sees every grant and release.
func TestWatchPollsWithoutWakeups(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	// Without wake-ups the poll defaults to BackoffMax.
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	ctx := ctxTimeout(t, time.Minute)
	wctx, cancel := context.WithCancel(ctx)
	w, err := c.Watch(wctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stopWatch(cancel, w)
	for w.State().ReadAt.IsZero() { // the grants below come after the first read
		time.Sleep(time.Millisecond)
	}
	var tokens []int64
	for range 3 {
		l, err := c.TryAcquire(ctx, "k", time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, l.Token())
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, token := range tokens {
		if e := next(t, w, 5*time.Second); e.Kind != "acquired" || e.Token != token {
			t.Fatalf("got %+v, want the grant of token %d", e, token)
		}
		if e := next(t, w, 5*time.Second); e.Kind != "released" || e.Token != token {
			t.Fatalf("got %+v, want the release of token %d", e, token)
		}
	}
}

// History replays the newest events; by default the watch starts at the
// last grant.
func TestWatchReplay(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, time.Minute)
	var ids []int64
	for range 3 {
		l, err := c.TryAcquire(ctx, "k", time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := c.History(ctx, "k", 10)
	if err != nil || len(hist) != 6 {
		t.Fatalf("history %+v %v", hist, err)
	}
	for i := len(hist) - 1; i >= 0; i-- {
		ids = append(ids, hist[i].ID)
	}

	watch := func(opts *leases.WatchOptions, n int) []leases.Event {
		t.Helper()
		wctx, cancel := context.WithCancel(ctx)
		w, err := c.Watch(wctx, "k", opts)
		if err != nil {
			t.Fatal(err)
		}
		defer stopWatch(cancel, w)
		var got []leases.Event
		for range n {
			got = append(got, next(t, w, 5*time.Second))
		}
		return got
	}
	if got := watch(&leases.WatchOptions{History: 3}, 3); got[0].ID != ids[3] || got[2].ID != ids[5] {
		t.Errorf("History 3: %+v, want ids %v", got, ids[3:])
	}
	// The default starts at the last grant.
	if got := watch(nil, 2); got[0].ID != ids[4] || got[0].Kind != "acquired" || got[1].ID != ids[5] {
		t.Errorf("from the last grant: %+v, want ids %v", got, ids[4:])
	}
}

// When the database prunes the events a watcher has not read yet (past the
// last one it delivered), the watch reports the gap once, then goes on with
// the key's events: it does not report the gap again at every read.
func TestWatchReportsAGapOnce(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	// Without wake-ups a watcher reads every BackoffMax.
	c := newClient(t, pool, &leases.Config{DisableWakeups: true, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	ctx := ctxTimeout(t, time.Minute)
	if _, err := c.Watch(ctx, "gap", &leases.WatchOptions{History: -1}); !errors.Is(err, pgfence.ErrInvalid) {
		t.Fatalf("negative History: %v, want ErrInvalid", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := c.Watch(wctx, "gap", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stopWatch(cancel, w)
	l, err := c.TryAcquire(ctx, "gap", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"acquired", "released"} {
		if e := next(t, w, 5*time.Second); e.Kind != kind {
			t.Fatalf("got %+v, want %s", e, kind)
		}
	}
	if _, err := pool.Exec(ctx, `SELECT pgfence.prune_lease_events('gap', 0)`); err != nil {
		t.Fatal(err)
	}
	if e := next(t, w, 5*time.Second); e.Kind != "gap" {
		t.Fatalf("after the history was pruned: %+v, want a gap", e)
	}
	// Events is unbuffered: a second gap would stop the reads until taken.
	reads := leases.WatchReads(w)
	deadline := time.Now().Add(10 * time.Second)
	for leases.WatchReads(w) < reads+5 {
		if time.Now().After(deadline) {
			t.Fatalf("the watcher stopped reading after %d reads: it is sending again", leases.WatchReads(w)-reads)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case e := <-w.Events():
		t.Fatalf("after the gap and no new event: %+v", e)
	default:
	}
	l, err = c.TryAcquire(ctx, "gap", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e := next(t, w, 5*time.Second); e.Kind != "acquired" || e.Token != l.Token() {
		t.Fatalf("after the gap: %+v, want the grant of token %d", e, l.Token())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e := next(t, w, 5*time.Second); e.Kind != "released" {
		t.Fatalf("after the grant: %+v, want its release", e)
	}
}

// SetHolderInfo changes the live grant's holder info and records one
// info_changed event per grant; a lost grant is refused and ends the lease.
func TestSetHolderInfo(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	ctx := ctxTimeout(t, time.Minute)
	// Not kept alive: it expires below.
	l, err := c.TryAcquire(ctx, "k", time.Minute, &leases.AcquireOptions{HolderInfo: "v1", NoKeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"v2", "v3"} {
		if _, err := l.SetHolderInfo(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := c.Get(ctx, "k"); err != nil || st.HolderInfo != "v3" {
		t.Fatalf("row %+v %v, want holder info v3", st, err)
	}
	var n int
	var info string
	if err := pool.QueryRow(ctx, `SELECT count(*), max(holder_info) FROM pgfence.lease_events WHERE key = 'k' AND event = 'info_changed'`).Scan(&n, &info); err != nil || n != 1 || info != "v3" {
		t.Fatalf("info_changed events: %d (%q) %v, want one, the latest", n, info, err)
	}
	if err := pool.QueryRow(ctx, `SELECT holder_info FROM pgfence.lease_events WHERE key = 'k' AND event = 'acquired'`).Scan(&info); err != nil || info != "v1" {
		t.Fatalf("grant event holder info %q %v, want v1", info, err)
	}
	if _, err := l.SetHolderInfo(ctx, string(make([]byte, leases.MaxHolderInfoBytes+1))); !errors.Is(err, pgfence.ErrInvalid) {
		t.Fatalf("oversize info: %v", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pgfence.set_holder_info('k', $1, $2, repeat('x', 1025))`, l.Holder(), l.Token()); pgerr.Code(err) != pgerr.CodeInvalid {
		t.Fatalf("oversize info from SQL: %v, want PF008", err)
	}
	backdate(t, pool, "k", 0)
	if _, err := l.SetHolderInfo(context.Background(), "v4"); !errors.Is(err, pgfence.ErrLeaseLost) || !errors.Is(l.Err(), pgfence.ErrLeaseLost) {
		t.Fatalf("SetHolderInfo on an expired grant: %v (lease %v), want ErrLeaseLost", err, l.Err())
	}
}

// A storm of announced renewals of a watched key while its watchers wait:
// every one moves their timers (the listener takes the client's lock, then
// each watcher's; a waiting watcher takes its own, then reads the client's
// state), and none of them blocks the other forever. A release after the
// storm still reaches every watcher.
func TestWatchUnderNotificationStorm(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	c := newClient(t, db.Pool, nil)
	ctx := ctxTimeout(t, time.Minute)
	// Renewed by the storm below only.
	l, err := c.TryAcquire(ctx, "k", time.Minute, manual())
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ws []*leases.Watcher
	for range 8 {
		w, err := c.Watch(wctx, "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer stopWatch(cancel, w)
		ws = append(ws, w)
	}
	waitListening(t, c, db.Pool)
	for _, w := range ws {
		if e := next(t, w, 5*time.Second); e.Kind != "acquired" {
			t.Fatalf("first event %+v", e)
		}
	}
	heard := make([]time.Time, len(ws))
	for i, w := range ws {
		heard[i] = w.State().HeardAt
	}
	// Renewals, each signed and announced as the keep-alive sends them with AcquireOptions.Announce
	// (every payload differs: each carries a later expiry, so none is folded
	// away, and each moves the watchers' timers).
	for range 5 {
		if _, err := db.Pool.Exec(ctx, `SELECT pgfence.renew('k', $1, $2, interval '1 minute'), pgfence.announce_renewal('k', $1, $2)
			FROM generate_series(1, 2000)`, l.Holder(), l.Token()); err != nil {
			t.Fatal(err)
		}
	}
	// The storm reached every watcher: each believed an announcement.
	deadline := time.Now().Add(20 * time.Second)
	for i, w := range ws {
		for !w.State().HeardAt.After(heard[i]) {
			if time.Now().After(deadline) {
				t.Fatalf("watcher %d heard none of the announced renewals", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if e := next(t, w, 20*time.Second); e.Kind != "released" {
			t.Fatalf("after the storm: %+v", e)
		}
	}
}
