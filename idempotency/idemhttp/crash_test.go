package idemhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The crash test runs the order API behind the middleware in a worker
// process and kills it with SIGKILL at one point of a request:
//
//	before-commit  the handler has inserted the order; its transaction is
//	               open (atomic: the key's transaction; leased: the phase's
//	               transaction with AdvanceTx)
//	after-commit   atomic: the COMMIT of the order and its response ran on
//	               the server, its reply never reached the worker; leased:
//	               the phase committed, the response is not stored yet
//	before-write   the response is about to be written to the client
//
// Then another worker process serves the retries: one at once, and one
// after every lease has been moved into the past (the database clock
// decides, so rows are backdated instead of sleeping). Whatever the point,
// there is one order in the end and every retry ends with its response.
const (
	crashWorkerKind = "order-server"
	crashHeader     = "X-Crash-At"
	crashLease      = 2 * time.Second
)

var crashPoints = []string{"before-commit", "after-commit", "before-write"}

func TestCrash(t *testing.T) {
	for _, mode := range modes {
		for _, point := range crashPoints {
			t.Run(modeName(mode)+"/"+point, func(t *testing.T) {
				t.Parallel()
				testCrash(t, mode, point)
			})
		}
	}
}

func testCrash(t *testing.T, mode idemhttp.Mode, point string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	createOrders(t, db.Pool)
	proxy, proxied := proxyURL(t, db.URL)

	crashing := workerproc.Start(t, crashWorkerKind, nil)
	if mode == idemhttp.ModeAtomic && point == "after-commit" {
		// One connection, whose statements a first request prepares: the
		// result and COMMIT then leave in one pipeline, without waiting
		// for a reply the proxy will hold.
		proxied += "&pool_max_conns=1"
	}
	addr := startOrderServer(ctx, t, crashing, proxied, mode)
	if r, err := postOrder(ctx, addr, "warm-up"); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("warm-up: %+v, %v", r, err)
	}
	sent := make(chan error, 1)
	go func() {
		_, err := postOrder(ctx, addr, point)
		sent <- err
	}()

	switch {
	case mode == idemhttp.ModeAtomic && point == "after-commit":
		// Hold every reply to the worker, let the handler return, and kill
		// the worker once its COMMIT has run on the server.
		await(ctx, t, crashing, "handler-done")
		proxy.SetHold(faultproxy.ServerToClient, true)
		if err := crashing.Call(ctx, "continue", crashArgs{Point: "handler-done"}, nil); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the COMMIT on the server", func() bool { return statusOf(t, db.Pool, "order-9") == "succeeded" })
	default:
		await(ctx, t, crashing, point)
	}
	if err := crashing.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err == nil {
		t.Fatalf("the client of the killed server got an answer")
	}
	proxy.Heal()
	// The kill came where it was meant to: before the order committed, or
	// after (atomic: with its stored response; leased: with the key still
	// in progress, its response not stored yet).
	orders, status := countOrders(t, db.Pool), statusOf(t, db.Pool, "order-9")
	wantOrders, wantStatus := 1, "in_progress"
	switch {
	case point == "before-commit" && mode == idemhttp.ModeAtomic:
		wantOrders, wantStatus = 0, ""
	case point == "before-commit":
		wantOrders = 0
	case mode == idemhttp.ModeAtomic:
		wantStatus = "succeeded"
	}
	if orders != wantOrders || status != wantStatus {
		t.Fatalf("after the crash: %d orders, key %q; want %d, %q", orders, status, wantOrders, wantStatus)
	}

	retries := workerproc.Start(t, crashWorkerKind, nil)
	raddr := startOrderServer(ctx, t, retries, db.URL, mode)
	var answers []response
	retry := func(what string) {
		r, err := postOrder(ctx, raddr, "")
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %d %s (replayed %v)", what, r.status, r.body, r.replayed())
		switch r.status {
		case http.StatusCreated:
			answers = append(answers, r)
		case http.StatusConflict:
			// Only a leased key whose owner's lease is still live is in
			// progress; the retry after the lease must answer.
			if mode != idemhttp.ModeLeased || r.header.Get("Retry-After") == "" {
				t.Fatalf("%s: %+v", what, r)
			}
		default:
			t.Fatalf("%s: %+v, want 201 (or 409 with Retry-After while a lease is live)", what, r)
		}
	}
	retry("immediate retry")
	moved := expireLeases(t, db.Pool)
	if mode == idemhttp.ModeAtomic && moved != 0 {
		t.Errorf("the atomic mode left %d keys in progress", moved)
	}
	retry("retry after the lease")
	expireLeases(t, db.Pool)
	retry("another retry")

	var id int64
	if err := db.Pool.QueryRow(ctx, `SELECT min(id) FROM orders`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if n := countOrders(t, db.Pool); n != 1 {
		t.Errorf("%d orders for one Idempotency-Key, want 1", n)
	}
	want := fmt.Sprintf(`{"order":%d}`, id)
	if len(answers) < 2 {
		t.Fatalf("%d answers, want at least 2", len(answers))
	}
	for i, r := range answers {
		if r.body != want {
			t.Errorf("answer %d: %s, want the response of the one order %s", i, r.body, want)
		}
		if i > 0 && !r.replayed() {
			t.Errorf("answer %d was not a replay", i)
		}
	}
	if s := statusOf(t, db.Pool, "order-9"); s != "succeeded" {
		t.Errorf("key %q in the end, want succeeded", s)
	}
}

type crashArgs struct {
	URL   string        `json:"url,omitempty"`
	Mode  idemhttp.Mode `json:"mode,omitempty"`
	Point string        `json:"point,omitempty"`
}

func startOrderServer(ctx context.Context, t *testing.T, w *workerproc.Worker, url string, mode idemhttp.Mode) string {
	t.Helper()
	var addr string
	if err := w.Call(ctx, "start", crashArgs{URL: url, Mode: mode}, &addr); err != nil {
		t.Fatal(err)
	}
	return addr
}

func await(ctx context.Context, t *testing.T, w *workerproc.Worker, point string) {
	t.Helper()
	if err := w.Call(ctx, "await", crashArgs{Point: point}, nil); err != nil {
		t.Fatalf("await %s: %v", point, err)
	}
}

// postOrder sends the one order request of the crash test (the same key,
// principal and body every time), asking the server to stop at point.
func postOrder(ctx context.Context, addr, point string) (response, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/orders", strings.NewReader(`{"sku":"a-1","qty":1}`))
	if err != nil {
		return response{}, err
	}
	key := `"order-9"`
	if point == "warm-up" {
		key = `"warm-up"`
	}
	req.Header.Set(idemhttp.HeaderKey, key)
	req.Header.Set("X-User", "alice")
	req.Header.Set("Content-Type", "application/json")
	if point != "" {
		req.Header.Set(crashHeader, point)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}, err
}

// orderServer is the worker side: the order API behind the middleware,
// which stops at the point a request names in X-Crash-At until the worker
// is killed (or, for handler-done, until the parent says continue).
type orderServer struct {
	mu     sync.Mutex
	points map[string]chan struct{} // closed when a request reaches the point
	conts  map[string]chan struct{} // closed by "continue"
	pool   *pgxpool.Pool
	mode   idemhttp.Mode
	calls  atomic.Int64
}

var crashServer = &orderServer{points: map[string]chan struct{}{}, conts: map[string]chan struct{}{}}

func (s *orderServer) point(name string, m map[string]chan struct{}) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := m[name]
	if ch == nil {
		ch = make(chan struct{})
		m[name] = ch
	}
	return ch
}

// reach marks point as reached and, unless the parent sends continue for
// it, blocks until the process is killed.
func (s *orderServer) reach(point string) {
	s.mu.Lock()
	ch := s.points[point]
	if ch == nil {
		ch = make(chan struct{})
		s.points[point] = ch
	}
	select {
	case <-ch:
	default:
		close(ch)
	}
	s.mu.Unlock()
	<-s.point(point, s.conts)
}

func serveCrashWorker(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	var args crashArgs
	if err := json.Unmarshal(raw, &args); err != nil {
		return nil, err
	}
	s := crashServer
	switch op {
	case "start":
		return s.start(ctx, args)
	case "await":
		select {
		case <-s.point(args.Point, s.points):
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	case "continue":
		close(s.point(args.Point, s.conts))
		return nil, nil
	}
	return nil, fmt.Errorf("unknown op %q", op)
}

func (s *orderServer) start(ctx context.Context, args crashArgs) (string, error) {
	pool, err := pgxpool.New(ctx, args.URL)
	if err != nil {
		return "", err
	}
	s.pool, s.mode = pool, args.Mode
	store, err := idempotency.NewStore(&idempotency.Config{Lease: crashLease})
	if err != nil {
		return "", err
	}
	mw, err := idemhttp.New(store, pool, &idemhttp.Config{Mode: args.Mode, Principal: byUser, Required: true})
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	protected := mw.Wrap(http.HandlerFunc(s.createOrder))
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(crashHeader) == "before-write" {
			w = &stopWriter{ResponseWriter: w, s: s}
		}
		protected.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
		pool.Close()
	}()
	return ln.Addr().String(), nil
}

// createOrder inserts the order: in ModeAtomic through the key's
// transaction, in ModeLeased as the first phase (its transaction records
// the recovery point with AdvanceTx), resumed from the recovery point after
// a takeover.
func (s *orderServer) createOrder(w http.ResponseWriter, r *http.Request) {
	s.calls.Add(1)
	ctx := r.Context()
	point := r.Header.Get(crashHeader)
	body, _ := io.ReadAll(r.Body)
	var id int64
	if point == "warm-up" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if s.mode == idemhttp.ModeAtomic {
		// A handler written for both ways: through the key's transaction
		// when there is one, else on its own.
		var db interface {
			QueryRow(context.Context, string, ...any) pgx.Row
		} = s.pool
		if tx := idemhttp.Tx(ctx); tx != nil {
			db = tx
		}
		if err := db.QueryRow(ctx, `INSERT INTO orders (body) VALUES ($1) RETURNING id`, string(body)).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		switch point {
		case "before-commit":
			s.reach(point)
		case "after-commit":
			s.reach("handler-done") // the parent holds the replies, then lets the handler return
		}
	} else {
		a := idemhttp.Attempt(ctx)
		if a.RecoveryPoint() == "created" {
			id, _ = strconv.ParseInt(string(a.RecoveryData()), 10, 64)
		} else {
			tx, err := s.pool.Begin(ctx)
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			err = tx.QueryRow(ctx, `INSERT INTO orders (body) VALUES ($1) RETURNING id`, string(body)).Scan(&id)
			if err == nil {
				err = a.AdvanceTx(ctx, tx, "created", []byte(strconv.FormatInt(id, 10)))
			}
			if err == nil && point == "before-commit" {
				s.reach(point)
			}
			if err == nil {
				err = tx.Commit(ctx)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			if point == "after-commit" {
				s.reach(point)
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%d}`, id)
}

// stopWriter stops the request as its response is about to be written to
// the client.
type stopWriter struct {
	http.ResponseWriter
	s *orderServer
}

func (w *stopWriter) WriteHeader(code int) {
	w.s.reach("before-write")
	w.ResponseWriter.WriteHeader(code)
}

func (w *stopWriter) Write(p []byte) (int, error) {
	w.s.reach("before-write")
	return w.ResponseWriter.Write(p)
}
