package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/idempotency"
)

type txKey struct{}

type attemptKey struct{}

// Tx returns the transaction that holds the request's key in [ModeAtomic]:
// do the handler's writes through it, and they commit together with the
// stored response. Do not commit or roll it back: the middleware does (a
// handler's answer that is not stored rolls it back). nil when the request
// is not covered by a key (no key sent, an uncovered method) or the
// middleware runs in [ModeLeased]: a handler written for both writes
// through its pool then.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// Attempt returns the [idempotency.Attempt] that owns the request's key in
// [ModeLeased], for a handler that records recovery points or derives
// downstream keys; nil when the request is not covered by a key or the
// middleware runs in [ModeAtomic].
func Attempt(ctx context.Context) *idempotency.Attempt {
	a, _ := ctx.Value(attemptKey{}).(*idempotency.Attempt)
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
	// released or rolled back on the way; net/http recovers or the caller
	// does).
	ctx, res := m.tel.start(r.Context(), m.mode)
	defer m.tel.end(ctx, res)
	res.outcome, res.status = m.serveCovered(w, r.WithContext(ctx), next, res)
}

// result is what the middleware records of a covered request.
type result struct {
	outcome string
	status  int        // sent by the middleware itself; 0 when the handler or a replay answered
	key     string     // "" until parsed
	request trace.Span // the span of the request, if any, which gets the outcome too
}

// Outcomes of a covered request (pgfence.idempotency.http.requests).
const (
	outcomeExecuted        = "executed"        // the handler ran under a new claim
	outcomeReplayed        = "replayed"        // the stored response was sent
	outcomeInProgress      = "in_progress"     // 409: the first request is still running
	outcomeMismatch        = "mismatch"        // 422: the key was used with another request
	outcomeUnprotected     = "unprotected"     // no key, not required: the handler ran without one
	outcomeBadKey          = "bad_key"         // 400: the key is missing (required), repeated or malformed
	outcomeBadBody         = "bad_body"        // 400 or 413: the body is unreadable, refused or too large
	outcomeUnauthenticated = "unauthenticated" // 401: no principal
	outcomeUnavailable     = "unavailable"     // 503: the store is unreachable
	outcomeUnknown         = "unknown"         // 503: the COMMIT's outcome is unknown (atomic)
	outcomeError           = "error"           // 500: the claim or the COMMIT failed otherwise
	outcomePanicked        = "panicked"        // the handler panicked; nothing was stored
)

// serveCovered handles a request of a covered method and returns its
// outcome and the status sent by the middleware itself (0 when the handler
// or a replay answered); it sets res.key once the key is parsed.
func (m *Middleware) serveCovered(w http.ResponseWriter, r *http.Request, next http.Handler, res *result) (outcome string, status int) {
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 {
		if m.required {
			problem(w, http.StatusBadRequest, "Idempotency-Key is missing", "This operation requires an Idempotency-Key header.")
			return outcomeBadKey, http.StatusBadRequest
		}
		next.ServeHTTP(w, r)
		return outcomeUnprotected, 0
	}
	if len(values) > 1 {
		problem(w, http.StatusBadRequest, "Idempotency-Key is repeated", "Send exactly one Idempotency-Key header.")
		return outcomeBadKey, http.StatusBadRequest
	}
	key, err := parseKey(values[0])
	if err != nil {
		problem(w, http.StatusBadRequest, "Idempotency-Key is malformed", err.Error())
		return outcomeBadKey, http.StatusBadRequest
	}
	res.key = key
	principal := m.principal(r)
	if principal == "" && !m.shared {
		problem(w, http.StatusUnauthorized, "Unauthenticated",
			"An Idempotency-Key is kept per caller, and this request names none; authenticate and retry.")
		return outcomeUnauthenticated, http.StatusUnauthorized
	}
	limit := m.maxBody + 1 // one byte more tells a body that is too large
	if limit < 0 {
		limit = m.maxBody // math.MaxInt64: no body is that large
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit))
	if err != nil {
		problem(w, http.StatusBadRequest, "Request body unreadable", err.Error())
		return outcomeBadBody, http.StatusBadRequest
	}
	if int64(len(body)) > m.maxBody {
		problem(w, http.StatusRequestEntityTooLarge, "Request body too large",
			fmt.Sprintf("An idempotent request body may have at most %d bytes.", m.maxBody))
		return outcomeBadBody, http.StatusRequestEntityTooLarge
	}
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	canonical, err := m.canonical(r, body)
	if err != nil {
		m.logger.DebugContext(r.Context(), "idempotency: canonical body refused", "key", key, "error", err)
		problem(w, http.StatusBadRequest, "Request body refused", "The request body is not what this operation accepts.")
		return outcomeBadBody, http.StatusBadRequest
	}
	r.Body = io.NopCloser(bytes.NewReader(body)) // the hook may have read it

	req := idempotency.Request{Scope: m.scope(m.route(r), principal), Key: key, Payload: payload(r, canonical)}
	if m.mode == ModeAtomic {
		return m.serveAtomic(w, r, next, req)
	}
	return m.serveLeased(w, r, next, req)
}

// answerClaim answers a claim that did not give this request the key: a
// replay, 409, 422, 503 or 500. It reports false for a New outcome.
func (m *Middleware) answerClaim(w http.ResponseWriter, r *http.Request, req idempotency.Request, out *idempotency.Outcome, err error) (answered bool, outcome string, status int) {
	var busy *idempotency.InProgressError
	switch {
	case errors.Is(err, idempotency.ErrMismatch):
		problem(w, http.StatusUnprocessableEntity, "Idempotency-Key reused",
			"This Idempotency-Key was used with a different request; use a new key for a new request.")
		return true, outcomeMismatch, http.StatusUnprocessableEntity
	case errors.As(err, &busy):
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Max(1, math.Ceil(busy.RetryAfter.Seconds()))), 10))
		problem(w, http.StatusConflict, "Request in progress",
			"A request with this Idempotency-Key is still being processed; retry later.")
		return true, outcomeInProgress, http.StatusConflict
	case errors.Is(err, idempotency.ErrOutcomeUnknown):
		// The claim may have committed. Atomic: not with the handler's
		// writes (none ran), so the key is free. Leased: it may hold the key
		// with an owner nobody knows until its lease ends.
		retry := time.Second
		if m.mode == ModeLeased {
			retry = m.store.Lease()
		}
		m.logger.WarnContext(r.Context(), "idempotency: claim outcome unknown", "scope", req.Scope, "key", req.Key, "error", err)
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Max(1, math.Ceil(retry.Seconds()))), 10))
		problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable",
			"The connection to the idempotency store broke while the key was claimed; the request was not processed. Retry with the same Idempotency-Key.")
		return true, outcomeUnavailable, http.StatusServiceUnavailable
	case errors.Is(err, idempotency.ErrUnavailable), errors.Is(err, idempotency.ErrNotPrimary), errors.Is(err, context.DeadlineExceeded):
		// Unreachable, a standby (a failover under way), or no connection
		// free within the claim's timeout.
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable", "The request was not processed; retry later.")
		return true, outcomeUnavailable, http.StatusServiceUnavailable
	case err != nil:
		m.logger.ErrorContext(r.Context(), "idempotency: claim failed", "scope", req.Scope, "key", req.Key, "error", err)
		problem(w, http.StatusInternalServerError, "Idempotency store error", "The request was not processed; retry later.")
		return true, outcomeError, http.StatusInternalServerError
	case out.Replayed:
		m.replay(w, out)
		return true, outcomeReplayed, 0
	}
	return false, "", 0
}

// Timeouts of the middleware's own statements, which do not end with the
// request's context: a client that goes away must not leave a key claimed
// without an owner, or a COMMIT cut in flight. settleRetryMin and
// settleRetryMax bound the delay between attempts to store a leased answer.
const (
	claimTimeout   = 10 * time.Second
	settleTimeout  = 10 * time.Second
	settleRetryMin = 20 * time.Millisecond
	settleRetryMax = time.Second
)

// serveAtomic runs the handler inside the transaction that claims the key
// and commits its writes together with its response.
func (m *Middleware) serveAtomic(w http.ResponseWriter, r *http.Request, next http.Handler, req idempotency.Request) (string, int) {
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(r.Context()), claimTimeout)
	out, err := m.store.Begin(cctx, m.db, req)
	ccancel()
	if answered, outcome, status := m.answerClaim(w, r, req, out, err); answered {
		return outcome, status
	}
	a := out.Attempt
	ended := false
	defer func() {
		if !ended { // the handler panicked: nothing commits
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(r.Context()), settleTimeout)
			defer rcancel()
			_ = a.Release(rctx)
		}
	}()
	buf := &buffer{header: http.Header{}, max: m.maxResp}
	next.ServeHTTP(buf, r.WithContext(context.WithValue(r.Context(), txKey{}, a.Tx())))
	ended = true

	// The COMMIT must not be cut by the client going away: the outcome would
	// be unknown for no reason.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(r.Context()), settleTimeout)
	defer scancel()
	if buf.overflow {
		_ = a.Release(sctx)
		m.logger.WarnContext(r.Context(), "idempotency: response too large for the atomic mode; rolled back",
			"scope", req.Scope, "key", req.Key, "limit", m.maxResp)
		problem(w, http.StatusInternalServerError, "Response too large",
			"The request was not processed; retry later.")
		return outcomeError, http.StatusInternalServerError
	}
	status := buf.finalStatus()
	switch storage(status) {
	case storeResult:
		_, err = a.Complete(sctx, encode(status, buf.sent, m.headers, buf.body.Bytes(), false))
	case storeFailure:
		_, err = a.Fail(sctx, httpFailure(status, encode(status, buf.sent, m.headers, buf.body.Bytes(), false)))
	default:
		// Not stored: the handler's writes go too, and a retry starts afresh.
		err = a.Release(sctx)
		if err != nil {
			m.logger.WarnContext(r.Context(), "idempotency: rollback failed", "scope", req.Scope, "key", req.Key, "error", err)
		}
		buf.send(w)
		return outcomeExecuted, 0
	}
	switch {
	case errors.Is(err, idempotency.ErrOutcomeUnknown):
		// The COMMIT may have run: the same request again replays the
		// response if it did, or runs the handler if it did not.
		m.logger.WarnContext(r.Context(), "idempotency: commit outcome unknown", "scope", req.Scope, "key", req.Key, "error", err)
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "Outcome unknown",
			"The connection to the idempotency store broke while the request was committed; retry with the same Idempotency-Key to learn its result.")
		return outcomeUnknown, http.StatusServiceUnavailable
	case err != nil:
		// A refused answer (too large to store) leaves the attempt open:
		// roll it back, or the key and its connection stay held.
		_ = a.Release(sctx)
		m.logger.ErrorContext(r.Context(), "idempotency: commit failed", "scope", req.Scope, "key", req.Key, "error", err)
		problem(w, http.StatusInternalServerError, "Request not committed", "The request was not processed; retry later.")
		return outcomeError, http.StatusInternalServerError
	}
	buf.send(w)
	return outcomeExecuted, 0
}

// serveLeased claims the key with a lease, runs the handler while
// heartbeating, and stores its response.
func (m *Middleware) serveLeased(w http.ResponseWriter, r *http.Request, next http.Handler, req idempotency.Request) (string, int) {
	// The claim must not be cut by the client going away: a cancel that lands
	// after the claim committed but before its answer would leave the key in
	// progress, with no owner, for a whole lease. It is bounded on its own; a
	// client that left still gets its key settled below.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(r.Context()), claimTimeout)
	out, err := m.store.Claim(cctx, m.db, req)
	ccancel()
	if answered, outcome, status := m.answerClaim(w, r, req, out, err); answered {
		return outcome, status
	}
	m.runLeased(w, r, next, out.Attempt)
	return outcomeExecuted, 0
}

func (m *Middleware) runLeased(w http.ResponseWriter, r *http.Request, next http.Handler, a *idempotency.Attempt) {
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
			m.logger.WarnContext(sctx, "idempotency: settling key failed", "scope", a.Scope(), "key", a.Key(), "error", err)
		}
	}()
	next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, attemptKey{}, a)))
	finished = true
}

// keepAlive extends the lease until stop is called, which cuts a heartbeat
// in flight and waits for it. It cancels the handler's context if the key
// is lost (taken over), and when the trust window of the last extension is
// about to run out (half a heartbeat interval before it), whether the
// heartbeats fail fast or hang (a pool with no free connection, a network
// that drops packets): so the handler is stopped before its lease can
// expire in the database and a retry take the key over. A lease that can no
// longer be trusted is still extended: the handler may run on (inside a
// call that ignores its context), and once the store answers again a
// heartbeat keeps the key for it unless another attempt took it over. ctx
// must not be the request's context, which ends when the client goes away
// while the handler may still run.
func (m *Middleware) keepAlive(ctx context.Context, a *idempotency.Attempt, cancel context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	ctx, stopBeats := context.WithCancel(ctx)
	lease, margin := m.store.Lease(), m.heartbeat/2
	stopAt := func() time.Time { return a.TrustedUntil().Add(-margin) }
	// The trust timer runs apart from the heartbeats, which may block.
	var trust *time.Timer
	trust = time.AfterFunc(time.Duration(math.MaxInt64), func() {
		if d := time.Until(stopAt()); d > 0 {
			trust.Reset(d) // extended meanwhile
			return
		}
		cancel(errors.New("idempotency: lease may have expired: not extended in time"))
	})
	trust.Reset(time.Until(stopAt())) // trust is set before it can fire
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
			// A heartbeat answered after a whole lease extends nothing; one
			// still out when the trust window ends is cut there.
			deadline := time.Now().Add(lease)
			if until := a.TrustedUntil(); time.Now().Before(until) && until.Before(deadline) {
				deadline = until
			}
			hctx, hcancel := context.WithDeadline(ctx, deadline)
			err := a.Heartbeat(hctx)
			hcancel()
			if errors.Is(err, idempotency.ErrLeaseLost) {
				cancel(err)
				return
			}
		}
	})
	return func() { close(done); trust.Stop(); stopBeats(); wg.Wait() }
}

// settle stores a final response, or releases the key for a retry. Storing
// is retried until ctx ends when the store cannot be reached: the handler
// has run, and a key left in progress would be taken over once its lease
// expired and the handler run again. A retry after an unknown outcome that
// had committed gets ErrLeaseLost, as does a key taken over meanwhile. A
// release is tried once: a lost one only keeps the key until its lease
// expires.
func (m *Middleware) settle(ctx context.Context, a *idempotency.Attempt, rec *recorder) error {
	status := rec.status
	if status == 0 {
		status = http.StatusOK // the handler wrote nothing
		rec.snapshot(status)
	}
	stored := encode(status, rec.header, nil, rec.body.Bytes(), rec.overflow)
	var err error
	for delay := settleRetryMin; ; delay = min(2*delay, settleRetryMax) {
		switch storage(status) {
		case storeResult:
			_, err = a.Complete(ctx, stored)
		case storeFailure:
			_, err = a.Fail(ctx, httpFailure(status, stored))
		default:
			return a.Release(ctx)
		}
		if err == nil || errors.Is(err, idempotency.ErrLeaseLost) || errors.Is(err, idempotency.ErrInvalid) {
			return err
		}
		m.logger.DebugContext(ctx, "idempotency: settling key failed, retrying", "scope", a.Scope(), "key", a.Key(), "error", err)
		t := time.NewTimer(delay/2 + rand.N(delay/2+1)) // jitter
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// What happens to a handler's answer.
const (
	storeResult  = iota + 1 // stored as the key's result
	storeFailure            // stored as the key's permanent failure
	storeNothing            // not stored: the key is freed for a retry
)

// storage says how a final status is kept: 2xx and 3xx as results, 4xx as
// permanent failures, except the answers a retry may change or that depend
// on who asks (401, 403, 408, 409, 425, 429), which, like 5xx, are not
// stored.
func storage(status int) int {
	switch {
	case status >= 200 && status < 400:
		return storeResult
	case status == http.StatusUnauthorized, status == http.StatusForbidden, status == http.StatusRequestTimeout,
		status == http.StatusConflict, status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return storeNothing
	case status >= 400 && status < 500:
		return storeFailure
	}
	return storeNothing
}

// httpFailure is the stored failure of a permanent 4xx answer.
func httpFailure(status int, stored []byte) *idempotency.Failure {
	return &idempotency.Failure{Code: "http_" + strconv.Itoa(status), Message: http.StatusText(status), Data: stored}
}
