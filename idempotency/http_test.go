package idempotency_test

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// orderAPI is a handler that creates an order per call and counts calls.
type orderAPI struct {
	calls  atomic.Int64
	status atomic.Int64 // next status to answer, 0 = 201
	gate   chan struct{}
}

func (h *orderAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	if h.gate != nil {
		select {
		case <-h.gate:
		case <-r.Context().Done():
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
	status := int(h.status.Load())
	if status == 0 {
		status = http.StatusCreated
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(n, 10))
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Request-Id", strconv.FormatInt(n, 10))
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"order":%d,"request":%q}`, n, body)
}

type httpFixture struct {
	pool *pgxpool.Pool
	api  *orderAPI
	srv  *httptest.Server
}

func newHTTPFixture(t *testing.T, storeCfg *idempotency.Config, cfg *idempotency.HTTPConfig) *httpFixture {
	t.Helper()
	f := &httpFixture{pool: pgfencetest.NewPool(t), api: &orderAPI{}}
	mw, err := idempotency.NewMiddleware(newStore(t, storeCfg), f.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
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

func (f *httpFixture) do(t testing.TB, method, path, key, body string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Error(err)
		return response{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}
}

func TestHTTPReplay(t *testing.T) {
	t.Parallel()
	f := newHTTPFixture(t, nil, nil)
	first := f.do(t, "POST", "/orders/1", `"k-1"`, `{"qty":2}`)
	if first.status != http.StatusCreated || first.header.Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("first: %+v", first)
	}
	again := f.do(t, "POST", "/orders/1", `"k-1"`, `{"qty":2}`)
	if again.status != http.StatusCreated || again.body != first.body || again.header.Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("replay: %+v, first %+v", again, first)
	}
	if again.header.Get("Location") != "/orders/1" || again.header.Get("Content-Type") != "application/json" {
		t.Fatalf("allow-listed headers not replayed: %v", again.header)
	}
	if again.header.Get("Set-Cookie") != "" || again.header.Get("X-Request-Id") != "" {
		t.Fatalf("headers outside the allow-list replayed: %v", again.header)
	}
	if n := f.api.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	// The handler saw the whole body although the middleware read it.
	if !strings.Contains(first.body, `{\"qty\":2}`) {
		t.Fatalf("handler did not get the body: %s", first.body)
	}
	// A bare token is accepted as the same key.
	if r := f.do(t, "POST", "/orders/1", `k-1`, `{"qty":2}`); r.header.Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("bare token: %+v", r)
	}
	// GET is not covered: it runs every time.
	f.do(t, "GET", "/orders/1", `"k-1"`, "")
	f.do(t, "GET", "/orders/1", `"k-1"`, "")
	if n := f.api.calls.Load(); n != 3 {
		t.Fatalf("GET calls: handler ran %d times, want 3", n)
	}
}

func TestHTTPBadKeys(t *testing.T) {
	t.Parallel()
	f := newHTTPFixture(t, nil, &idempotency.HTTPConfig{Required: true, MaxBodyBytes: 16})
	for name, key := range map[string]string{
		"missing":      "",
		"unterminated": `"abc`,
		"space":        `a b`,
		"inner quote":  `"a"b"`,
		"bad escape":   `"a\nb"`,
		"non-ascii":    `"schlüssel"`,
		"too long":     `"` + strings.Repeat("x", idempotency.HTTPMaxKeyBytes+1) + `"`,
		"empty":        `""`,
	} {
		if r := f.do(t, "POST", "/orders/1", key, "{}"); r.status != http.StatusBadRequest ||
			r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s key: %d %s, want 400 problem", name, r.status, r.body)
		}
	}
	if r := f.do(t, "POST", "/orders/1", `"a"`, "{}", idempotency.HeaderKey, `"b"`); r.status != http.StatusBadRequest {
		t.Errorf("two keys: %d, want 400", r.status)
	}
	if r := f.do(t, "POST", "/orders/1", `"a"`, strings.Repeat("x", 17)); r.status != http.StatusRequestEntityTooLarge {
		t.Errorf("big body: %d, want 413", r.status)
	}
	if n := f.api.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times for refused requests", n)
	}

	optional := newHTTPFixture(t, nil, nil)
	if r := optional.do(t, "POST", "/orders/1", "", "{}"); r.status != http.StatusCreated {
		t.Fatalf("no key, not required: %d", r.status)
	}
}

func TestHTTPMismatch(t *testing.T) {
	t.Parallel()
	f := newHTTPFixture(t, nil, nil)
	first := f.do(t, "POST", "/orders/1", `"k"`, `{"qty":2}`)
	for name, r := range map[string]response{
		"other body": f.do(t, "POST", "/orders/1", `"k"`, `{"qty":3}`),
		"other uri":  f.do(t, "POST", "/orders/2", `"k"`, `{"qty":2}`), // same route pattern
	} {
		if r.status != http.StatusUnprocessableEntity || strings.Contains(r.body, first.body) {
			t.Errorf("%s: %d %s, want 422 without the stored response", name, r.status, r.body)
		}
	}
	if n := f.api.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestHTTPScopedByPrincipal(t *testing.T) {
	t.Parallel()
	f := newHTTPFixture(t, nil, &idempotency.HTTPConfig{
		Principal: func(r *http.Request) string { return r.Header.Get("X-User") },
	})
	a := f.do(t, "POST", "/orders/1", `"same"`, "{}", "X-User", "alice")
	b := f.do(t, "POST", "/orders/1", `"same"`, "{}", "X-User", "bob")
	if a.status != http.StatusCreated || b.status != http.StatusCreated || a.body == b.body ||
		b.header.Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("alice %+v, bob %+v: principals must not share keys", a, b)
	}
	if r := f.do(t, "POST", "/orders/1", `"same"`, "{}", "X-User", "alice"); r.body != a.body {
		t.Fatalf("alice's replay: %+v", r)
	}
}

func TestHTTPStoresFinalAnswersOnly(t *testing.T) {
	t.Parallel()
	f := newHTTPFixture(t, nil, nil)
	for _, status := range []int{http.StatusInternalServerError, http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		f.api.status.Store(int64(status))
		if r := f.do(t, "POST", "/orders/1", `"retry-me"`, "{}"); r.status != status {
			t.Fatalf("got %d, want %d", r.status, status)
		}
	}
	f.api.status.Store(0)
	if r := f.do(t, "POST", "/orders/1", `"retry-me"`, "{}"); r.status != http.StatusCreated || r.header.Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("after transient answers: %+v, want a fresh 201", r)
	}
	if n := f.api.calls.Load(); n != 4 {
		t.Fatalf("handler ran %d times, want 4", n)
	}

	// A permanent 4xx is stored and replayed.
	f.api.status.Store(http.StatusBadRequest)
	first := f.do(t, "POST", "/orders/1", `"bad"`, "{}")
	f.api.status.Store(0)
	again := f.do(t, "POST", "/orders/1", `"bad"`, "{}")
	if again.status != http.StatusBadRequest || again.body != first.body || again.header.Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("4xx replay: %+v", again)
	}
}

func TestHTTPPanicReleasesKey(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	mw, err := idempotency.NewMiddleware(newStore(t, nil), pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			panic("boom")
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	serve := func() (rec *httptest.ResponseRecorder, panicked bool) {
		defer func() { panicked = recover() != nil }()
		rec = httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/jobs", nil)
		req.Header.Set(idempotency.HeaderKey, `"job-1"`)
		h.ServeHTTP(rec, req)
		return rec, false
	}
	if _, panicked := serve(); !panicked {
		t.Fatal("panic swallowed")
	}
	if rec, _ := serve(); rec.Code != http.StatusNoContent || calls.Load() != 2 {
		t.Fatalf("after panic: %d, %d calls; want the key released and the handler run", rec.Code, calls.Load())
	}
}

// TestHTTPConcurrentDuplicates: 16 clients send the same request at once while
// the handler is slow; exactly one execution, the others get 409 with
// Retry-After, and after the first finishes every retry gets the same
// response.
func TestHTTPConcurrentDuplicates(t *testing.T) {
	verifyNoLeaks(t)
	f := newHTTPFixture(t, nil, nil)
	f.api.gate = make(chan struct{})
	const n = 16
	var wg sync.WaitGroup
	var answered atomic.Int64
	results := make([]response, n)
	for i := range n {
		wg.Go(func() {
			results[i] = f.do(t, "POST", "/orders/7", `"dup"`, `{"qty":1}`)
			answered.Add(1)
		})
	}
	// While the one execution blocks, every duplicate is answered.
	deadline := time.Now().Add(30 * time.Second)
	for answered.Load() < n-1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if calls := f.api.calls.Load(); calls != 1 {
		t.Fatalf("handler running %d times", calls)
	}
	close(f.api.gate)
	wg.Wait()

	var created, conflicts int
	var createdBody string
	for _, r := range results {
		switch r.status {
		case http.StatusCreated:
			created++
			createdBody = r.body
		case http.StatusConflict:
			conflicts++
			if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
				t.Errorf("409 without a Retry-After: %v", r.header)
			}
		default:
			t.Errorf("unexpected %d %s", r.status, r.body)
		}
	}
	if created != 1 || conflicts != n-1 {
		t.Fatalf("%d created, %d conflicts; want 1 and %d", created, conflicts, n-1)
	}
	for range n - 1 {
		if r := f.do(t, "POST", "/orders/7", `"dup"`, `{"qty":1}`); r.status != http.StatusCreated || r.body != createdBody ||
			r.header.Get(idempotency.HeaderReplayed) != "true" {
			t.Fatalf("retry after completion: %+v", r)
		}
	}
	if calls := f.api.calls.Load(); calls != 1 {
		t.Fatalf("handler ran %d times", calls)
	}
	f.srv.Close()
	f.srv.Client().CloseIdleConnections()
}

// TestHTTPLostLeaseCancelsHandler: a handler that outlives its lease (a
// pause) is cancelled once a retry took the key over, and its late answer is
// not stored.
func TestHTTPLostLeaseCancelsHandler(t *testing.T) {
	t.Parallel()
	f := newHTTPFixture(t, &idempotency.Config{Lease: time.Hour}, &idempotency.HTTPConfig{Heartbeat: 50 * time.Millisecond})
	f.api.gate = make(chan struct{}) // the first call blocks until its context ends
	first := make(chan response, 1)
	go func() { first <- f.do(t, "POST", "/orders/1", `"slow"`, "{}") }()
	for f.api.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	// A retry takes the key over once the lease expired (database clock). A
	// heartbeat of the first may extend the lease between the backdating and
	// the claim, so backdate again while the retry gets 409.
	second := make(chan response, 1)
	go func() {
		for {
			expireLease(t, f.pool, "slow")
			if r := f.do(t, "POST", "/orders/1", `"slow"`, "{}"); r.status != http.StatusConflict {
				second <- r
				return
			}
		}
	}()
	select {
	case r := <-first:
		if r.status != http.StatusServiceUnavailable {
			t.Fatalf("first: %d, want the handler's answer to its cancelled context", r.status)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the replaced handler was not cancelled")
	}
	close(f.api.gate)
	r := <-second
	if r.status != http.StatusCreated {
		t.Fatalf("second: %+v", r)
	}
	if again := f.do(t, "POST", "/orders/1", `"slow"`, "{}"); again.body != r.body {
		t.Fatalf("stored answer is not the owner's: %+v vs %+v", again, r)
	}
}

// TestHTTPPathsAndPrincipalsThatAreNotText: a decoded path or a principal
// may hold NUL or invalid UTF-8 (POST /a%00b), which PostgreSQL cannot
// store as text. Such a scope is kept as its hash, so the request is
// protected like any other instead of failing with 500, and different
// routes and principals still never meet. Scopes of ordinary text are the
// same as before, so stored keys stay valid across an upgrade.
func TestHTTPPathsAndPrincipalsThatAreNotText(t *testing.T) {
	t.Parallel()
	var logged strings.Builder
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logged.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelWarn}))
	f := &httpFixture{pool: pgfencetest.NewPool(t), api: &orderAPI{}}
	mw, err := idempotency.NewMiddleware(newStore(t, &idempotency.Config{Logger: logger}), f.pool, &idempotency.HTTPConfig{
		Principal: func(r *http.Request) string { return r.URL.Query().Get("user") },
	})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(mw.Wrap(f.api)) // no ServeMux pattern: the route is the decoded path
	t.Cleanup(f.srv.Close)

	bodies := map[string]string{}
	for _, path := range []string{"/a%00b", "/a%FFb", "/p?user=%00", "/p?user=%FF", "/p?user=%FE", "/p?user=x"} {
		first := f.do(t, "POST", path, `"k"`, "{}")
		if first.status != http.StatusCreated || first.header.Get(idempotency.HeaderReplayed) != "" {
			t.Errorf("POST %s: %d %s, want 201 from the handler", path, first.status, first.body)
			continue
		}
		for other, body := range bodies {
			if body == first.body {
				t.Errorf("POST %s got the response of POST %s: scopes must differ", path, other)
			}
		}
		bodies[path] = first.body
		again := f.do(t, "POST", path, `"k"`, "{}")
		if again.status != http.StatusCreated || again.body != first.body || again.header.Get(idempotency.HeaderReplayed) != "true" {
			t.Errorf("POST %s again: %d %s, want the replay of %s", path, again.status, again.body, first.body)
		}
	}
	if n := f.api.calls.Load(); n != int64(len(bodies)) {
		t.Errorf("handler ran %d times for %d distinct requests", n, len(bodies))
	}
	logMu.Lock()
	if logged.Len() > 0 {
		t.Errorf("the middleware logged warnings or errors:\n%s", logged.String())
	}
	logMu.Unlock()
	// An ordinary path and principal keep the scope they always had.
	assertRows(t, f.pool, "http:7:POST /p:x", "k", 1)
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// TestHTTPClientGoneKeepsLease: a client that gives up does not end the
// lease of the handler it started. net/http cancels the request's context
// when the client disconnects, but the handler may still be inside a
// downstream call that ignores it; the key stays in progress until the
// handler returns, a retry meanwhile gets 409 instead of running the
// handler a second time, and the first handler's answer is stored and
// replayed.
func TestHTTPClientGoneKeepsLease(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	mw, err := idempotency.NewMiddleware(newStore(t, &idempotency.Config{Lease: 600 * time.Millisecond}), pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	handlerCtx := make(chan context.Context, 1)
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		select {
		case handlerCtx <- r.Context():
		default:
		}
		time.Sleep(2 * time.Second) // a downstream call that ignores the context
		fmt.Fprint(w, "done")
	})))
	t.Cleanup(srv.Close)
	post := func(ctx context.Context) (response, error) {
		req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/pay", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idempotency.HeaderKey, `"gone"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return response{}, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return response{resp.StatusCode, resp.Header, string(b)}, nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if r, err := post(ctx); err == nil {
		t.Fatalf("the impatient client got an answer: %+v", r)
	}
	// The server noticed the disconnect: the handler's context ended.
	select {
	case hctx := <-handlerCtx:
		select {
		case <-hctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the handler's context did not end when the client left")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not run")
	}
	// Well past the lease of the claim, while the first handler still runs.
	time.Sleep(900 * time.Millisecond)
	r, err := post(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusConflict {
		t.Errorf("retry while the first handler runs: %d %q, want 409", r.status, r.body)
	}
	// Once the first handler returned, its answer is replayed.
	deadline := time.Now().Add(10 * time.Second)
	for r.status == http.StatusConflict && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if r, err = post(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if r.status != http.StatusOK || r.body != "done" || r.header.Get(idempotency.HeaderReplayed) != "true" {
		t.Errorf("retry after the first handler returned: %d %q replayed=%q, want its stored 200 \"done\"",
			r.status, r.body, r.header.Get(idempotency.HeaderReplayed))
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times for one key", n)
	}
}

// TestHTTPLeaseKeptAfterStoreComesBack: the key store is unreachable for
// longer than the lease while a handler runs. The middleware stops trusting
// the lease and ends the handler's context, but a handler inside a call that
// ignores its context still runs. Once the store is back and nobody took the
// key over, the lease must be extended again until the handler returns:
// otherwise it expires under a running handler and a retry runs it a second
// time.
func TestHTTPLeaseKeptAfterStoreComesBack(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	p, dbs := throughProxy(t, db)
	direct, err := pgxpool.New(context.Background(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	const lease = 400 * time.Millisecond
	mw, err := idempotency.NewMiddleware(newStore(t, &idempotency.Config{Lease: lease}), dbs["pool"],
		&idempotency.HTTPConfig{Heartbeat: lease / 8})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	gate := make(chan struct{})
	handlerCtx := make(chan context.Context, 1)
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			handlerCtx <- r.Context()
			<-gate // a downstream call that ignores the context
		}
		fmt.Fprint(w, "done")
	})))
	t.Cleanup(srv.Close)
	first := make(chan response, 1)
	go func() {
		req, _ := http.NewRequest("POST", srv.URL+"/pay", strings.NewReader("{}"))
		req.Header.Set(idempotency.HeaderKey, `"back"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			first <- response{}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		first <- response{resp.StatusCode, resp.Header, string(b)}
	}()
	var hctx context.Context
	select {
	case hctx = <-handlerCtx:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not run")
	}

	// The store goes away until the middleware stops trusting the lease.
	p.SetRefuse(true)
	p.CutAll()
	select {
	case <-hctx.Done():
	case <-time.After(30 * time.Second):
		close(gate)
		t.Fatal("the handler's context did not end while its lease could not be extended")
	}
	var back time.Time
	if err := direct.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&back); err != nil {
		t.Fatal(err)
	}
	p.Heal()

	// The store is back and the key still belongs to the running handler: a
	// heartbeat extends its lease again.
	extended := false
	for deadline := time.Now().Add(10 * time.Second); !extended && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if err := direct.QueryRow(context.Background(), `SELECT coalesce(bool_or(updated_at > $1 AND epoch = 1), false)
  FROM pgfence.idempotency_keys WHERE key = 'back' AND status = 'in_progress'`, back).Scan(&extended); err != nil {
			t.Fatal(err)
		}
	}
	close(gate)
	if !extended {
		t.Error("the lease of the running handler was not extended after the store came back")
	}
	if r := <-first; r.status != http.StatusOK || r.body != "done" {
		t.Errorf("first: %+v", r)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times", n)
	}
}

// TestHTTPMaxBodyBytesWithoutLimit: the largest MaxBodyBytes (math.MaxInt64,
// "no limit") still reads the body: the handler gets it, and another body
// under the same key is refused, not answered with the first one's response.
func TestHTTPMaxBodyBytesWithoutLimit(t *testing.T) {
	t.Parallel()
	f := newHTTPFixture(t, nil, &idempotency.HTTPConfig{MaxBodyBytes: math.MaxInt64})
	first := f.do(t, "POST", "/orders/1", `"nolimit"`, `{"qty":2}`)
	if first.status != http.StatusCreated || !strings.Contains(first.body, `{\"qty\":2}`) {
		t.Fatalf("first: %+v, want 201 from a handler that got the body", first)
	}
	if r := f.do(t, "POST", "/orders/1", `"nolimit"`, `{"qty":3}`); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("another body with the same key: %d %s, want 422", r.status, r.body)
	}
}

// TestHTTPSettleSurvivesLostConnection: the connection that stores the
// handler's answer breaks once. The middleware has the answer and the key,
// so it must store it on another connection; otherwise the key stays in
// progress without a heartbeat, its lease expires and a retry runs the
// handler a second time.
func TestHTTPSettleSurvivesLostConnection(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	p, dbs := throughProxy(t, db)
	mw, err := idempotency.NewMiddleware(newStore(t, nil), dbs["pool"], nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d", runs.Add(1))
	})))
	t.Cleanup(srv.Close)
	post := func() response {
		req, _ := http.NewRequest("POST", srv.URL+"/pay", strings.NewReader("{}"))
		req.Header.Set(idempotency.HeaderKey, `"settle"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return response{resp.StatusCode, resp.Header, string(b)}
	}
	trig := p.CutBefore(faultproxy.SQLContains("idempotency_complete"))
	first := post()
	if !trig.Fired() {
		t.Fatal("the proxy did not cut the completion")
	}
	if first.status != http.StatusCreated || first.body != "run 1" {
		t.Fatalf("first: %+v", first)
	}
	var status string
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT status FROM pgfence.idempotency_keys WHERE key = 'settle'`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "succeeded" {
		t.Errorf("the key is %s after the handler answered, want succeeded", status)
		// What follows once its lease has run out.
		expireLease(t, db.Pool, "settle")
	}
	if r := post(); r.body != first.body || r.header.Get(idempotency.HeaderReplayed) != "true" {
		t.Errorf("retry: %d %q, want the replay of %q", r.status, r.body, first.body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times", n)
	}
}

// TestHTTPStreamingHandler: a streaming handler checks that its writer can
// flush (the usual w.(http.Flusher)) and answers 500 when it cannot. Behind
// the middleware it must still stream, and a flush before any write sends
// (and stores) the implicit 200.
func TestHTTPStreamingHandler(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	mw, err := idempotency.NewMiddleware(newStore(t, nil), pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		f, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "streaming unsupported", http.StatusInternalServerError)
			return
		}
		f.Flush()
		fmt.Fprint(w, "a")
		f.Flush()
		fmt.Fprint(w, "b")
	})))
	t.Cleanup(srv.Close)
	post := func() response {
		req, _ := http.NewRequest("POST", srv.URL+"/events", strings.NewReader("{}"))
		req.Header.Set(idempotency.HeaderKey, `"stream"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return response{resp.StatusCode, resp.Header, string(b)}
	}
	if r := post(); r.status != http.StatusOK || r.body != "ab" {
		t.Fatalf("first: %d %q, want the streamed 200 \"ab\"", r.status, r.body)
	}
	if r := post(); r.status != http.StatusOK || r.body != "ab" || r.header.Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %q, want the replay", r.status, r.body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
}

// TestHTTPReplayKeepsContentEncoding: a handler (or a compressing
// middleware inside this one) that answers with an encoded body. The body
// is stored as sent, so a replay must say how it is encoded; without
// Content-Encoding the client gets the compressed bytes as the body.
func TestHTTPReplayKeepsContentEncoding(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	mw, err := idempotency.NewMiddleware(newStore(t, nil), pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		zw := gzip.NewWriter(w)
		fmt.Fprint(zw, `{"order":1}`)
		_ = zw.Close()
	})))
	t.Cleanup(srv.Close)
	post := func() response {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader("{}"))
		req.Header.Set(idempotency.HeaderKey, `"gz"`)
		resp, err := srv.Client().Do(req) // asks for gzip and decodes it
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return response{resp.StatusCode, resp.Header, string(b)}
	}
	if r := post(); r.status != http.StatusCreated || r.body != `{"order":1}` {
		t.Fatalf("first: %d %q", r.status, r.body)
	}
	if r := post(); r.status != http.StatusCreated || r.body != `{"order":1}` || r.header.Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("replay: %d %q, want the decoded body of the first answer", r.status, r.body)
	}
}
