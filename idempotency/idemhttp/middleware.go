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
		if m.methods[r.Method] {
			m.serve(w, r, next)
		} else {
			next.ServeHTTP(w, r)
		}
	})
}

// serve handles a request of a covered method.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	values := r.Header.Values(HeaderKey)
	switch {
	case len(values) == 0 && m.cfg.Required:
		problem(w, http.StatusBadRequest, "Idempotency-Key is missing", "This operation requires an Idempotency-Key header.")
		return
	case len(values) == 0:
		next.ServeHTTP(w, r)
		return
	case len(values) > 1:
		problem(w, http.StatusBadRequest, "Idempotency-Key is repeated", "Send exactly one Idempotency-Key header.")
		return
	}
	key, err := parseKey(values[0])
	if err != nil {
		problem(w, http.StatusBadRequest, "Idempotency-Key is malformed", err.Error())
		return
	}
	principal := m.cfg.Principal(r)
	if principal == "" && !m.cfg.KeysSharedByAllCallers {
		problem(w, http.StatusUnauthorized, "Unauthenticated",
			"An Idempotency-Key is kept per caller, and this request names none; authenticate and retry.")
		return
	}
	// One byte more tells a body that is too large (no body has
	// math.MaxInt64 bytes).
	limit := min(m.cfg.MaxBodyBytes, math.MaxInt64-1) + 1
	body, err := io.ReadAll(io.LimitReader(r.Body, limit))
	if err != nil {
		problem(w, http.StatusBadRequest, "Request body unreadable", err.Error())
		return
	}
	if int64(len(body)) > m.cfg.MaxBodyBytes {
		problem(w, http.StatusRequestEntityTooLarge, "Request body too large",
			fmt.Sprintf("An idempotent request body may have at most %d bytes.", m.cfg.MaxBodyBytes))
		return
	}
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	canonical, err := m.cfg.CanonicalBody(r, body)
	if err != nil {
		m.cfg.Logger.DebugContext(r.Context(), "idempotency: canonical body refused", "key", key, "error", err)
		problem(w, http.StatusBadRequest, "Request body refused", "The request body is not what this operation accepts.")
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body)) // the hook may have read it

	req := idempotency.Request{Scope: m.scope(m.cfg.Route(r), principal), Key: key, Payload: payload(r, canonical)}
	// The claim must not be cut by the client going away: a cancel that
	// lands after a leased claim committed but before its answer would leave
	// the key in progress, with no owner, for a whole lease. It is bounded
	// on its own; a client that left still gets its key settled.
	claim := m.store.Begin
	if m.cfg.Mode == ModeLeased {
		claim = m.store.Claim
	}
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(r.Context()), claimTimeout)
	out, err := claim(cctx, m.db, req)
	ccancel()
	switch {
	case m.answered(w, r, req, out, err):
	case m.cfg.Mode == ModeLeased:
		m.runLeased(w, r, next, out.Attempt)
	default:
		m.runAtomic(w, r, next, out.Attempt)
	}
}

// answered answers a claim that did not give this request the key: a
// replay, 409, 422, 503 or 500. It reports false when the key is this
// request's.
func (m *Middleware) answered(w http.ResponseWriter, r *http.Request, req idempotency.Request, out *idempotency.Outcome, err error) bool {
	var busy *idempotency.InProgressError
	switch {
	case errors.Is(err, idempotency.ErrMismatch):
		problem(w, http.StatusUnprocessableEntity, "Idempotency-Key reused",
			"This Idempotency-Key was used with a different request; use a new key for a new request.")
	case errors.As(err, &busy):
		retryAfter(w, busy.RetryAfter)
		problem(w, http.StatusConflict, "Request in progress",
			"A request with this Idempotency-Key is still being processed; retry later.")
	case errors.Is(err, idempotency.ErrOutcomeUnknown):
		// The claim may have committed. Atomic: not with the handler's
		// writes (none ran), so the key is free. Leased: it may hold the key
		// with an owner nobody knows until its lease ends.
		retry := time.Second
		if m.cfg.Mode == ModeLeased {
			retry = m.store.Lease()
		}
		m.cfg.Logger.WarnContext(r.Context(), "idempotency: claim outcome unknown", "scope", req.Scope, "key", req.Key, "error", err)
		retryAfter(w, retry)
		problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable",
			"The connection to the idempotency store broke while the key was claimed; the request was not processed. Retry with the same Idempotency-Key.")
	case errors.Is(err, idempotency.ErrUnavailable), errors.Is(err, idempotency.ErrNotPrimary), errors.Is(err, context.DeadlineExceeded):
		// Unreachable, a standby (a failover under way), or no connection
		// free within the claim's timeout.
		retryAfter(w, time.Second)
		problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable", "The request was not processed; retry later.")
	case err != nil:
		m.cfg.Logger.ErrorContext(r.Context(), "idempotency: claim failed", "scope", req.Scope, "key", req.Key, "error", err)
		problem(w, http.StatusInternalServerError, "Idempotency store error", "The request was not processed; retry later.")
	case out.Replayed:
		m.replay(w, out)
	default:
		return false
	}
	return true
}

// retryAfter sets the Retry-After header to d in whole seconds, at least 1.
func retryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Max(1, math.Ceil(d.Seconds()))), 10))
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

// runAtomic runs the handler inside the transaction that claimed the key
// and commits its writes together with its response.
func (m *Middleware) runAtomic(w http.ResponseWriter, r *http.Request, next http.Handler, a *idempotency.Attempt) {
	// Every way out that did not commit rolls back: a panic, a response too
	// large to buffer or to store. An ended attempt is left as it is.
	defer func() {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(r.Context()), settleTimeout)
		defer rcancel()
		_ = a.Release(rctx)
	}()
	buf := &buffer{response: response{max: m.cfg.MaxResponseBytes}, live: http.Header{}}
	next.ServeHTTP(buf, r.WithContext(context.WithValue(r.Context(), txKey{}, a.Tx())))
	if buf.overflow {
		m.cfg.Logger.WarnContext(r.Context(), "idempotency: response too large for the atomic mode; rolled back",
			"scope", a.Scope(), "key", a.Key(), "limit", m.cfg.MaxResponseBytes)
		problem(w, http.StatusInternalServerError, "Response too large", "The request was not processed; retry later.")
		return
	}
	// The COMMIT must not be cut by the client going away: the outcome would
	// be unknown for no reason.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(r.Context()), settleTimeout)
	defer scancel()
	status, stored := buf.stored(buf.live, m.cfg.ReplayHeaders)
	kept, err := keep(sctx, a, status, stored)
	switch {
	case !kept && err != nil:
		m.cfg.Logger.WarnContext(r.Context(), "idempotency: rollback failed", "scope", a.Scope(), "key", a.Key(), "error", err)
	case errors.Is(err, idempotency.ErrOutcomeUnknown):
		// The COMMIT may have run: the same request again replays the
		// response if it did, or runs the handler if it did not.
		m.cfg.Logger.WarnContext(r.Context(), "idempotency: commit outcome unknown", "scope", a.Scope(), "key", a.Key(), "error", err)
		retryAfter(w, time.Second)
		problem(w, http.StatusServiceUnavailable, "Outcome unknown",
			"The connection to the idempotency store broke while the request was committed; retry with the same Idempotency-Key to learn its result.")
		return
	case err != nil:
		// A refused answer (too large to store) leaves the attempt open
		// until the deferred Release.
		m.cfg.Logger.ErrorContext(r.Context(), "idempotency: commit failed", "scope", a.Scope(), "key", a.Key(), "error", err)
		problem(w, http.StatusInternalServerError, "Request not committed", "The request was not processed; retry later.")
		return
	}
	buf.send(w)
}

// runLeased runs the handler under the leased claim, heartbeating, and
// stores its response.
func (m *Middleware) runLeased(w http.ResponseWriter, r *http.Request, next http.Handler, a *idempotency.Attempt) {
	// The handler's context ends when the client goes away or the key is
	// lost. The lease must outlive the client: a handler inside a call that
	// ignores its context still runs, and a retry must not take the key over
	// and run it again. The heartbeat stops when the handler returns.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stopBeat := m.keepAlive(context.WithoutCancel(r.Context()), a, cancel)

	rec := &recorder{ResponseWriter: w, response: response{max: m.cfg.MaxResponseBytes}}
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
			m.cfg.Logger.WarnContext(sctx, "idempotency: settling key failed", "scope", a.Scope(), "key", a.Key(), "error", err)
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
	ctx, stopBeats := context.WithCancel(ctx)
	lease, margin := m.store.Lease(), m.cfg.Heartbeat/2
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
		t := time.NewTicker(m.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
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
	return func() { trust.Stop(); stopBeats(); wg.Wait() }
}

// settle stores a final response, or releases the key for a retry. Storing
// is retried until ctx ends when the store cannot be reached: the handler
// has run, and a key left in progress would be taken over once its lease
// expired and the handler run again. A retry after an unknown outcome that
// had committed gets ErrLeaseLost, as does a key taken over meanwhile. A
// release is tried once: a lost one only keeps the key until its lease
// expires.
func (m *Middleware) settle(ctx context.Context, a *idempotency.Attempt, rec *recorder) error {
	status, stored := rec.stored(rec.Header(), m.cfg.ReplayHeaders)
	for delay := settleRetryMin; ; delay = min(2*delay, settleRetryMax) {
		kept, err := keep(ctx, a, status, stored)
		if !kept || err == nil || errors.Is(err, idempotency.ErrLeaseLost) || errors.Is(err, idempotency.ErrInvalid) {
			return err
		}
		m.cfg.Logger.DebugContext(ctx, "idempotency: settling key failed, retrying", "scope", a.Scope(), "key", a.Key(), "error", err)
		t := time.NewTimer(delay/2 + rand.N(delay/2+1)) // jitter
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// keep stores a handler's final answer as the key's, or releases the key
// (kept false): 2xx and 3xx are stored as results, 4xx as permanent
// failures, except the answers a retry may change or that depend on who
// asks (401, 403, 408, 409, 425, 429), which, like 5xx, are not kept.
func keep(ctx context.Context, a *idempotency.Attempt, status int, stored []byte) (kept bool, err error) {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false, a.Release(ctx)
	}
	switch {
	case status < 400:
		_, err = a.Complete(ctx, stored)
	case status < 500:
		_, err = a.Fail(ctx, &idempotency.Failure{Code: "http_" + strconv.Itoa(status), Message: http.StatusText(status), Data: stored})
	default:
		return false, a.Release(ctx)
	}
	return true, err
}
