package leases_test

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
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

// TestTelemetryKeepAliveStops ends a keep-alive in each way and checks
// pgfence.lease.operations{keepalive} and the log event that names the reason.
func TestTelemetryKeepAliveStops(t *testing.T) {
	checkLeaks(t)
	db := pgfencetest.NewDatabase(t)
	proxy := newProxy(t, db.URL)
	p := telemetrytest.New(t)
	logs := &logBuffer{}
	c := newClient(t, proxiedPool(t, db.URL, proxy), &leases.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer, DisableWakeups: true,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx := ctxTimeout(t, 30*time.Second)
	acquire := func(key string, opts *leases.AcquireOptions) *leases.Lease {
		t.Helper()
		l, err := c.TryAcquire(ctx, key, 10*time.Second, opts)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ended := func(l *leases.Lease) error {
		t.Helper()
		select {
		case <-l.Context().Done():
			return l.Err()
		case <-ctx.Done():
			t.Fatalf("lease %q still open", l.Key())
			return nil
		}
	}

	// released.
	l := acquire("released", nil)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// lost: the database refused a renewal.
	l = acquire("lost", nil)
	backdate(t, db.Pool, "lost", -time.Second)
	if err := l.Renew(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("renewal of an expired lease: %v", err)
	}
	// max_hold: the hold time runs out at once.
	l = acquire("max-hold", &leases.AcquireOptions{MaxHold: time.Nanosecond})
	if err := ended(l); !errors.Is(err, leases.ErrMaxHold) {
		t.Fatalf("lease kept past MaxHold: %v", err)
	}
	// failures: the only allowed renewal loses its reply.
	trig := proxy.CutAfter(faultproxy.SQLContains("pgfence.renew"))
	l = acquire("failures", &leases.AcquireOptions{RenewInterval: 20 * time.Millisecond, MaxFailures: 1})
	if err := ended(l); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("lease after a failed renewal: %v", err)
	}
	<-trig.Done()
	// canceled: the client is closed; the lease stays held. Close waits for
	// every keep-alive to stop, so the counts below are final.
	l = acquire("canceled", nil)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if l.Err() != nil {
		t.Fatalf("lease after its client was closed: %v", l.Err())
	}

	m := p.Metrics(t)
	for _, reason := range []string{"canceled", "released", "lost", "max_hold", "failures"} {
		if n := ops(m, "keepalive", reason); n != 1 {
			t.Errorf("operations{keepalive, %s} = %d, want 1", reason, n)
		}
		if !strings.Contains(logs.String(), `msg="pgfence lease keep-alive stopped"`) || !strings.Contains(logs.String(), "reason="+reason) {
			t.Errorf("no keep-alive stop logged with reason %s", reason)
		}
	}
	if n := ops(m, "renew", "unknown"); n != 1 {
		t.Errorf("operations{renew, unknown} = %d, want 1", n)
	}
	if err := l.Release(ctx); err != nil { // a closed client's lease can still be released
		t.Fatal(err)
	}
}
