package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// HeaderKey is the request header that carries the key (IETF
// draft-ietf-httpapi-idempotency-key-header), and HeaderReplayed marks a
// response that was replayed from the store.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// Defaults for [HTTPConfig].
const (
	// HTTPMaxBodyBytesDefault bounds the request body read for the fingerprint.
	HTTPMaxBodyBytesDefault = 1 << 20
	// HTTPMaxResponseBytesDefault bounds the stored response body.
	HTTPMaxResponseBytesDefault = 1 << 20
	// HTTPMaxKeyBytes is the longest accepted Idempotency-Key value.
	HTTPMaxKeyBytes = 255
)

// HTTPMethodsDefault are the methods the middleware covers by default: the
// ones that are not idempotent by definition.
var HTTPMethodsDefault = []string{http.MethodPost, http.MethodPatch}

// HTTPReplayHeadersDefault are the response headers stored and replayed by
// default. Anything else (Set-Cookie, per-request ids, Date) is not replayed.
var HTTPReplayHeadersDefault = []string{
	"Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified",
}

// HTTPConfig configures [NewMiddleware]. A nil *HTTPConfig and the zero value
// use the defaults.
type HTTPConfig struct {
	// Required makes a covered request without an Idempotency-Key fail with
	// 400. Default false: such requests run unprotected.
	Required bool
	// Methods are the covered methods; others pass through. Default
	// [HTTPMethodsDefault].
	Methods []string
	// Principal returns who sends the request (user, tenant, API client), as
	// established by authentication that runs before the middleware. Keys of
	// different principals never meet. Default: everyone is "" (only safe for
	// APIs whose keys are unguessable). Return an identity, never a
	// credential: it becomes part of the stored scope and of span attributes.
	Principal func(*http.Request) string
	// Route names the operation. Default: method + " " + the ServeMux pattern
	// that matched (r.Pattern; wrap the handler, not the mux, to have it), or
	// the path when there is none. A route and principal whose scope would
	// be longer than [MaxScopeBytes] or not valid UTF-8 without NUL (a path
	// decoded from %00 or %FF) are stored as a hash of it.
	Route func(*http.Request) string
	// MaxBodyBytes bounds the request body read to fingerprint it; a larger
	// body gets 413. Default [HTTPMaxBodyBytesDefault].
	MaxBodyBytes int64
	// MaxResponseBytes bounds the stored response body. A larger response is
	// still sent and the key still completed (the effect happened), but the
	// replay carries the status and headers only. Default
	// [HTTPMaxResponseBytesDefault].
	MaxResponseBytes int
	// ReplayHeaders are the response headers stored and replayed. Default
	// [HTTPReplayHeadersDefault]. Content-Encoding is always kept too: the
	// body is stored as sent, and a replay without it would pass compressed
	// bytes off as the body.
	ReplayHeaders []string
	// Heartbeat is how often the lease is extended while the handler runs.
	// Default a third of the store's [Config.Lease].
	Heartbeat time.Duration
}

// Middleware applies leased idempotency keys to net/http handlers. A request
// with an Idempotency-Key runs the handler at most once per (principal,
// route, key); duplicates get the stored response.
//
//   - 400: the key is missing (when required), repeated or malformed.
//   - 409 with Retry-After: the first request is still running.
//   - 422: the key was used with a different request (method, URI or body).
//   - 413: the body is larger than [HTTPConfig.MaxBodyBytes].
//   - 503 (500): the key store is unreachable (failed); the handler did not run.
//   - Replays carry "Idempotent-Replayed: true" and only the allow-listed
//     headers.
//
// 2xx and 3xx responses are stored as results, 4xx responses as permanent
// failures — except 408, 409, 425 and 429, which, like 5xx and panics, release
// the key so that a retry runs the handler again.
//
// The lease is extended until the handler returns, also after the client went
// away: net/http then ends the handler's context, but a handler inside a call
// that ignores it still runs, so a retry gets 409 until it returns and then
// its stored answer. The handler's context also ends if the key is lost.
type Middleware struct {
	store     *Store
	db        DB
	required  bool
	methods   map[string]bool
	principal func(*http.Request) string
	route     func(*http.Request) string
	maxBody   int64
	maxResp   int
	headers   []string
	heartbeat time.Duration
}

// NewMiddleware returns a Middleware that keeps keys through store in db
// (normally a pool; the claim must commit before the handler runs).
func NewMiddleware(store *Store, db DB, cfg *HTTPConfig) (*Middleware, error) {
	if store == nil || db == nil {
		return nil, fmt.Errorf("%w: NewMiddleware needs a store and a db", ErrInvalid)
	}
	if cfg == nil {
		cfg = &HTTPConfig{}
	}
	m := &Middleware{
		store:     store,
		db:        db,
		required:  cfg.Required,
		methods:   map[string]bool{},
		principal: cfg.Principal,
		route:     cfg.Route,
		maxBody:   cfg.MaxBodyBytes,
		maxResp:   cfg.MaxResponseBytes,
		headers:   cfg.ReplayHeaders,
		heartbeat: cfg.Heartbeat,
	}
	methods := cfg.Methods
	if len(methods) == 0 {
		methods = HTTPMethodsDefault
	}
	for _, meth := range methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	if m.principal == nil {
		m.principal = func(*http.Request) string { return "" }
	}
	if m.route == nil {
		m.route = defaultRoute
	}
	switch {
	case m.maxBody < 0:
		return nil, fmt.Errorf("%w: HTTPConfig.MaxBodyBytes must not be negative, got %d", ErrInvalid, m.maxBody)
	case m.maxBody == 0:
		m.maxBody = HTTPMaxBodyBytesDefault
	}
	switch {
	case m.maxResp < 0 || m.maxResp > MaxResultBytes/2:
		return nil, fmt.Errorf("%w: HTTPConfig.MaxResponseBytes must be 0 to %d, got %d", ErrInvalid, MaxResultBytes/2, m.maxResp)
	case m.maxResp == 0:
		m.maxResp = HTTPMaxResponseBytesDefault
	}
	if m.headers == nil {
		m.headers = HTTPReplayHeadersDefault
	}
	if !slices.ContainsFunc(m.headers, func(h string) bool { return strings.EqualFold(h, "Content-Encoding") }) {
		m.headers = append(slices.Clip(m.headers), "Content-Encoding")
	}
	switch {
	case m.heartbeat < 0:
		return nil, fmt.Errorf("%w: HTTPConfig.Heartbeat must not be negative, got %v", ErrInvalid, m.heartbeat)
	case m.heartbeat == 0:
		m.heartbeat = store.lease / 3
	}
	if m.heartbeat >= store.lease {
		return nil, fmt.Errorf("%w: HTTPConfig.Heartbeat (%v) must be shorter than Config.Lease (%v)", ErrInvalid, m.heartbeat, store.lease)
	}
	return m, nil
}

func defaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Method + " " + r.Pattern
	}
	return r.Method + " " + r.URL.Path
}

type attemptKey struct{}

// AttemptFromContext returns the [Attempt] that owns the request's key, for a
// handler that records recovery points or derives downstream keys; nil when
// the request is not covered by a key.
func AttemptFromContext(ctx context.Context) *Attempt {
	a, _ := ctx.Value(attemptKey{}).(*Attempt)
	return a
}

// Wrap returns next protected by idempotency keys.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !m.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	// A handler that panics is counted too, as it unwinds (the key is
	// released by run; net/http recovers or the caller does).
	res := &httpResult{outcome: httpPanicked}
	defer func() { m.store.tel.httpRequest(r.Context(), res.outcome, res.status, res.key) }()
	res.outcome, res.status = m.serveCovered(w, r, next, res)
}

// httpResult is what the middleware records of a covered request.
type httpResult struct {
	outcome string
	status  int    // sent by the middleware itself; 0 when the handler answered
	key     string // "" until parsed
}

// Outcomes of a covered request (pgfence.idempotency.http.requests).
const (
	httpExecuted    = "executed"    // the handler ran under a new claim
	httpReplayed    = "replayed"    // the stored response was sent
	httpInProgress  = "in_progress" // 409: the first request is still running
	httpMismatch    = "mismatch"    // 422: the key was used with another request
	httpUnprotected = "unprotected" // no key, not required: the handler ran without one
	httpBadKey      = "bad_key"     // 400: the key is missing (required), repeated or malformed
	httpBadBody     = "bad_body"    // 400 or 413: the body is unreadable or too large
	httpUnavailable = "unavailable" // 503: the store is unreachable
	httpError       = "error"       // 500: the claim failed otherwise
	httpPanicked    = "panicked"    // the handler panicked; the key was released
)

// serveCovered handles a request of a covered method and returns its
// outcome and the status sent by the middleware itself (0 when the handler
// answered); it sets res.key once the key is parsed.
func (m *Middleware) serveCovered(w http.ResponseWriter, r *http.Request, next http.Handler, res *httpResult) (outcome string, status int) {
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 {
		if m.required {
			problem(w, http.StatusBadRequest, "Idempotency-Key is missing", "This operation requires an Idempotency-Key header.")
			return httpBadKey, http.StatusBadRequest
		}
		next.ServeHTTP(w, r)
		return httpUnprotected, 0
	}
	if len(values) > 1 {
		problem(w, http.StatusBadRequest, "Idempotency-Key is repeated", "Send exactly one Idempotency-Key header.")
		return httpBadKey, http.StatusBadRequest
	}
	key, err := parseKey(values[0])
	if err != nil {
		problem(w, http.StatusBadRequest, "Idempotency-Key is malformed", err.Error())
		return httpBadKey, http.StatusBadRequest
	}
	res.key = key
	limit := m.maxBody + 1 // one byte more tells a body that is too large
	if limit < 0 {
		limit = m.maxBody // math.MaxInt64: no body is that large
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit))
	if err != nil {
		problem(w, http.StatusBadRequest, "Request body unreadable", err.Error())
		return httpBadBody, http.StatusBadRequest
	}
	if int64(len(body)) > m.maxBody {
		problem(w, http.StatusRequestEntityTooLarge, "Request body too large",
			fmt.Sprintf("An idempotent request body may have at most %d bytes.", m.maxBody))
		return httpBadBody, http.StatusRequestEntityTooLarge
	}
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))

	req := Request{Scope: httpScope(m.route(r), m.principal(r)), Key: key, Payload: httpPayload(r, body)}
	// The claim must not be cut by the client going away: a cancel that lands
	// after the claim committed but before its answer would leave the key in
	// progress, with no owner, for a whole lease. It is bounded on its own; a
	// client that left still gets its key settled below.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(r.Context()), claimTimeout)
	out, err := m.store.Claim(cctx, m.db, req)
	ccancel()
	switch {
	case errors.Is(err, ErrMismatch):
		problem(w, http.StatusUnprocessableEntity, "Idempotency-Key reused",
			"This Idempotency-Key was used with a different request; use a new key for a new request.")
		return httpMismatch, http.StatusUnprocessableEntity
	case errors.Is(err, ErrInProgress):
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Max(1, math.Ceil(out.RetryAfter.Seconds()))), 10))
		problem(w, http.StatusConflict, "Request in progress",
			"A request with this Idempotency-Key is still being processed; retry later.")
		return httpInProgress, http.StatusConflict
	case errors.Is(err, ErrUnavailable):
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable", "Retry later.")
		return httpUnavailable, http.StatusServiceUnavailable
	case err != nil:
		m.store.logger.ErrorContext(r.Context(), "idempotency: claim failed", "scope", req.Scope, "key", req.Key, "error", err)
		problem(w, http.StatusInternalServerError, "Idempotency store error", "The request was not processed; retry later.")
		return httpError, http.StatusInternalServerError
	case out.Status == Replayed:
		m.replay(w, out)
		return httpReplayed, 0
	}
	m.run(w, r, next, out.Attempt)
	return httpExecuted, 0
}

// claimTimeout bounds the middleware's claim, which does not end with the
// request's context.
const claimTimeout = 10 * time.Second

func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, a *Attempt) {
	// The handler's context ends when the client goes away or the key is
	// lost. The lease must outlive the client: a handler inside a call that
	// ignores its context still runs, and a retry must not take the key over
	// and run it again. The heartbeat stops when the handler returns.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stopBeat := m.keepAlive(context.WithoutCancel(r.Context()), a, cancel)

	rec := &recorder{ResponseWriter: w, max: m.maxResp, allowed: m.headers}
	finished := false
	defer func() {
		stopBeat()
		// The client may be gone; the key must still be settled.
		sctx, scancel := context.WithTimeout(context.WithoutCancel(r.Context()), settleTimeout)
		defer scancel()
		if !finished { // the handler panicked
			_ = a.Release(sctx)
			return
		}
		if err := m.settle(sctx, a, rec); err != nil {
			m.store.logger.WarnContext(sctx, "idempotency: settling key failed", "scope", a.scope, "key", a.key, "error", err)
		}
	}()
	next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, attemptKey{}, a)))
	finished = true
}

// keepAlive extends the lease until stop is called, which waits for a
// heartbeat in flight; it cancels the handler's context if the key is lost
// (taken over) or can no longer be trusted. A lease that can no longer be
// trusted is still extended: the handler may run on (inside a call that
// ignores its context), and once the store answers again a heartbeat keeps
// the key for it unless another attempt took it over. ctx must not be the
// request's context, which ends when the client goes away while the handler
// may still run.
func (m *Middleware) keepAlive(ctx context.Context, a *Attempt, cancel context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(m.heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			// A heartbeat answered after a whole lease extends nothing.
			hctx, hcancel := context.WithTimeout(ctx, m.store.lease)
			err := a.Heartbeat(hctx)
			hcancel()
			switch {
			case errors.Is(err, ErrNotOwner):
				cancel(err)
				return
			case err != nil && time.Now().After(a.TrustedUntil()):
				cancel(fmt.Errorf("idempotency: lease may have expired: %w", err))
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// settle stores a final response, or releases the key for a retry. Storing
// is retried until ctx ends when the store cannot be reached: the handler
// has run, and a key left in progress would be taken over once its lease
// expired and the handler run again. A retry after an unknown outcome that
// had committed gets ErrNotOwner, as does a key taken over meanwhile. A
// release is tried once: a lost one only keeps the key until its lease
// expires.
func (m *Middleware) settle(ctx context.Context, a *Attempt, rec *recorder) error {
	status := rec.status
	if status == 0 {
		status = http.StatusOK // the handler wrote nothing
		rec.snapshot(status)
	}
	stored, err := json.Marshal(storedResponse{
		Status: status, Header: rec.header, Body: rec.body.Bytes(), Truncated: rec.overflow,
	})
	if err != nil {
		return err
	}
	for delay := settleRetryMin; ; delay = min(2*delay, settleRetryMax) {
		switch {
		case status >= 200 && status < 400:
			_, err = a.Complete(ctx, stored)
		case status >= 400 && status < 500 && !transientStatus[status]:
			_, err = a.Fail(ctx, &Failure{Code: "http_" + strconv.Itoa(status), Message: http.StatusText(status), Data: stored})
		default:
			return a.Release(ctx)
		}
		if err == nil || errors.Is(err, ErrNotOwner) || errors.Is(err, ErrInvalid) {
			return err
		}
		m.store.logger.DebugContext(ctx, "idempotency: settling key failed, retrying", "scope", a.scope, "key", a.key, "error", err)
		t := time.NewTimer(delay/2 + rand.N(delay/2+1)) // jitter
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// settleTimeout bounds the settling of a key after the handler returned
// (retries included), which does not end with the request's context; the
// bounds of the delay between attempts follow.
const (
	settleTimeout  = 10 * time.Second
	settleRetryMin = 20 * time.Millisecond
	settleRetryMax = time.Second
)

// transientStatus are 4xx answers that a retry may change.
var transientStatus = map[int]bool{
	http.StatusRequestTimeout:  true,
	http.StatusConflict:        true,
	http.StatusTooEarly:        true,
	http.StatusTooManyRequests: true,
}

type storedResponse struct {
	Status    int         `json:"status"`
	Header    http.Header `json:"header,omitempty"`
	Body      []byte      `json:"body,omitempty"`
	Truncated bool        `json:"truncated,omitempty"`
}

func (m *Middleware) replay(w http.ResponseWriter, out *Outcome) {
	data := out.Result
	if out.Failure != nil {
		data = out.Failure.Data
	}
	var resp storedResponse
	if err := json.Unmarshal(data, &resp); err != nil || resp.Status < 200 || resp.Status > 599 {
		// Not written by this middleware (another client used the same scope).
		problem(w, http.StatusInternalServerError, "Stored response unreadable", "The request was already processed.")
		return
	}
	for _, name := range m.headers {
		if vs := resp.Header.Values(name); len(vs) > 0 {
			w.Header()[http.CanonicalHeaderKey(name)] = vs
		}
	}
	w.Header().Set(HeaderReplayed, "true")
	if !resp.Truncated {
		w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// recorder passes the response through and keeps a bounded copy of it.
type recorder struct {
	http.ResponseWriter
	max      int
	allowed  []string
	status   int
	header   http.Header
	body     bytes.Buffer
	overflow bool
}

func (w *recorder) snapshot(status int) {
	w.status = status
	w.header = http.Header{}
	for _, name := range w.allowed {
		if vs := w.ResponseWriter.Header().Values(name); len(vs) > 0 {
			w.header[http.CanonicalHeaderKey(name)] = append([]string(nil), vs...)
		}
	}
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // 1xx are interim, not the answer
		w.snapshot(code)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.overflow {
		if w.body.Len()+len(p) > w.max {
			w.overflow = true
			w.body.Reset()
		} else {
			w.body.Write(p)
		}
	}
	return w.ResponseWriter.Write(p)
}

// Flush sends what was written so far, so that a streaming handler that
// asks for an http.Flusher still streams. A flush before any write sends
// the implicit 200, which is then the answer.
func (w *recorder) Flush() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer
// (deadlines, full duplex).
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// parseKey accepts the draft's sf-string ("...") and, leniently, a bare token
// of visible ASCII.
func parseKey(v string) (string, error) {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var b strings.Builder
		inner := v[1 : len(v)-1]
		for i := 0; i < len(inner); i++ {
			c := inner[i]
			switch {
			case c == '\\':
				if i+1 >= len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
					return "", errors.New(`a quoted key may escape only " and \`)
				}
				i++
				b.WriteByte(inner[i])
			case c == '"':
				return "", errors.New("unescaped quote inside the key")
			case c < 0x20 || c > 0x7e:
				return "", errors.New("the key must be printable ASCII")
			default:
				b.WriteByte(c)
			}
		}
		v = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			if v[i] <= 0x20 || v[i] > 0x7e || v[i] == '"' || v[i] == ',' || v[i] == ';' {
				return "", errors.New(`the key must be a quoted string ("...") of printable ASCII`)
			}
		}
	}
	if len(v) == 0 || len(v) > HTTPMaxKeyBytes {
		return "", fmt.Errorf("the key must be 1 to %d characters", HTTPMaxKeyBytes)
	}
	return v, nil
}

// httpScope keeps keys of different routes and principals apart. A scope
// that is too long, or is not text PostgreSQL can store (a decoded path or a
// principal may hold NUL or invalid UTF-8: POST /a%00b), is kept as its
// SHA-256; "http:sha256:" never starts a scope of the other form.
func httpScope(route, principal string) string {
	s := fmt.Sprintf("http:%d:%s:%s", len(route), route, principal)
	if len(s) > MaxScopeBytes || !validText(s) {
		sum := sha256.Sum256([]byte(s))
		s = "http:sha256:" + hex.EncodeToString(sum[:])
	}
	return s
}

// httpPayload is what must match for a duplicate: method, URI and body.
func httpPayload(r *http.Request, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n%s\n%d\n", r.Method, r.URL.RequestURI(), len(body))
	b.Write(body)
	return b.Bytes()
}

// problem writes an RFC 9457 problem document.
func problem(w http.ResponseWriter, status int, title, detail string) {
	body, _ := json.Marshal(map[string]any{"title": title, "status": status, "detail": detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
