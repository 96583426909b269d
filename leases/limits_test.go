package leases_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestLimitsMatchSQL checks the Go limits against pgfence.lease_check_args
// and pgfence.lease_max_ttl(), which every lease function runs for other
// clients: the limit is accepted, one more is refused with PF008.
func TestLimitsMatchSQL(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	var maxTTLMicros int64
	if err := pool.QueryRow(ctx, `SELECT (extract(epoch FROM pgfence.lease_max_ttl()) * 1e6)::bigint`).Scan(&maxTTLMicros); err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(maxTTLMicros) * time.Microsecond; got != leases.MaxTTLLimit {
		t.Errorf("pgfence.lease_max_ttl() = %s, leases.MaxTTLLimit = %s", got, leases.MaxTTLLimit)
	}
	text := func(n int) string { return strings.Repeat("é", n/2) + strings.Repeat("k", n%2) } // bytes, not characters
	for _, c := range []struct {
		what  string
		limit int
		sql   string
	}{
		{"key", leases.MaxKeyBytes, `SELECT pgfence.lease_check_args($1, NULL, NULL)`},
		{"holder_info", leases.MaxHolderInfoBytes, `SELECT pgfence.lease_check_args('k', NULL, $1)`},
	} {
		if _, err := pool.Exec(ctx, c.sql, text(c.limit)); err != nil {
			t.Errorf("%s of %d bytes (the Go limit): %v, want accepted", c.what, c.limit, err)
		}
		if _, err := pool.Exec(ctx, c.sql, text(c.limit+1)); pgerr.Code(err) != pgerr.CodeInvalid {
			t.Errorf("%s of %d bytes: %v, want PF008", c.what, c.limit+1, err)
		}
	}
	ttl := `SELECT pgfence.lease_check_args('k', $1 * interval '1 microsecond', NULL)`
	if _, err := pool.Exec(ctx, ttl, leases.MaxTTLLimit.Microseconds()); err != nil {
		t.Errorf("ttl %s: %v, want accepted", leases.MaxTTLLimit, err)
	}
	if _, err := pool.Exec(ctx, ttl, leases.MaxTTLLimit.Microseconds()+1); pgerr.Code(err) != pgerr.CodeInvalid {
		t.Errorf("ttl %s + 1µs: %v, want PF008", leases.MaxTTLLimit, err)
	}
	if _, err := pool.Exec(ctx, ttl, time.Millisecond.Microseconds()); err != nil {
		t.Errorf("ttl 1ms (the Go minimum): %v, want accepted by SQL", err)
	}
	if _, err := pool.Exec(ctx, ttl, time.Millisecond.Microseconds()-1); pgerr.Code(err) != pgerr.CodeInvalid {
		t.Errorf("ttl 1ms - 1µs: %v, want PF008", err)
	}

	// The client at the limits: a key of MaxKeyBytes and a TTL of
	// MaxTTLLimit are granted.
	client := newClient(t, pool, &leases.Config{DisableWakeups: true})
	l, err := client.TryAcquire(ctx, text(leases.MaxKeyBytes), leases.MaxTTLLimit, &leases.AcquireOptions{HolderInfo: text(leases.MaxHolderInfoBytes)})
	if err != nil {
		t.Fatalf("TryAcquire at the limits: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLimitsCheckedBeforeRoundTrip: over-limit arguments are refused with an
// error naming the argument and the limit, by a client whose server does not
// exist, so nothing was sent.
func TestLimitsCheckedBeforeRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	client, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for _, c := range []struct {
		key  string
		ttl  time.Duration
		opts *leases.AcquireOptions
		want string
	}{
		{strings.Repeat("k", leases.MaxKeyBytes+1), time.Second, nil, "key: must be at most 512 bytes, got 513"},
		{"", time.Second, nil, "key: must not be empty"},
		{"a\x00b", time.Second, nil, "key: must not contain a NUL byte"},
		{"a\xffb", time.Second, nil, "key: must be valid UTF-8"},
		{"k", leases.MaxTTLLimit + time.Microsecond, nil, "ttl: must be at most 24h0m0s"},
		{"k", time.Millisecond - 1, nil, "ttl: must be at least 1ms"},
		{"k", 0, nil, "ttl: must be positive"},
		{"k", time.Second, &leases.AcquireOptions{HolderInfo: strings.Repeat("h", leases.MaxHolderInfoBytes+1)}, "AcquireOptions.HolderInfo: must be at most 1024 bytes, got 1025"},
		{"k", time.Second, &leases.AcquireOptions{HolderInfo: "a\x00b"}, "AcquireOptions.HolderInfo: must not contain a NUL byte"},
	} {
		if _, err := client.TryAcquire(ctx, c.key, c.ttl, c.opts); !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("TryAcquire(%.20q, %s): %v, want ErrInvalid with %q", c.key, c.ttl, err, c.want)
		}
	}
	if _, err := client.Get(ctx, strings.Repeat("k", leases.MaxKeyBytes+1)); !errors.Is(err, pgfence.ErrInvalid) {
		t.Errorf("Get with a long key: %v, want ErrInvalid", err)
	}

	// Operator calls: the prefix and the reason (1 to 1000 characters).
	long := strings.Repeat("é", 1001)
	for _, c := range []struct {
		what string
		call func() error
		want string
	}{
		{"PauseGrants long prefix", func() error {
			_, err := client.PauseGrants(ctx, strings.Repeat("p", leases.MaxKeyBytes+1), "r")
			return err
		}, "prefix: must be at most 512 bytes"},
		{"PauseGrants NUL prefix", func() error { _, err := client.PauseGrants(ctx, "a\x00", "r"); return err }, "prefix: must not contain a NUL byte"},
		{"PauseGrants no reason", func() error { _, err := client.PauseGrants(ctx, "p", ""); return err }, "reason: must be 1 to 1000 characters, got 0"},
		{"PauseGrants long reason", func() error { _, err := client.PauseGrants(ctx, "p", long); return err }, "reason: must be 1 to 1000 characters, got 1001"},
		{"PauseGrants invalid UTF-8 reason", func() error { _, err := client.PauseGrants(ctx, "p", "\xff"); return err }, "reason: must be valid UTF-8"},
		{"ResumeGrants invalid UTF-8 prefix", func() error { _, err := client.ResumeGrants(ctx, "\xff", ""); return err }, "prefix: must be valid UTF-8"},
		{"ResumeGrants long reason", func() error { _, err := client.ResumeGrants(ctx, "p", long); return err }, "reason: must be at most 1000 characters, got 1001"},
		{"ResumeGrants NUL reason", func() error { _, err := client.ResumeGrants(ctx, "p", "a\x00"); return err }, "reason: must not contain a NUL byte"},
		{"ForceRelease no reason", func() error { _, err := client.ForceRelease(ctx, "k", ""); return err }, "reason: must be 1 to 1000 characters, got 0"},
		{"ForceRelease NUL reason", func() error { _, err := client.ForceRelease(ctx, "k", "a\x00"); return err }, "reason: must not contain a NUL byte"},
	} {
		if err := c.call(); !errors.Is(err, pgfence.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid with %q", c.what, err, c.want)
		}
	}
}

// FuzzKeyValidation: the client accepts exactly the keys PostgreSQL can
// store within the limit (1 to MaxKeyBytes bytes of UTF-8 without NUL), and
// never panics. It needs no database: accepted keys meet a server that does
// not exist and fail as unavailable, refused ones fail before that.
func FuzzKeyValidation(f *testing.F) {
	for _, s := range []string{"reports/daily", "", "a\x00b", "\xff", strings.Repeat("é", 256), strings.Repeat("é", 257), "'; DROP TABLE pgfence.leases; --"} {
		f.Add(s)
	}
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(pool.Close)
	client, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = client.Close() })
	f.Fuzz(func(t *testing.T, key string) {
		// A cancelled context: an accepted key stops before dialing.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := client.TryAcquire(ctx, key, time.Second, nil)
		valid := len(key) >= 1 && len(key) <= leases.MaxKeyBytes && utf8.ValidString(key) && !strings.ContainsRune(key, 0)
		if refused := errors.Is(err, pgfence.ErrInvalid); refused == valid {
			t.Fatalf("key %q (%d bytes): %v; valid = %v", key, len(key), err, valid)
		}
		if err == nil {
			t.Fatalf("key %q: granted by a server that does not exist", key)
		}
	})
}

// A database without the pgfence schema (or with an older one) gets an error
// that says to apply the migrations, not a bare "function does not exist".
func TestSchemaMissingSaysMigrate(t *testing.T) {
	checkLeaks(t)
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := pool.Exec(ctx, `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool, &leases.Config{DisableWakeups: true})
	_, err := c.TryAcquire(ctx, "k", time.Minute, nil)
	if err == nil || !strings.Contains(err.Error(), "migrate up") || errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("TryAcquire without the schema: %v; want an error that says to apply the migrations", err)
	}
}
