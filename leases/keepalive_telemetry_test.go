package leases_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// logBuffer is a concurrency-safe text log sink.
type logBuffer struct {
	mu sync.Mutex
	sb strings.Builder
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.String()
}

// TestTelemetryKeepAliveStops ends a KeepAlive loop in each way and checks
// pgfence.lease.keepalive.stops and the log event that names the reason.
func TestTelemetryKeepAliveStops(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	proxy := newProxy(t, db.URL)
	p := telemetrytest.New(t)
	logs := &logBuffer{}
	c := newClient(t, proxiedPool(t, db.URL, proxy), &leases.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer, DisableWakeups: true,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx := ctxTimeout(t, 30*time.Second)
	acquire := func(key string) *leases.Lease {
		t.Helper()
		l, err := c.TryAcquire(ctx, key, 10*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	// canceled: the caller's context ended; the lease stays held.
	l := acquire("canceled")
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.KeepAlive(cctx, nil); err != nil || l.Err() != nil {
		t.Fatalf("KeepAlive with an ended context: %v (lease %v)", err, l.Err())
	}
	// released.
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.KeepAlive(ctx, nil); err != nil {
		t.Fatalf("KeepAlive of a released lease: %v", err)
	}
	// lost: the database refused a renewal before.
	l = acquire("lost")
	backdate(t, db.Pool, "lost", -time.Second)
	if err := l.Renew(ctx); !errors.Is(err, leases.ErrLeaseLost) {
		t.Fatalf("renewal of an expired lease: %v", err)
	}
	if err := l.KeepAlive(ctx, nil); !errors.Is(err, leases.ErrLeaseLost) {
		t.Fatalf("KeepAlive of a lost lease: %v", err)
	}
	// max_hold: the hold time already ran out.
	l = acquire("max-hold")
	if err := l.KeepAlive(ctx, &leases.KeepAliveOptions{MaxHold: time.Nanosecond}); !errors.Is(err, leases.ErrMaxHold) {
		t.Fatalf("KeepAlive past MaxHold: %v", err)
	}
	// failures: the only allowed renewal loses its reply.
	l = acquire("failures")
	trig := proxy.CutAfter(faultproxy.SQLContains("pgfence.renew"))
	if err := l.KeepAlive(ctx, &leases.KeepAliveOptions{Interval: 20 * time.Millisecond, MaxFailures: 1}); !errors.Is(err, leases.ErrLeaseLost) {
		t.Fatalf("KeepAlive with a failed renewal: %v", err)
	}
	<-trig.Done()

	m := p.Metrics(t)
	for _, reason := range []string{"canceled", "released", "lost", "max_hold", "failures"} {
		if n := m.Sum("pgfence.lease.keepalive.stops", outcome(reason)); n != 1 {
			t.Errorf("keepalive.stops{%s} = %d, want 1", reason, n)
		}
		if !strings.Contains(logs.String(), `msg="pgfence lease keep-alive stopped"`) || !strings.Contains(logs.String(), "reason="+reason) {
			t.Errorf("no keep-alive stop logged with reason %s", reason)
		}
	}
	if n := m.Sum("pgfence.lease.renewals", outcome("failed")); n != 1 {
		t.Errorf("renewals{failed} = %d, want 1", n)
	}
}
