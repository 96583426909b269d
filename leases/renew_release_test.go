package leases_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// holdReleaseReply blocks the first pgfence.release statement's caller after
// the server committed it and its reply was read, until unblock is closed.
type holdReleaseReply struct {
	reached, unblock chan struct{}
	once             sync.Once
}

type holdReleaseKey struct{}

func (h *holdReleaseReply) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pgfence.release(") {
		return context.WithValue(ctx, holdReleaseKey{}, true)
	}
	return ctx
}

func (h *holdReleaseReply) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(holdReleaseKey{}) != nil {
		h.once.Do(func() {
			close(h.reached)
			<-h.unblock
		})
	}
}

// A renewal (the keep-alive's, or the holder's own) or a holder info change that
// runs while Release is in flight can reach the database right after the
// release committed and be refused. The lease was released by its holder,
// not lost: its context ends with ErrReleased and no lost event is emitted.
func TestRenewDuringReleaseIsNotLost(t *testing.T) {
	calls := map[string]func(context.Context, *leases.Lease) error{
		"Renew": func(ctx context.Context, l *leases.Lease) error { return l.Renew(ctx) },
		"SetHolderInfo": func(ctx context.Context, l *leases.Lease) error {
			_, err := l.SetHolderInfo(ctx, "changed")
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) { duringRelease(t, call) })
	}
}

func duringRelease(t *testing.T, call func(context.Context, *leases.Lease) error) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	hold := &holdReleaseReply{reached: make(chan struct{}), unblock: make(chan struct{})}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = hold
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var mu sync.Mutex
	var lost []error
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	leases.SetOnEvent(c, func(e leases.LogEvent) {
		if e.Kind == leases.LogLost {
			mu.Lock()
			lost = append(lost, e.Err)
			mu.Unlock()
		}
	})
	ctx := ctxTimeout(t, 30*time.Second)

	// The call under test is the only renewal: no keep-alive.
	l, err := c.TryAcquire(ctx, "k", 10*time.Second, manual())
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- l.Release(ctx) }()
	<-hold.reached // the release committed; Release has not seen its reply yet
	renewErr := call(ctx, l)
	close(hold.unblock)
	if err := <-released; err != nil {
		t.Fatalf("Release: %v", err)
	}
	if renewErr == nil {
		t.Fatal("a call after the release committed succeeded")
	}
	if errors.Is(renewErr, pgfence.ErrLeaseLost) {
		t.Errorf("the call after the release: %v, want no ErrLeaseLost", renewErr)
	}
	if !errors.Is(l.Err(), leases.ErrReleased) {
		t.Errorf("lease after a confirmed release: %v, want ErrReleased", l.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lost) > 0 {
		t.Errorf("lost events for a released lease: %v", lost)
	}
}

// The client's event sink (its logger; the test hook here) may call back into
// a lease whose Release emitted the event: a registry that releases what it
// hears was lost must not deadlock on the Release that is reporting it.
func TestEventSinkMayReleaseAgain(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	var (
		mu      sync.Mutex
		leaseOf = map[string]*leases.Lease{}
		inner   = make(chan error, 1)
	)
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	leases.SetOnEvent(c, func(e leases.LogEvent) {
		if e.Kind != leases.LogLost {
			return
		}
		mu.Lock()
		l := leaseOf[e.Key]
		mu.Unlock()
		if l == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		inner <- l.Release(ctx)
	})
	operator := newClient(t, pool, nil)
	ctx := ctxTimeout(t, 30*time.Second)
	// Not kept alive: the Release below, not a refused renewal, finds it lost.
	l, err := c.TryAcquire(ctx, "k", time.Minute, manual())
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	leaseOf["k"] = l
	mu.Unlock()
	if _, err := operator.ForceRelease(ctx, "k", "test: lost"); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("Release of a force-released lease: %v, want ErrLeaseLost", err)
	}
	if err := <-inner; !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("Release from the event sink: %v, want the same ErrLeaseLost (not a deadline)", err)
	}
}
