package idemhttp_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestTelemetry: the middleware counts each covered request by outcome and
// logs it; uncovered methods are not counted.
func TestTelemetry(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		p := telemetrytest.New(t)
		var logs bytes.Buffer
		var mu sync.Mutex
		logger := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return logs.Write(b)
		}), &slog.HandlerOptions{Level: slog.LevelDebug}))
		f := newFixture(t, mode, nil, &idemhttp.Config{Principal: byUser, MeterProvider: p.Meter, TracerProvider: p.Tracer, Logger: logger})
		for _, r := range []struct {
			method, key, body, user string
			status                  int
		}{
			{http.MethodPost, "k-1", `{"n":1}`, "alice", http.StatusCreated},             // executed
			{http.MethodPost, "k-1", `{"n":1}`, "alice", http.StatusCreated},             // replayed
			{http.MethodPost, "k-1", `{"n":2}`, "alice", http.StatusUnprocessableEntity}, // mismatch
			{http.MethodPost, "", `{"n":3}`, "alice", http.StatusCreated},                // unprotected
			{http.MethodPost, "a,b", `{}`, "alice", http.StatusBadRequest},               // bad_key
			{http.MethodPost, "k-3", `{}`, "", http.StatusUnauthorized},                  // unauthenticated
			{http.MethodGet, "k-2", "", "alice", http.StatusCreated},                     // not covered
		} {
			if got := f.do(t, r.method, "/orders/1", r.key, r.body, "X-User", r.user); got.status != r.status {
				t.Fatalf("%s key %q: status %d, want %d", r.method, r.key, got.status, r.status)
			}
		}
		m := p.Metrics(t)
		for _, want := range []struct {
			outcome string
			n       int64
		}{{"executed", 1}, {"replayed", 1}, {"mismatch", 1}, {"unprotected", 1}, {"bad_key", 1}, {"unauthenticated", 1}} {
			if n := m.Sum("pgfence.idempotency.http.requests", attribute.String("pgfence.outcome", want.outcome)); n != want.n {
				t.Errorf("http.requests{%s} = %d, want %d", want.outcome, n, want.n)
			}
		}
		if n := m.Sum("pgfence.idempotency.http.requests"); n != 6 {
			t.Errorf("http.requests = %d, want 6 (GET is not covered)", n)
		}
		spans := p.Ended("pgfence.idempotency.http")
		if len(spans) != 6 {
			t.Errorf("%d pgfence.idempotency.http spans, want 6", len(spans))
		}
		mu.Lock()
		defer mu.Unlock()
		if !strings.Contains(logs.String(), `msg="idempotency: http request" outcome=mismatch key=k-1 status=422`) {
			t.Errorf("http log:\n%s", logs.String())
		}
		if strings.Contains(logs.String(), `{"n":`) {
			t.Errorf("the log shows a request body:\n%s", logs.String())
		}
	})
}

// TestTelemetryOutcomes: the outcomes TestTelemetry cannot reach through
// its fixture (a duplicate in flight, a body too large, a store that is
// down, a store that fails otherwise, a handler that panics) are counted
// too, and every outcome is set on the request's own span.
func TestTelemetryOutcomes(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		p := telemetrytest.New(t)
		cfg := func(c idemhttp.Config) *idemhttp.Config {
			c.Mode, c.Principal, c.MeterProvider, c.TracerProvider = mode, byUser, p.Meter, p.Tracer
			return &c
		}
		// A duplicate of an atomic request waits WaitTimeout for the first.
		store := newStore(t, &idempotency.Config{WaitTimeout: -1})
		entered, release := make(chan struct{}), make(chan struct{})
		slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
			w.WriteHeader(http.StatusNoContent)
		})
		up := newMiddleware(t, store, pgfencetest.NewPool(t), cfg(idemhttp.Config{MaxBodyBytes: 8}))
		down, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
		if err != nil {
			t.Fatal(err)
		}
		defer down.Close()
		unreachable := newMiddleware(t, store, down, cfg(idemhttp.Config{}))
		// A database without the pgfence schema: the claim fails, not with
		// an outage.
		broken := pgfencetest.NewPool(t)
		if _, err := broken.Exec(context.Background(), `DROP SCHEMA pgfence CASCADE`); err != nil {
			t.Fatal(err)
		}
		failing := newMiddleware(t, store, broken, cfg(idemhttp.Config{}))
		panics := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") })
		// serve sends one POST inside a span of its own and returns the
		// status and the outcome set on that span.
		serve := func(h http.Handler, key, body string) (int, string) {
			ctx, span := p.Tracer.Tracer("test").Start(context.Background(), "request "+key)
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/jobs", strings.NewReader(body))
			req.Header.Set(idemhttp.HeaderKey, key)
			req.Header.Set("X-User", "alice")
			rec := httptest.NewRecorder()
			func() {
				defer func() {
					if v := recover(); v != nil && v != "handler bug" {
						panic(v)
					}
				}()
				h.ServeHTTP(rec, req)
			}()
			span.End()
			ended := p.Ended("request " + key)
			v, _ := telemetrytest.Attr(ended[len(ended)-1], "pgfence.idempotency.http.outcome")
			return rec.Code, v.AsString()
		}
		first := make(chan string)
		go func() {
			_, outcome := serve(up.Wrap(slow), "job-1", "{}")
			first <- outcome
		}()
		<-entered
		for _, c := range []struct {
			h         http.Handler
			key, body string
			status    int
			outcome   string
		}{
			{up.Wrap(slow), "job-1", "{}", http.StatusConflict, "in_progress"},
			{up.Wrap(slow), "job-2", "{\"too\":\"long\"}", http.StatusRequestEntityTooLarge, "bad_body"},
			{unreachable.Wrap(slow), "job-3", "{}", http.StatusServiceUnavailable, "unavailable"},
			{failing.Wrap(slow), "job-4", "{}", http.StatusInternalServerError, "error"},
			{up.Wrap(panics), "job-5", "{}", http.StatusOK, "panicked"}, // nothing written: the recorder's default
		} {
			if status, outcome := serve(c.h, c.key, c.body); status != c.status || outcome != c.outcome {
				t.Errorf("%s: status %d, span outcome %q; want %d and %q", c.key, status, outcome, c.status, c.outcome)
			}
		}
		close(release)
		if outcome := <-first; outcome != "executed" {
			t.Errorf("job-1: span outcome %q, want executed", outcome)
		}
		m := p.Metrics(t)
		for _, outcome := range []string{"executed", "in_progress", "bad_body", "unavailable", "error", "panicked"} {
			if n := m.Sum("pgfence.idempotency.http.requests", attribute.String("pgfence.outcome", outcome)); n != 1 {
				t.Errorf("http.requests{%s} = %d, want 1", outcome, n)
			}
		}
	})
}
