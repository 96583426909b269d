package leases_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envWorker); mode != "" {
		os.Exit(runWorker(mode))
	}
	pgfencetest.Main(m)
}

// checkLeaks registers a goroutine leak check that runs after every cleanup
// registered later (pools, clients). Call it first in a test.
func checkLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, ignore,
			// The shared test cluster's process reapers, started lazily by the
			// first test that needs a database.
			goleak.IgnoreAnyFunction("os/exec.(*Cmd).Start.func2"),
			goleak.IgnoreAnyFunction("os/exec.(*Cmd).Wait"),
			goleak.IgnoreAnyFunction("os.(*Process).Wait"),
		)
	})
}

func newClient(t testing.TB, pool *pgxpool.Pool, cfg *leases.Config) *leases.Client {
	t.Helper()
	c, err := leases.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// backdate moves the expiry of key's current grant to the database's now + d
// (d may be negative), as if time had passed.
func backdate(t testing.TB, pool *pgxpool.Pool, key string, d time.Duration) {
	t.Helper()
	tag, err := pool.Exec(context.Background(),
		`UPDATE pgfence.leases SET expires_at = greatest(granted_at, clock_timestamp() + $2::bigint * interval '1 microsecond') WHERE key = $1`,
		key, d.Microseconds())
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("backdate %q: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

// proxy is a TCP forwarder between clients and the database that can cut the
// network silently (packets dropped, connections left open).
type proxy struct {
	ln        net.Listener
	target    string
	blackhole atomic.Bool
	mu        sync.Mutex
	conns     []net.Conn
	wg        sync.WaitGroup
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *proxy) Addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

// Blackhole drops everything from now on, in both directions.
func (p *proxy) Blackhole() { p.blackhole.Store(true) }

func (p *proxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = append(p.conns, c)
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.track(client)
		p.track(server)
		p.wg.Add(2)
		go p.pipe(server, client)
		go p.pipe(client, server)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.blackhole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
			} else if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// Close closes the listener and every connection and waits for the pipes.
func (p *proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// proxiedPool returns a pool on dbURL whose connections go through p.
func proxiedPool(t testing.TB, dbURL string, p *proxy) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(p.Addr().Port)
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// targetAddr is the host:port of the server behind dbURL.
func targetAddr(t testing.TB, dbURL string) string {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
}
