package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) {
	workerproc.Serve(map[string]workerproc.Handler{crashWorkerKind: serveCrashWorker})
	container.Main(m)
}

var modes = []idemhttp.Mode{idemhttp.ModeAtomic, idemhttp.ModeLeased}

// modeName names a mode in the subtests' names.
func modeName(mode idemhttp.Mode) string {
	if mode == idemhttp.ModeLeased {
		return "leased"
	}
	return "atomic"
}

// forModes runs test once per mode, in parallel subtests.
func forModes(t *testing.T, test func(t *testing.T, mode idemhttp.Mode)) {
	for _, mode := range modes {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			test(t, mode)
		})
	}
}

func newStore(t testing.TB, cfg *idempotency.Config) *idempotency.Store {
	t.Helper()
	s, err := idempotency.NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newMiddleware(t testing.TB, store *idempotency.Store, db idempotency.DB, cfg *idemhttp.Config) *idemhttp.Middleware {
	t.Helper()
	mw, err := idemhttp.New(store, db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// byUser is the principal of the tests: the X-User header, as an
// authentication middleware in front would establish it.
func byUser(r *http.Request) string { return r.Header.Get("X-User") }

// createOrders creates the business table of the order API. It has no
// unique constraint: only the key stands between a duplicate and a second
// row.
func createOrders(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(),
		`CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

func countOrders(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// orderAPI creates an order per call, through the key's transaction in
// ModeAtomic and through the pool otherwise, and counts its calls.
type orderAPI struct {
	pool   *pgxpool.Pool
	calls  atomic.Int64
	status atomic.Int64 // next status to answer, 0 = 201
	gate   chan struct{}
}

func (h *orderAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	if h.gate != nil {
		select {
		case <-h.gate:
		case <-r.Context().Done():
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
	var db interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	} = h.pool
	if tx := idemhttp.Tx(r.Context()); tx != nil {
		db = tx
	}
	var id int64
	if err := db.QueryRow(r.Context(), `INSERT INTO orders (body) VALUES ($1) RETURNING id`, string(body)).Scan(&id); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	status := int(h.status.Load())
	if status == 0 {
		status = http.StatusCreated
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(id, 10))
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Request-Id", strconv.FormatInt(id, 10))
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"order":%d,"request":%q}`, id, body)
}

type fixture struct {
	pool *pgxpool.Pool
	api  *orderAPI
	srv  *httptest.Server
}

// newFixture serves the order API behind a middleware in mode (cfg's Mode
// is set; a nil cfg scopes keys by X-User) on POST and GET /orders/{id}.
func newFixture(t *testing.T, mode idemhttp.Mode, storeCfg *idempotency.Config, cfg *idemhttp.Config) *fixture {
	t.Helper()
	f := &fixture{pool: pgfencetest.NewPool(t)}
	f.api = &orderAPI{pool: f.pool}
	createOrders(t, f.pool)
	if cfg == nil {
		cfg = &idemhttp.Config{Principal: byUser}
	}
	c := *cfg
	c.Mode = mode
	mw := newMiddleware(t, newStore(t, storeCfg), f.pool, &c)
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", mw.Wrap(f.api))
	mux.Handle("GET /orders/{id}", mw.Wrap(f.api))
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

type response struct {
	status int
	header http.Header
	body   string
}

func (r response) replayed() bool { return r.header.Get(idemhttp.HeaderReplayed) == "true" }

// do sends a request with key (none if "") as user "alice" unless the extra
// headers name another X-User.
func (f *fixture) do(t testing.TB, method, path, key, body string, header ...string) response {
	t.Helper()
	return send(t, f.srv, method, path, key, body, header...)
}

func send(t testing.TB, srv *httptest.Server, method, path, key, body string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	req.Header.Set("X-User", "alice")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Error(err)
		return response{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}
}

// verifyNoLeaks checks, after the test's other cleanups (pools closed), that
// the test left no goroutine behind. Such tests are not parallel.
func verifyNoLeaks(t *testing.T) {
	t.Helper()
	opts := []goleak.Option{
		goleak.IgnoreCurrent(),
		// the shared test cluster's postmaster, started by the first test
		goleak.IgnoreAnyFunction("github.com/pgfence/pgfence/internal/testkit/pgcluster.(*Cluster).startLocked.func1"),
	}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// expireLeases moves the lease of every leased key in progress into the
// past (database clock), as if its owner had stopped heartbeating long ago,
// and returns how many it moved. Completed keys keep their retention.
func expireLeases(t testing.TB, pool *pgxpool.Pool) int64 {
	t.Helper()
	tag, err := pool.Exec(context.Background(), `UPDATE pgfence.idempotency_keys
   SET created_at = clock_timestamp() - interval '1 hour', lease_expires_at = clock_timestamp() - interval '1 second'
 WHERE status = 'in_progress' AND mode = 'leased'`)
	if err != nil {
		t.Fatal(err)
	}
	return tag.RowsAffected()
}

// keyStatus returns the status of the only key of the database, "" if none.
func keyStatus(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var status string
	err := pool.QueryRow(context.Background(), `SELECT coalesce(max(status), '') FROM pgfence.idempotency_keys`).Scan(&status)
	if err != nil {
		t.Fatal(err)
	}
	return status
}

// statusOf returns the status of key (any scope), "" if there is none.
func statusOf(t testing.TB, pool *pgxpool.Pool, key string) string {
	t.Helper()
	var status string
	err := pool.QueryRow(context.Background(), `SELECT coalesce(max(status), '') FROM pgfence.idempotency_keys WHERE key = $1`, key).Scan(&status)
	if err != nil {
		t.Fatal(err)
	}
	return status
}

// throughProxy returns a pool to db through a fault proxy.
func throughProxy(t *testing.T, db *pgfencetest.Database) (*faultproxy.Proxy, *pgxpool.Pool) {
	t.Helper()
	p, url := proxyURL(t, db.URL)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return p, pool
}

// proxyURL starts a fault proxy in front of the server of url and returns
// it and url rewritten to go through it.
func proxyURL(t *testing.T, url string) (*faultproxy.Proxy, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), &faultproxy.Config{CutGrace: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	purl, err := p.ConnString(url)
	if err != nil {
		t.Fatal(err)
	}
	return p, purl
}

// waitFor polls cond every few milliseconds until it holds or 30 s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// lockWaiters counts the backends of pool's database waiting for a lock.
func lockWaiters(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
 WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
