package leases_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A holder whose keep-alive cannot reach the database (a silent partition: no
// reply, no reset) sees its lease's context end while the database still
// considers the lease live, so nobody else can have it yet.
func TestKeepAliveCutOffEndsContextBeforeExpiry(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	p := newProxy(t, db.URL)
	renewed := make(chan struct{}, 10)
	cut := newClient(t, proxiedPool(t, db.URL, p), &leases.Config{
		DisableWakeups: true,
		SafetyMargin:   time.Second, // room for a loaded machine to run the checks below
	})
	leases.SetOnEvent(cut, func(e leases.LogEvent) {
		if e.Kind == leases.LogRenewed {
			select {
			case renewed <- struct{}{}:
			default:
			}
		}
	})
	other := newClient(t, db.Pool, nil)
	ctx := ctxTimeout(t, 30*time.Second)

	const ttl = 3 * time.Second
	l, err := cut.TryAcquire(ctx, "k", ttl, nil) // kept alive
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-renewed:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal")
	}

	p.SetBlackhole(faultproxy.ClientToServer, true)
	p.SetBlackhole(faultproxy.ServerToClient, true)
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease context still open 5s after the partition")
	}
	doneAt := time.Now()
	var live bool
	var remaining time.Duration
	var remainingMicros int64
	if err := db.Pool.QueryRow(ctx, `SELECT live, (extract(epoch FROM remaining) * 1000000)::bigint FROM pgfence.lease_status WHERE key = 'k'`).Scan(&live, &remainingMicros); err != nil {
		t.Fatal(err)
	}
	remaining = time.Duration(remainingMicros) * time.Microsecond
	if !live {
		t.Fatal("the lease's context ended only after the database let it expire")
	}
	if _, err := other.TryAcquire(ctx, "k", ttl, nil); !errors.Is(err, pgfence.ErrLeaseHeld) {
		t.Fatalf("another holder got in while the cut-off holder's context was open: %v", err)
	}
	if !errors.Is(l.Err(), pgfence.ErrLeaseLost) {
		t.Fatalf("Err = %v", l.Err())
	}
	if err := context.Cause(l.Context()); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("the lease's context ended with %v, want ErrLeaseLost", err)
	}
	t.Logf("context ended %s before the database expiry (checked %s later): %v", remaining, time.Since(doneAt), l.Err())

	// And once it expires, the other client takes over.
	l2, err := other.Acquire(ctx, "k", ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("takeover token %d <= %d", l2.Token(), l.Token())
	}
	_ = l2.Release(ctx)
	p.Heal()
	p.CutAll()
}

// A worker process killed with SIGKILL: its lease is taken over after its
// TTL, not before.
func TestKilledWorkerTakenOverAfterTTL(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	ctx := ctxTimeout(t, time.Minute)
	c := newClient(t, db.Pool, nil)

	w := startWorker(t, "hold", envURL+"="+db.URL, envKey+"=job", envTTL+"=30s")
	var (
		token  int64
		holder string
	)
	if _, err := fmt.Sscanf(w.next(t, 30*time.Second), "held %d %s", &token, &holder); err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = w.cmd.Wait()

	// Dead, but its lease runs until its TTL is over.
	_, err := c.TryAcquire(ctx, "job", time.Second, nil)
	var held *leases.HeldError
	if !errors.As(err, &held) || held.Remaining < 25*time.Second {
		t.Fatalf("right after the kill: %v", err)
	}
	// Let most of the TTL pass (by backdating), leaving 300ms.
	backdate(t, db.Pool, "job", 300*time.Millisecond)
	var expiresAt time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT expires_at FROM pgfence.leases WHERE key = 'job'`).Scan(&expiresAt); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(ctx, "job", time.Second, nil); !errors.Is(err, pgfence.ErrLeaseHeld) {
		t.Fatalf("before the TTL is over: %v", err)
	}
	l, err := c.Acquire(ctx, "job", 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= token {
		t.Fatalf("token %d after the dead holder's %d", l.Token(), token)
	}
	hist, err := c.History(ctx, "job", 1)
	if err != nil || hist[0].Kind != "taken_over" || !strings.Contains(hist[0].Reason, holder) {
		t.Fatalf("history %+v %v", hist, err)
	}
	if hist[0].At.Before(expiresAt) {
		t.Fatalf("taken over at %v, before the dead holder's expiry %v", hist[0].At, expiresAt)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The reply to a grant is lost: the server committed the grant (the proxy
// waits until it has finished), the client sees a broken connection, settles
// the backend that ran it and reads the grant back by its holder id: it
// returns the database's live grant, which only the read-back can have found.
func TestGrantReplyLostIsReadBack(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	p := newProxy(t, db.URL)
	c := newClient(t, proxiedPool(t, db.URL, p), &leases.Config{DisableWakeups: true})
	direct := leasesClient(t, db)
	ctx := ctxTimeout(t, time.Minute)

	for attempt := range 3 {
		trig := p.CutAfter(faultproxy.SQLContains("pgfence.try_acquire"))
		l, err := c.TryAcquire(ctx, "k", 10*time.Second, nil)
		<-trig.Done()
		if !trig.Fired() || !trig.Replied() {
			t.Fatalf("attempt %d: the proxy did not forward the grant and drop its answer (fired %v, replied %v)",
				attempt, trig.Fired(), trig.Replied())
		}
		if err != nil {
			t.Fatalf("attempt %d: a committed grant whose reply was lost: %v, want it read back", attempt, err)
		}
		st, gerr := direct.Get(ctx, "k")
		if gerr != nil || !st.Live || st.Holder != l.Holder() || st.Token != l.Token() {
			t.Fatalf("attempt %d: read back lease %s/%d, database %+v %v", attempt, l.Holder(), l.Token(), st, gerr)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The request is lost instead: nothing was granted, and the client says so.
	trig := p.CutBefore(faultproxy.SQLContains("pgfence.try_acquire"))
	_, err := c.TryAcquire(ctx, "k", 10*time.Second, nil)
	if !errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("lost request: %v", err)
	}
	if !trig.Fired() {
		t.Fatal("the request was not cut")
	}
	if st, err := direct.Get(ctx, "k"); err != nil || st.Live {
		t.Fatalf("after a lost request: %+v %v", st, err)
	}
}

func leasesClient(t *testing.T, db *pgfencetest.Database) *leases.Client {
	return newClient(t, db.Pool, &leases.Config{DisableWakeups: true})
}

// Do cancels the function's context when the lease is lost, and says so.
func TestDoCancelsWhenLost(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	c := newClient(t, pool, nil)
	ctx := ctxTimeout(t, 30*time.Second)

	ran := false
	err := c.Do(ctx, "k", time.Second, nil, func(ctx context.Context, l *leases.Lease) error {
		ran = true
		if _, err := c.ForceRelease(ctx, "k", "operator says stop"); err != nil {
			return err
		}
		select {
		case <-ctx.Done(): // the next renewal is refused
			return nil
		case <-time.After(5 * time.Second):
			return errors.New("fn's context still open after the lease was force-released")
		}
	})
	if !ran || !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("Do: %v", err)
	}
	hist, _ := c.History(ctx, "k", 1)
	if hist[0].Kind != "force_released" || hist[0].Reason != "operator says stop" {
		t.Fatalf("history %+v", hist)
	}

	// A normal run: the lease is kept alive past its TTL and released at the end.
	err = c.Do(ctx, "k", 600*time.Millisecond, nil, func(ctx context.Context, l *leases.Lease) error {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(time.Second):
			return nil
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Get(ctx, "k"); err != nil || st.Live || st.RenewedAt.IsZero() {
		t.Fatalf("after Do: %+v %v", st, err)
	}
}
