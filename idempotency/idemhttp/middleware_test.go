package idemhttp_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
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
	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestReplay(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		f := newFixture(t, mode, nil, nil)
		first := f.do(t, "POST", "/orders/1", `"k-1"`, `{"qty":2}`)
		if first.status != http.StatusCreated || first.replayed() {
			t.Fatalf("first: %+v", first)
		}
		again := f.do(t, "POST", "/orders/1", `"k-1"`, `{"qty":2}`)
		if again.status != http.StatusCreated || again.body != first.body || !again.replayed() {
			t.Fatalf("replay: %+v, first %+v", again, first)
		}
		if again.header.Get("Location") != "/orders/1" || again.header.Get("Content-Type") != "application/json" {
			t.Fatalf("allow-listed headers not replayed: %v", again.header)
		}
		if again.header.Get("Set-Cookie") != "" || again.header.Get("X-Request-Id") != "" {
			t.Fatalf("headers outside the allow-list replayed: %v", again.header)
		}
		// Nor are they stored.
		var stored int
		if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgfence.idempotency_keys
			WHERE position('session=secret' in convert_from(result, 'UTF8')) > 0 OR position('X-Request-Id' in convert_from(result, 'UTF8')) > 0`).Scan(&stored); err != nil || stored != 0 {
			t.Fatalf("headers outside the allow-list stored: %d rows, %v", stored, err)
		}
		// The live answer carries the handler's own headers.
		if first.header.Get("Set-Cookie") == "" || first.header.Get("X-Request-Id") != "1" {
			t.Fatalf("the first answer lost the handler's headers: %v", first.header)
		}
		if n := countOrders(t, f.pool); n != 1 || f.api.calls.Load() != 1 {
			t.Fatalf("%d orders, handler ran %d times", n, f.api.calls.Load())
		}
		// The handler saw the whole body although the middleware read it.
		if !strings.Contains(first.body, `{\"qty\":2}`) {
			t.Fatalf("handler did not get the body: %s", first.body)
		}
		// A bare token is accepted as the same key.
		if r := f.do(t, "POST", "/orders/1", `k-1`, `{"qty":2}`); !r.replayed() {
			t.Fatalf("bare token: %+v", r)
		}
		// GET is not covered: it runs every time.
		f.do(t, "GET", "/orders/1", `"k-1"`, "")
		f.do(t, "GET", "/orders/1", `"k-1"`, "")
		if n := f.api.calls.Load(); n != 3 {
			t.Fatalf("GET calls: handler ran %d times, want 3", n)
		}
	})
}

// TestBadKeys: every malformed Idempotency-Key gets 400 with a problem
// document that says what is wrong, before the handler runs.
func TestBadKeys(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		f := newFixture(t, mode, nil, &idemhttp.Config{Principal: byUser, Required: true, MaxBodyBytes: 16})
		for _, c := range []struct{ name, key, detail string }{
			{"missing", "", "This operation requires an Idempotency-Key header."},
			{"unterminated", `"abc`, `the key must be a quoted string (\"...\") of printable ASCII`},
			{"space", `a b`, `the key must be a quoted string (\"...\") of printable ASCII`},
			{"inner quote", `"a"b"`, "unescaped quote inside the key"},
			{"bad escape", `"a\nb"`, `a quoted key may escape only \" and \\`},
			{"non-ascii", `"schlüssel"`, "the key must be printable ASCII"},
			{"too long", `"` + strings.Repeat("x", 255+1) + `"`, "the key must be 1 to 255 characters"},
			{"empty", `""`, "the key must be 1 to 255 characters"},
		} {
			r := f.do(t, "POST", "/orders/1", c.key, "{}")
			if r.status != http.StatusBadRequest || r.header.Get("Content-Type") != "application/problem+json" ||
				!strings.Contains(r.body, `"detail":"`+c.detail+`"`) {
				t.Errorf("%s key: %d %s, want 400 problem saying %q", c.name, r.status, r.body, c.detail)
			}
		}
		if r := f.do(t, "POST", "/orders/1", `"a"`, "{}", idemhttp.HeaderKey, `"a"`, idemhttp.HeaderKey+"2", "x"); r.status != http.StatusCreated {
			t.Errorf("one key: %d, want 201", r.status)
		}
		req := func() response {
			hr, _ := http.NewRequest("POST", f.srv.URL+"/orders/1", strings.NewReader("{}"))
			hr.Header.Add(idemhttp.HeaderKey, `"a"`)
			hr.Header.Add(idemhttp.HeaderKey, `"b"`)
			hr.Header.Set("X-User", "alice")
			resp, err := f.srv.Client().Do(hr)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return response{resp.StatusCode, resp.Header, string(b)}
		}
		if r := req(); r.status != http.StatusBadRequest || !strings.Contains(r.body, "Send exactly one Idempotency-Key header.") {
			t.Errorf("two keys: %d %s, want 400", r.status, r.body)
		}
		if r := f.do(t, "POST", "/orders/1", `"big"`, strings.Repeat("x", 17)); r.status != http.StatusRequestEntityTooLarge {
			t.Errorf("big body: %d, want 413", r.status)
		}
		if n := f.api.calls.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want once (the one valid request)", n)
		}

		optional := newFixture(t, mode, nil, nil)
		if r := optional.do(t, "POST", "/orders/1", "", "{}"); r.status != http.StatusCreated {
			t.Fatalf("no key, not required: %d", r.status)
		}
	})
}

func TestMismatch(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		f := newFixture(t, mode, nil, nil)
		first := f.do(t, "POST", "/orders/1", `"k"`, `{"qty":2}`, "Content-Type", "application/json")
		for name, r := range map[string]response{
			"other body":  f.do(t, "POST", "/orders/1", `"k"`, `{"qty":3}`, "Content-Type", "application/json"),
			"other uri":   f.do(t, "POST", "/orders/2", `"k"`, `{"qty":2}`, "Content-Type", "application/json"), // same route pattern
			"other query": f.do(t, "POST", "/orders/1?dry=1", `"k"`, `{"qty":2}`, "Content-Type", "application/json"),
			"other type":  f.do(t, "POST", "/orders/1", `"k"`, `{"qty":2}`, "Content-Type", "text/plain"),
		} {
			if r.status != http.StatusUnprocessableEntity || strings.Contains(r.body, first.body) {
				t.Errorf("%s: %d %s, want 422 without the stored response", name, r.status, r.body)
			}
		}
		if n := countOrders(t, f.pool); n != 1 {
			t.Fatalf("%d orders", n)
		}
	})
}

// TestReorderedJSON: the same JSON object with its members in another order,
// other white space, numbers in another form and another spelling of the
// media type is the same request and replays; a different JSON value under
// the same key is refused with 422. A body that is not JSON must match byte
// for byte.
func TestReorderedJSON(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		f := newFixture(t, mode, nil, nil)
		const ct = "application/json"
		first := f.do(t, "POST", "/orders/1", `"j"`, `{"sku":"a-1","qty":2,"opts":{"gift":true,"note":"é"}}`, "Content-Type", ct)
		if first.status != http.StatusCreated {
			t.Fatalf("first: %+v", first)
		}
		for _, c := range []struct{ body, ct string }{
			{`{"qty":2,"opts":{"note":"é","gift":true},"sku":"a-1"}`, ct},
			{"{\n  \"opts\" : { \"gift\" : true , \"note\" : \"\\u00e9\" },\n  \"qty\" : 2.0,\n  \"sku\" : \"a-1\"\n}\n", ct},
			{`{"sku":"a-1","qty":20e-1,"opts":{"gift":true,"note":"é"}}`, "Application/JSON; charset=utf-8"},
		} {
			r := f.do(t, "POST", "/orders/1", `"j"`, c.body, "Content-Type", c.ct)
			if r.status != http.StatusCreated || r.body != first.body || !r.replayed() {
				t.Errorf("same object as %s (%s): %d %s replayed=%v, want the replay of %s", c.body, c.ct, r.status, r.body, r.replayed(), first.body)
			}
		}
		for _, body := range []string{
			`{"sku":"a-1","qty":3,"opts":{"gift":true,"note":"é"}}`,
			`{"sku":"a-1","qty":2,"opts":{"gift":false,"note":"é"}}`,
			`{"sku":"a-1","qty":2,"opts":{"gift":true,"note":"é"},"extra":null}`,
			`{"sku":"a-1","qty":2,"qty":2,"opts":{"gift":true,"note":"é"}}`, // a member twice is not canonical JSON
		} {
			if r := f.do(t, "POST", "/orders/1", `"j"`, body, "Content-Type", ct); r.status != http.StatusUnprocessableEntity {
				t.Errorf("another value %s: %d %s, want 422", body, r.status, r.body)
			}
		}
		// Not JSON: only the same bytes are the same request.
		if r := f.do(t, "POST", "/orders/1", `"t"`, "a=1&b=2", "Content-Type", "application/x-www-form-urlencoded"); r.status != http.StatusCreated {
			t.Fatalf("form: %+v", r)
		}
		if r := f.do(t, "POST", "/orders/1", `"t"`, "b=2&a=1", "Content-Type", "application/x-www-form-urlencoded"); r.status != http.StatusUnprocessableEntity {
			t.Errorf("reordered form: %d, want 422", r.status)
		}
		if n := countOrders(t, f.pool); n != 2 {
			t.Fatalf("%d orders, want 2", n)
		}
	})
}

// TestCanonicalBodyHook: a CanonicalBody that keeps only the fields that
// name the intent makes requests that differ elsewhere the same request; an
// error from it refuses the request with 400.
func TestCanonicalBodyHook(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		f := newFixture(t, mode, nil, &idemhttp.Config{Principal: byUser,
			CanonicalBody: func(r *http.Request, body []byte) ([]byte, error) {
				sku, _, ok := strings.Cut(string(body), ";")
				if !ok {
					return nil, errors.New("no sku")
				}
				return []byte(sku), nil
			}})
		first := f.do(t, "POST", "/orders/1", `"h"`, "sku-1;sent at 10:00")
		again := f.do(t, "POST", "/orders/1", `"h"`, "sku-1;sent at 10:05")
		if first.status != http.StatusCreated || again.body != first.body || !again.replayed() {
			t.Fatalf("first %+v, again %+v; want the replay", first, again)
		}
		if r := f.do(t, "POST", "/orders/1", `"h"`, "sku-2;sent at 10:06"); r.status != http.StatusUnprocessableEntity {
			t.Errorf("another sku: %d, want 422", r.status)
		}
		if r := f.do(t, "POST", "/orders/1", `"h2"`, "no separator"); r.status != http.StatusBadRequest {
			t.Errorf("hook error: %d %s, want 400", r.status, r.body)
		}
		if n := countOrders(t, f.pool); n != 1 {
			t.Fatalf("%d orders", n)
		}
	})
}

// TestPrincipalRequired: a middleware without a principal would replay one
// caller's response to any other caller who sends the same key and body.
// It is refused unless keys are shared explicitly.
func TestPrincipalRequired(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	store := newStore(t, nil)
	for name, cfg := range map[string]*idemhttp.Config{
		"nil config":   nil,
		"zero config":  {},
		"leased":       {Mode: idemhttp.ModeLeased, Required: true},
		"both options": {Principal: byUser, KeysSharedByAllCallers: true},
	} {
		mw, err := idemhttp.New(store, pool, cfg)
		if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "Config.Principal") || mw != nil {
			t.Errorf("%s: %v, %v; want ErrInvalid naming Config.Principal", name, mw, err)
		}
	}
	for name, cfg := range map[string]*idemhttp.Config{
		"mode":                     {Principal: byUser, Mode: 7},
		"body":                     {Principal: byUser, MaxBodyBytes: -1},
		"response":                 {Principal: byUser, MaxResponseBytes: idempotency.MaxResultBytes},
		"heartbeat":                {Principal: byUser, Heartbeat: -time.Second},
		"heartbeat max":            {Principal: byUser, Heartbeat: idempotency.LeaseDefault},
		"heartbeat near the lease": {Principal: byUser, Heartbeat: idempotency.LeaseDefault/2 + time.Millisecond},
		"heartbeat tiny":           {Principal: byUser, Heartbeat: time.Microsecond},
	} {
		if _, err := idemhttp.New(store, pool, cfg); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "Config.") {
			t.Errorf("%s: %v; want ErrInvalid naming the field", name, err)
		}
	}
	if _, err := idemhttp.New(store, pool, &idemhttp.Config{KeysSharedByAllCallers: true}); err != nil {
		t.Errorf("shared keys, explicitly: %v", err)
	}
	// Handles that would fail every covered request later.
	ok := &idemhttp.Config{Principal: byUser}
	if _, err := idemhttp.New(store, (*pgxpool.Pool)(nil), ok); !errors.Is(err, idempotency.ErrInvalid) {
		t.Errorf("a nil *pgxpool.Pool: %v, want ErrInvalid", err)
	}
	if _, err := idemhttp.New(&idempotency.Store{}, pool, ok); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "NewStore") {
		t.Errorf("a zero Store: %v, want ErrInvalid naming NewStore", err)
	}
	// One connection or one transaction cannot serve concurrent requests.
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := idemhttp.New(store, conn.Conn(), ok); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "*pgxpool.Pool") {
		t.Errorf("a *pgx.Conn: %v, want ErrInvalid asking for a pool", err)
	}
	if _, err := idemhttp.New(store, conn, ok); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "*pgxpool.Conn") {
		t.Errorf("a *pgxpool.Conn: %v, want ErrInvalid naming it", err)
	}
	tx, err := conn.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := idemhttp.New(store, tx, ok); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "*pgxpool.Pool") {
		t.Errorf("a pgx.Tx: %v, want ErrInvalid asking for a pool", err)
	}
}

// TestPrincipalsNeverShareResponses: two callers sending the same key and
// body each get their own execution and response, also while the other's is
// in flight; a caller without a principal gets 401 and runs nothing; 401
// and 403 answers are not stored, so a caller refused once and authorized
// later runs the handler instead of getting the refusal replayed.
func TestPrincipalsNeverShareResponses(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		f := newFixture(t, mode, nil, nil)
		a := f.do(t, "POST", "/orders/1", `"same"`, "{}", "X-User", "alice")
		b := f.do(t, "POST", "/orders/1", `"same"`, "{}", "X-User", "bob")
		if a.status != http.StatusCreated || b.status != http.StatusCreated || a.body == b.body || b.replayed() {
			t.Fatalf("alice %+v, bob %+v: principals must not share keys", a, b)
		}
		if r := f.do(t, "POST", "/orders/1", `"same"`, "{}", "X-User", "alice"); r.body != a.body || !r.replayed() {
			t.Fatalf("alice's replay: %+v", r)
		}
		if r := f.do(t, "POST", "/orders/1", `"same"`, "{}", "X-User", "bob"); r.body != b.body || !r.replayed() {
			t.Fatalf("bob's replay: %+v", r)
		}
		if r := f.do(t, "POST", "/orders/1", `"same"`, "{}", "X-User", ""); r.status != http.StatusUnauthorized ||
			r.header.Get("Content-Type") != "application/problem+json" || r.replayed() {
			t.Fatalf("no principal: %+v, want 401", r)
		}
		if n := countOrders(t, f.pool); n != 2 {
			t.Fatalf("%d orders, want 2", n)
		}

		// carol is not allowed yet: the handler answers 403, which is not
		// stored; once allowed, the same request runs.
		f.api.status.Store(http.StatusForbidden)
		if r := f.do(t, "POST", "/orders/1", `"carol-1"`, "{}", "X-User", "carol"); r.status != http.StatusForbidden {
			t.Fatalf("carol refused: %+v", r)
		}
		f.api.status.Store(http.StatusUnauthorized)
		if r := f.do(t, "POST", "/orders/1", `"carol-1"`, "{}", "X-User", "carol"); r.status != http.StatusUnauthorized || r.replayed() {
			t.Fatalf("carol unauthenticated: %+v", r)
		}
		f.api.status.Store(0)
		if r := f.do(t, "POST", "/orders/1", `"carol-1"`, "{}", "X-User", "carol"); r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("carol allowed: %+v, want a fresh 201", r)
		}
	})
}

// TestPrincipalsInFlight: bob's request under alice's key and body runs at
// once while alice's is still in flight: different principals never wait
// for or answer each other.
func TestPrincipalsInFlight(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		f := newFixture(t, mode, nil, nil)
		gate := make(chan struct{})
		var alice atomic.Bool
		h := f.api
		slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-User") == "alice" {
				alice.Store(true)
				<-gate
			}
			h.ServeHTTP(w, r)
		})
		mw := newMiddleware(t, newStore(t, nil), f.pool, &idemhttp.Config{Mode: mode, Principal: byUser})
		srv := httptest.NewServer(mw.Wrap(slow))
		t.Cleanup(srv.Close)
		first := make(chan response, 1)
		go func() { first <- send(t, srv, "POST", "/o", `"k"`, "{}", "X-User", "alice") }()
		waitFor(t, "alice's handler", alice.Load)
		b := send(t, srv, "POST", "/o", `"k"`, "{}", "X-User", "bob")
		close(gate)
		a := <-first
		if a.status != http.StatusCreated || b.status != http.StatusCreated || a.body == b.body || a.replayed() || b.replayed() {
			t.Fatalf("alice %+v, bob %+v", a, b)
		}
	})
}

func TestStoresFinalAnswersOnly(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		f := newFixture(t, mode, nil, nil)
		for _, status := range []int{http.StatusInternalServerError, http.StatusTooManyRequests, http.StatusServiceUnavailable,
			http.StatusConflict, http.StatusRequestTimeout} {
			f.api.status.Store(int64(status))
			if r := f.do(t, "POST", "/orders/1", `"retry-me"`, "{}"); r.status != status {
				t.Fatalf("got %d, want %d", r.status, status)
			}
		}
		f.api.status.Store(0)
		if r := f.do(t, "POST", "/orders/1", `"retry-me"`, "{}"); r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("after transient answers: %+v, want a fresh 201", r)
		}
		if n := f.api.calls.Load(); n != 6 {
			t.Fatalf("handler ran %d times, want 6", n)
		}
		// In the atomic mode an answer that is not stored takes the
		// handler's writes with it: the retry starts from nothing.
		want := 6
		if mode == idemhttp.ModeAtomic {
			want = 1
		}
		if n := countOrders(t, f.pool); n != want {
			t.Fatalf("%d orders, want %d", n, want)
		}

		// A permanent 4xx is stored and replayed.
		f.api.status.Store(http.StatusBadRequest)
		first := f.do(t, "POST", "/orders/1", `"bad"`, "{}")
		f.api.status.Store(0)
		again := f.do(t, "POST", "/orders/1", `"bad"`, "{}")
		if again.status != http.StatusBadRequest || again.body != first.body || !again.replayed() {
			t.Fatalf("4xx replay: %+v", again)
		}
	})
}

// TestPanicLeavesKeyFree: a handler that panics stores nothing; in the
// atomic mode the writes it made before the panic roll back. The retry runs
// the handler.
func TestPanicLeavesKeyFree(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		pool := pgfencetest.NewPool(t)
		createOrders(t, pool)
		api := &orderAPI{pool: pool}
		mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Mode: mode, Principal: byUser})
		var calls atomic.Int64
		h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 1 {
				if tx := idemhttp.Tx(r.Context()); tx != nil {
					if _, err := tx.Exec(r.Context(), `INSERT INTO orders (body) VALUES ('half')`); err != nil {
						t.Error(err)
					}
				}
				panic("boom")
			}
			api.ServeHTTP(w, r)
		}))
		serve := func() (rec *httptest.ResponseRecorder, panicked bool) {
			defer func() { panicked = recover() != nil }()
			rec = httptest.NewRecorder()
			req := httptest.NewRequest("POST", "/jobs", nil)
			req.Header.Set(idemhttp.HeaderKey, `"job-1"`)
			req.Header.Set("X-User", "alice")
			h.ServeHTTP(rec, req)
			return rec, false
		}
		if _, panicked := serve(); !panicked {
			t.Fatal("panic swallowed")
		}
		if s := keyStatus(t, pool); s != "" && mode == idemhttp.ModeAtomic {
			t.Fatalf("key %q after the panic, want none", s)
		}
		if rec, _ := serve(); rec.Code != http.StatusCreated || calls.Load() != 2 {
			t.Fatalf("after panic: %d, %d calls; want the key free and the handler run", rec.Code, calls.Load())
		}
		if n := countOrders(t, pool); n != 1 {
			t.Fatalf("%d orders, want 1 (the panicked handler's write rolled back)", n)
		}
	})
}

// TestConcurrentDuplicates: 16 clients send the same request at once while
// the handler is slow; exactly one execution, the others get 409 with
// Retry-After (in the atomic mode after waiting at most WaitTimeout for the
// first), and after the first finishes every retry gets the same response.
func TestConcurrentDuplicates(t *testing.T) {
	verifyNoLeaks(t)
	for _, mode := range modes {
		t.Run(modeName(mode), func(t *testing.T) {
			f := newFixture(t, mode, &idempotency.Config{WaitTimeout: 20 * time.Millisecond}, nil)
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
			waitFor(t, "the duplicates' answers", func() bool { return answered.Load() >= n-1 })
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
				if r := f.do(t, "POST", "/orders/7", `"dup"`, `{"qty":1}`); r.status != http.StatusCreated || r.body != createdBody || !r.replayed() {
					t.Fatalf("retry after completion: %+v", r)
				}
			}
			if calls := f.api.calls.Load(); calls != 1 || countOrders(t, f.pool) != 1 {
				t.Fatalf("handler ran %d times, %d orders", calls, countOrders(t, f.pool))
			}
			f.srv.Close()
			f.srv.Client().CloseIdleConnections()
			f.pool.Close()
		})
	}
}

// TestAtomicDuplicateWaits: in the atomic mode a duplicate that arrives
// while the first request's transaction is open waits for it (within
// WaitTimeout) and gets its response when it commits: no 409, no second
// execution.
func TestAtomicDuplicateWaits(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idemhttp.ModeAtomic, &idempotency.Config{WaitTimeout: time.Minute}, nil)
	f.api.gate = make(chan struct{})
	first := make(chan response, 1)
	go func() { first <- f.do(t, "POST", "/orders/1", `"w"`, "{}") }()
	waitFor(t, "the first handler", func() bool { return f.api.calls.Load() == 1 })
	second := make(chan response, 1)
	go func() { second <- f.do(t, "POST", "/orders/1", `"w"`, "{}") }()
	waitFor(t, "the duplicate to wait for the first", func() bool { return lockWaiters(t, f.pool) == 1 })
	close(f.api.gate)
	a, b := <-first, <-second
	if a.status != http.StatusCreated || a.replayed() || b.status != http.StatusCreated || b.body != a.body || !b.replayed() {
		t.Fatalf("first %+v, duplicate %+v; want one 201 and its replay", a, b)
	}
	if n := countOrders(t, f.pool); n != 1 || f.api.calls.Load() != 1 {
		t.Fatalf("%d orders, %d calls", n, f.api.calls.Load())
	}
}

// TestAtomicHandlerCannotCommitEarly: a handler that commits the key's
// transaction itself would make its writes durable without a stored
// response. The database refuses that COMMIT (the claim must be completed
// in its transaction); the client gets 500 and nothing is kept.
func TestAtomicHandlerCannotCommitEarly(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createOrders(t, pool)
	mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Principal: byUser})
	var calls atomic.Int64
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		tx := idemhttp.Tx(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO orders (body) VALUES ('x')`); err != nil {
			t.Error(err)
		}
		err := tx.Commit(r.Context())
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, err != nil)
	})))
	t.Cleanup(srv.Close)
	r := send(t, srv, "POST", "/o", `"early"`, "{}")
	if r.status != http.StatusInternalServerError {
		t.Fatalf("early commit: %+v, want 500", r)
	}
	if n := countOrders(t, pool); n != 0 || keyStatus(t, pool) != "" {
		t.Fatalf("%d orders, key %q; want nothing kept", n, keyStatus(t, pool))
	}
}

// TestAtomicResponseTooLarge: the atomic mode buffers the response until
// the COMMIT; a handler that writes more than MaxResponseBytes gets an
// error from Write, its writes roll back, and the client gets 500.
func TestAtomicResponseTooLarge(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	createOrders(t, pool)
	mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Principal: byUser, MaxResponseBytes: 10})
	var writeErr atomic.Value
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), `INSERT INTO orders (body) VALUES ('x')`); err != nil {
			t.Error(err)
		}
		if _, err := io.WriteString(w, "0123456789abc"); err != nil {
			writeErr.Store(err)
		}
	})))
	t.Cleanup(srv.Close)
	if r := send(t, srv, "POST", "/o", `"big"`, "{}"); r.status != http.StatusInternalServerError {
		t.Fatalf("%+v, want 500", r)
	}
	if writeErr.Load() == nil {
		t.Error("Write did not report the overflow")
	}
	if n := countOrders(t, pool); n != 0 || keyStatus(t, pool) != "" {
		t.Fatalf("%d orders, key %q; want nothing kept", n, keyStatus(t, pool))
	}
}

// TestAtomicCommitReplyLost: the connection breaks after the response and
// COMMIT were sent, dropping the server's answer. The client gets 503 with
// Retry-After (the outcome is unknown); its retry replays the committed
// response; one order.
func TestAtomicCommitReplyLost(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	createOrders(t, db.Pool)
	p, pool := throughProxy(t, db)
	api := &orderAPI{pool: pool}
	srv := httptest.NewServer(newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Principal: byUser}).Wrap(api))
	t.Cleanup(srv.Close)
	trig := p.CutAfter(faultproxy.SQLContains("idempotency_complete_atomic"))
	first := send(t, srv, "POST", "/o", `"lost"`, "{}")
	if !trig.Fired() {
		t.Fatalf("the proxy did not cut the commit; first request: %+v", first)
	}
	if first.status != http.StatusServiceUnavailable || first.header.Get("Retry-After") == "" {
		t.Fatalf("first: %+v, want 503 with Retry-After", first)
	}
	again := send(t, srv, "POST", "/o", `"lost"`, "{}")
	if again.status != http.StatusCreated || !again.replayed() || api.calls.Load() != 1 || countOrders(t, db.Pool) != 1 {
		t.Fatalf("retry: %+v, %d calls, %d orders; want the replay of the one order", again, api.calls.Load(), countOrders(t, db.Pool))
	}
}

// TestAtomicStreamingHandlerRefused: the atomic mode cannot stream (nothing
// reaches the client before the COMMIT), so its writer is no http.Flusher;
// a handler that needs one answers as it does without it, and its answer
// (a 500) is not stored.
func TestAtomicStreamingHandlerRefused(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Principal: byUser})
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(http.Flusher); !ok {
			http.Error(w, "streaming unsupported", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "streamed")
	})))
	t.Cleanup(srv.Close)
	if r := send(t, srv, "POST", "/events", `"s"`, "{}"); r.status != http.StatusInternalServerError {
		t.Fatalf("%+v, want the handler's 500", r)
	}
	if s := keyStatus(t, pool); s != "" {
		t.Fatalf("key %q, want none", s)
	}
}

// TestLeasedLostLeaseCancelsHandler: a handler that outlives its lease (a
// pause) is cancelled once a retry took the key over, and its late answer
// is not stored.
func TestLeasedLostLeaseCancelsHandler(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idemhttp.ModeLeased, &idempotency.Config{Lease: time.Hour}, &idemhttp.Config{Principal: byUser, Heartbeat: 50 * time.Millisecond})
	f.api.gate = make(chan struct{}) // the first call blocks until its context ends
	first := make(chan response, 1)
	go func() { first <- f.do(t, "POST", "/orders/1", `"slow"`, "{}") }()
	waitFor(t, "the first handler", func() bool { return f.api.calls.Load() > 0 })
	// A retry takes the key over once the lease expired (database clock). A
	// heartbeat of the first may extend the lease between the backdating and
	// the claim, so backdate again while the retry gets 409.
	second := make(chan response, 1)
	go func() {
		for {
			expireLeases(t, f.pool)
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

// TestPathsAndPrincipalsThatAreNotText: a decoded path or a principal may
// hold NUL or invalid UTF-8 (POST /a%00b), which PostgreSQL cannot store as
// text. Such a scope is kept as its hash, so the request is protected like
// any other instead of failing with 500, and different routes and
// principals still never meet. Scopes of ordinary text keep their form, so
// stored keys stay valid across an upgrade.
func TestPathsAndPrincipalsThatAreNotText(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		var logged strings.Builder
		var logMu sync.Mutex
		logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			logMu.Lock()
			defer logMu.Unlock()
			return logged.Write(p)
		}), &slog.HandlerOptions{Level: slog.LevelWarn}))
		pool := pgfencetest.NewPool(t)
		createOrders(t, pool)
		api := &orderAPI{pool: pool}
		mw := newMiddleware(t, newStore(t, &idempotency.Config{Logger: logger}), pool, &idemhttp.Config{Mode: mode, Logger: logger,
			Principal: func(r *http.Request) string { return r.URL.Query().Get("user") },
		})
		srv := httptest.NewServer(mw.Wrap(api)) // no ServeMux pattern: the route is the decoded path
		t.Cleanup(srv.Close)

		bodies := map[string]string{}
		for _, path := range []string{"/a%00b?user=x", "/a%FFb?user=x", "/p?user=%00", "/p?user=%FF", "/p?user=%FE", "/p?user=x"} {
			first := send(t, srv, "POST", path, `"k"`, "{}")
			if first.status != http.StatusCreated || first.replayed() {
				t.Errorf("POST %s: %d %s, want 201 from the handler", path, first.status, first.body)
				continue
			}
			for other, body := range bodies {
				if body == first.body {
					t.Errorf("POST %s got the response of POST %s: scopes must differ", path, other)
				}
			}
			bodies[path] = first.body
			again := send(t, srv, "POST", path, `"k"`, "{}")
			if again.status != http.StatusCreated || again.body != first.body || !again.replayed() {
				t.Errorf("POST %s again: %d %s, want the replay of %s", path, again.status, again.body, first.body)
			}
		}
		if n := api.calls.Load(); n != int64(len(bodies)) {
			t.Errorf("handler ran %d times for %d distinct requests", n, len(bodies))
		}
		logMu.Lock()
		if logged.Len() > 0 {
			t.Errorf("the middleware logged warnings or errors:\n%s", logged.String())
		}
		logMu.Unlock()
		// An ordinary path and principal keep the scope they always had.
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pgfence.idempotency_keys WHERE scope = 'http:7:POST /p:x' AND key = 'k'`).Scan(&n); err != nil || n != 1 {
			t.Errorf("scope of POST /p by x: %d rows, %v", n, err)
		}
	})
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// TestLeasedClientGoneKeepsLease: a client that gives up does not end the
// lease of the handler it started. net/http cancels the request's context
// when the client disconnects, but the handler may still be inside a
// downstream call that ignores it; the key stays in progress until the
// handler returns, a retry meanwhile gets 409 instead of running the
// handler a second time, and the first handler's answer is stored and
// replayed.
func TestLeasedClientGoneKeepsLease(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	mw := newMiddleware(t, newStore(t, &idempotency.Config{Lease: 600 * time.Millisecond}), pool,
		&idemhttp.Config{Mode: idemhttp.ModeLeased, Principal: byUser})
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
		req.Header.Set(idemhttp.HeaderKey, `"gone"`)
		req.Header.Set("X-User", "alice")
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
	if r.status != http.StatusOK || r.body != "done" || !r.replayed() {
		t.Errorf("retry after the first handler returned: %d %q replayed=%v, want its stored 200 \"done\"", r.status, r.body, r.replayed())
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times for one key", n)
	}
}

// TestLeasedLeaseKeptAfterStoreComesBack: the key store is unreachable for
// longer than the lease while a handler runs. The middleware stops trusting
// the lease and ends the handler's context, but a handler inside a call
// that ignores its context still runs. Once the store is back and nobody
// took the key over, the lease must be extended again until the handler
// returns: otherwise it expires under a running handler and a retry runs it
// a second time.
func TestLeasedLeaseKeptAfterStoreComesBack(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	p, proxied := throughProxy(t, db)
	const lease = 400 * time.Millisecond
	mw := newMiddleware(t, newStore(t, &idempotency.Config{Lease: lease}), proxied,
		&idemhttp.Config{Mode: idemhttp.ModeLeased, Principal: byUser, Heartbeat: lease / 8})
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
	go func() { first <- send(t, srv, "POST", "/pay", `"back"`, "{}") }()
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
	if err := db.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&back); err != nil {
		t.Fatal(err)
	}
	p.Heal()

	// The store is back and the key still belongs to the running handler: a
	// heartbeat extends its lease again.
	extended := false
	for deadline := time.Now().Add(10 * time.Second); !extended && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if err := db.Pool.QueryRow(context.Background(), `SELECT coalesce(bool_or(updated_at > $1 AND epoch = 1), false)
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

// TestMaxBodyBytesWithoutLimit: the largest MaxBodyBytes (math.MaxInt64,
// "no limit") still reads the body: the handler gets it, and another body
// under the same key is refused, not answered with the first one's response.
func TestMaxBodyBytesWithoutLimit(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		f := newFixture(t, mode, nil, &idemhttp.Config{Principal: byUser, MaxBodyBytes: math.MaxInt64})
		first := f.do(t, "POST", "/orders/1", `"nolimit"`, `{"qty":2}`)
		if first.status != http.StatusCreated || !strings.Contains(first.body, `{\"qty\":2}`) {
			t.Fatalf("first: %+v, want 201 from a handler that got the body", first)
		}
		if r := f.do(t, "POST", "/orders/1", `"nolimit"`, `{"qty":3}`); r.status != http.StatusUnprocessableEntity {
			t.Fatalf("another body with the same key: %d %s, want 422", r.status, r.body)
		}
	})
}

// TestLeasedSettleSurvivesLostConnection: the connection that stores the
// handler's answer breaks once. The middleware has the answer and the key,
// so it must store it on another connection; otherwise the key stays in
// progress without a heartbeat, its lease expires and a retry runs the
// handler a second time.
func TestLeasedSettleSurvivesLostConnection(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	p, proxied := throughProxy(t, db)
	mw := newMiddleware(t, newStore(t, nil), proxied, &idemhttp.Config{Mode: idemhttp.ModeLeased, Principal: byUser})
	var runs atomic.Int64
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d", runs.Add(1))
	})))
	t.Cleanup(srv.Close)
	trig := p.CutBefore(faultproxy.SQLContains("idempotency_complete"))
	first := send(t, srv, "POST", "/pay", `"settle"`, "{}")
	if !trig.Fired() {
		t.Fatal("the proxy did not cut the completion")
	}
	if first.status != http.StatusCreated || first.body != "run 1" {
		t.Fatalf("first: %+v", first)
	}
	if s := keyStatus(t, db.Pool); s != "succeeded" {
		t.Errorf("the key is %s after the handler answered, want succeeded", s)
		expireLeases(t, db.Pool) // what follows once its lease has run out
	}
	if r := send(t, srv, "POST", "/pay", `"settle"`, "{}"); r.body != first.body || !r.replayed() {
		t.Errorf("retry: %d %q, want the replay of %q", r.status, r.body, first.body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times", n)
	}
}

// TestLeasedStreamingHandler: a streaming handler checks that its writer
// can flush (the usual w.(http.Flusher)) and answers 500 when it cannot.
// Behind the leased middleware it must still stream, and a flush before any
// write sends (and stores) the implicit 200.
func TestLeasedStreamingHandler(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Mode: idemhttp.ModeLeased, Principal: byUser})
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
	if r := send(t, srv, "POST", "/events", `"stream"`, "{}"); r.status != http.StatusOK || r.body != "ab" {
		t.Fatalf("first: %d %q, want the streamed 200 \"ab\"", r.status, r.body)
	}
	if r := send(t, srv, "POST", "/events", `"stream"`, "{}"); r.status != http.StatusOK || r.body != "ab" || !r.replayed() {
		t.Fatalf("retry: %d %q, want the replay", r.status, r.body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
}

// TestReplayKeepsContentEncoding: a handler (or a compressing middleware
// inside this one) that answers with an encoded body. The body is stored as
// sent, so a replay must say how it is encoded; without Content-Encoding the
// client gets the compressed bytes as the body.
func TestReplayKeepsContentEncoding(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		pool := pgfencetest.NewPool(t)
		mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Mode: mode, Principal: byUser})
		srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusCreated)
			zw := gzip.NewWriter(w)
			fmt.Fprint(zw, `{"order":1}`)
			_ = zw.Close()
		})))
		t.Cleanup(srv.Close)
		if r := send(t, srv, "POST", "/orders", `"gz"`, "{}"); r.status != http.StatusCreated || r.body != `{"order":1}` {
			t.Fatalf("first: %d %q", r.status, r.body)
		}
		if r := send(t, srv, "POST", "/orders", `"gz"`, "{}"); r.status != http.StatusCreated || r.body != `{"order":1}` || !r.replayed() {
			t.Fatalf("replay: %d %q, want the decoded body of the first answer", r.status, r.body)
		}
	})
}

// TestRepeatableReadDefault: a database (or role) whose sessions default
// to REPEATABLE READ. The claims need READ COMMITTED; the middleware must
// not answer every keyed request with 500.
func TestRepeatableReadDefault(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		db := pgfencetest.NewDatabase(t)
		cfg, err := pgxpool.ParseConfig(db.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Mode: mode, Principal: byUser})
		var runs atomic.Int32
		h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
		}))
		for i := range 2 {
			rec := httptest.NewRecorder()
			hreq := httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
			hreq.Header.Set(idemhttp.HeaderKey, `"rr"`)
			hreq.Header.Set("X-User", "alice")
			h.ServeHTTP(rec, hreq)
			if rec.Code != http.StatusCreated {
				t.Fatalf("middleware: %d %s, want the handler's 201", rec.Code, rec.Body)
			}
			// The second is the first's stored answer: still idempotent.
			if replayed := rec.Header().Get(idemhttp.HeaderReplayed) == "true"; replayed != (i == 1) {
				t.Fatalf("request %d: replayed %v", i+1, replayed)
			}
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want once", n)
		}
	})
}

// TestLeasedDerivedKeysPerPrincipal: a handler hands a payment provider the
// key derived from its attempt; two principals sending the same
// Idempotency-Key are two intents and must not derive the same key (the
// provider would answer the second customer's charge with the first one's).
func TestLeasedDerivedKeysPerPrincipal(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Mode: idemhttp.ModeLeased, Principal: byUser})
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, idemhttp.Attempt(r.Context()).DerivedKey("charge"))
	}))
	keys := map[string]string{}
	for _, user := range []string{"alice", "bob"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
		req.Header.Set(idemhttp.HeaderKey, `"1"`)
		req.Header.Set("X-User", user)
		h.ServeHTTP(rec, req)
		keys[user] = rec.Body.String()
	}
	if keys["alice"] == "" || keys["alice"] == keys["bob"] {
		t.Errorf("alice and bob derive %q and %q for the same Idempotency-Key", keys["alice"], keys["bob"])
	}
}

// TestContextAccessors: the handler reaches the transaction in the atomic
// mode and the attempt in the leased mode, never both, and neither without
// a key.
func TestContextAccessors(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		pool := pgfencetest.NewPool(t)
		mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Mode: mode, Principal: byUser})
		srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "tx=%v attempt=%v", idemhttp.Tx(r.Context()) != nil, idemhttp.Attempt(r.Context()) != nil)
		})))
		t.Cleanup(srv.Close)
		want := map[idemhttp.Mode]string{idemhttp.ModeAtomic: "tx=true attempt=false", idemhttp.ModeLeased: "tx=false attempt=true"}[mode]
		if r := send(t, srv, "POST", "/x", `"a"`, "{}"); r.body != want {
			t.Errorf("with a key: %q, want %q", r.body, want)
		}
		if r := send(t, srv, "POST", "/x", "", "{}"); r.body != "tx=false attempt=false" {
			t.Errorf("without a key: %q", r.body)
		}
	})
}

// A response the store refuses to keep (its stored form over
// idempotency.MaxResultBytes, here through a replayed header) is answered
// 500 and rolls the handler's writes back: the key is free at once, and the
// retry runs the handler.
func TestUnstorableResponseRollsBack(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	createOrders(t, pool)
	store := newStore(t, &idempotency.Config{WaitTimeout: 200 * time.Millisecond})
	mw := newMiddleware(t, store, pool, &idemhttp.Config{Principal: byUser, ReplayHeaders: []string{"X-Big"},
		MaxResponseBytes: idempotency.MaxResultBytes / 2})
	var big atomic.Bool
	big.Store(true)
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), `INSERT INTO orders (body) VALUES ('x')`); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if big.Load() {
			w.Header().Set("X-Big", strings.Repeat("h", 6<<20))
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(bytes.Repeat([]byte{'b'}, 8<<20))
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	serve := func() *httptest.ResponseRecorder {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders", strings.NewReader(`{}`))
		r.Header.Set("X-User", "alice")
		r.Header.Set(idemhttp.HeaderKey, `"unstorable"`)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	if rec := serve(); rec.Code != http.StatusInternalServerError {
		t.Fatalf("an answer too large to store: %d, want 500", rec.Code)
	}
	if n := countOrders(t, pool); n != 0 {
		t.Fatalf("%d orders after the refused answer, want 0", n)
	}
	big.Store(false)
	if rec := serve(); rec.Code != http.StatusCreated || rec.Header().Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("the retry: %d %v, want the handler run again (201)", rec.Code, rec.Header())
	}
	if n := countOrders(t, pool); n != 1 {
		t.Fatalf("%d orders after the retry, want 1", n)
	}
}

// A leased handler whose heartbeats hang (the store stops answering, the
// connection stays open) or fail fast (connections refused) is stopped when
// the trust window of its last extension is about to end: before its lease
// runs out in the database, so before another instance can take the key
// over and run the handler again.
func TestLeasedHandlerStoppedBeforeTakeover(t *testing.T) {
	for _, fault := range []string{"hang", "refuse"} {
		t.Run(fault, func(t *testing.T) { stoppedBeforeTakeover(t, fault) })
	}
}

func stoppedBeforeTakeover(t *testing.T, fault string) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	p, proxied := throughProxy(t, db)
	const lease = time.Second
	cfg := &idemhttp.Config{Mode: idemhttp.ModeLeased, Principal: byUser, Heartbeat: lease / 4}
	handlerCtx := make(chan context.Context, 1)
	gate := make(chan struct{})
	mw := newMiddleware(t, newStore(t, &idempotency.Config{Lease: lease}), proxied, cfg)
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlerCtx <- r.Context()
		<-gate // a downstream call that ignores the context
		fmt.Fprint(w, "first")
	})))
	t.Cleanup(srv.Close)
	var firstCtx atomic.Pointer[context.Context]
	sawFirst := make(chan error, 1) // the first handler's context's error when the second ran
	other := newMiddleware(t, newStore(t, &idempotency.Config{Lease: lease}), db.Pool, cfg)
	srv2 := httptest.NewServer(other.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawFirst <- (*firstCtx.Load()).Err()
		fmt.Fprint(w, "second")
	})))
	t.Cleanup(srv2.Close)

	first := make(chan response, 1)
	go func() { first <- send(t, srv, "POST", "/pay", `"hang"`, "{}") }()
	var hctx context.Context
	select {
	case hctx = <-handlerCtx:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not run")
	}
	defer func() {
		p.SetBlackhole(faultproxy.ClientToServer, false)
		p.SetRefuse(false)
		p.CutAll() // the connection whose request was swallowed would hold up the pool's Close
		close(gate)
		<-first
	}()
	if fault == "hang" {
		p.SetBlackhole(faultproxy.ClientToServer, true)
	} else {
		p.SetRefuse(true)
		p.CutAll()
	}

	// The other instance retries until the key is free to take over; when it
	// runs the handler, the first one's context must have ended.
	firstCtx.Store(&hctx)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if time.Now().After(deadline) {
			t.Fatal("the key was never taken over")
		}
		r := send(t, srv2, "POST", "/pay", `"hang"`, "{}")
		if r.status == http.StatusConflict {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if r.status != http.StatusOK || r.body != "second" {
			t.Fatalf("the takeover: %+v", r)
		}
		break
	}
	if err := <-sawFirst; err == nil {
		t.Fatal("the key was taken over while the first handler's context was still live")
	}
	if cause := context.Cause(hctx); !strings.Contains(fmt.Sprint(cause), "lease may have expired") {
		t.Errorf("the first handler's context ended with %v", cause)
	}
}

// TestLeasedClaimReplyLost: the connection breaks after a leased claim was
// sent. The claim may hold the key with an owner nobody knows until its lease
// ends: the client gets 503 with Retry-After covering the lease (not a 500
// saying nothing will help), and a retry after the lease runs the handler.
func TestLeasedClaimReplyLost(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	createOrders(t, db.Pool)
	p, pool := throughProxy(t, db)
	api := &orderAPI{pool: pool}
	const lease = 3 * time.Second
	srv := httptest.NewServer(newMiddleware(t, newStore(t, &idempotency.Config{Lease: lease}), pool,
		&idemhttp.Config{Mode: idemhttp.ModeLeased, Principal: byUser}).Wrap(api))
	t.Cleanup(srv.Close)
	trig := p.CutAfter(faultproxy.SQLContains("idempotency_claim("))
	first := send(t, srv, "POST", "/o", `"claim-lost"`, "{}")
	if !trig.Fired() {
		t.Fatalf("the proxy did not cut the claim; first request: %+v", first)
	}
	if first.status != http.StatusServiceUnavailable || first.header.Get("Retry-After") != "3" {
		t.Fatalf("first: %+v, want 503 with Retry-After: 3 (the lease)", first)
	}
	if api.calls.Load() != 0 {
		t.Fatalf("the handler ran %d times after a claim whose outcome is unknown", api.calls.Load())
	}
	// The claim committed: its lease ends by the database clock; end it now.
	if _, err := db.Pool.Exec(context.Background(),
		`UPDATE pgfence.idempotency_keys SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE key = 'claim-lost'`); err != nil {
		t.Fatal(err)
	}
	if again := send(t, srv, "POST", "/o", `"claim-lost"`, "{}"); again.status != http.StatusCreated || api.calls.Load() != 1 {
		t.Fatalf("retry after the lease: %+v, %d calls; want the handler run once", again, api.calls.Load())
	}
}

// A handler behind the middleware cannot hijack the connection (its answer
// would bypass what the key stores, and every duplicate would get an empty
// 200): Hijack reports http.ErrNotSupported in both modes, and the
// handler's own answer to that is what the client gets.
func TestHijackRefused(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		pool := pgfencetest.NewPool(t)
		mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Mode: mode, Principal: byUser})
		srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nhijacked"))
				_ = conn.Close()
				return
			}
			if !errors.Is(err, http.ErrNotSupported) {
				http.Error(w, "unexpected: "+err.Error(), http.StatusInternalServerError)
				return
			}
			http.Error(w, "no hijacking here", http.StatusNotImplemented)
		})))
		t.Cleanup(srv.Close)
		if r := send(t, srv, "POST", "/attach", `"hijack"`, "{}"); r.status != http.StatusNotImplemented {
			t.Fatalf("%+v, want the handler's 501 after a refused Hijack", r)
		}
	})
}
