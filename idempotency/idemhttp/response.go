package idemhttp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strconv"

	"github.com/pgfence/pgfence/idempotency"
)

// storedResponse is a response as the middleware stores it: the key's
// result (2xx, 3xx) or its failure's data (4xx).
type storedResponse struct {
	Status    int         `json:"status"`
	Header    http.Header `json:"header,omitempty"`
	Body      []byte      `json:"body,omitempty"`
	Truncated bool        `json:"truncated,omitempty"`
}

// EncodeResponse returns a response in the form the middleware stores it,
// for code that settles a key the middleware claimed in [ModeLeased]
// without the handler, such as the function given to
// [idempotency.Store.Recover] finishing a request abandoned by a crash:
// [idempotency.Attempt.Complete] with it (a 2xx or 3xx status), and every
// duplicate of the request gets this response.
// Only the headers in [Config.ReplayHeaders] are replayed.
func EncodeResponse(status int, header http.Header, body []byte) ([]byte, error) {
	if status < 200 || status > 599 {
		return nil, fmt.Errorf("%w: status must be 200 to 599, got %d", idempotency.ErrInvalid, status)
	}
	return encode(status, header, nil, body, false), nil
}

// encode stores a response, with only the allowed headers when allowed is
// not nil.
func encode(status int, header http.Header, allowed []string, body []byte, truncated bool) []byte {
	h := header
	if allowed != nil {
		h = http.Header{}
		copyHeader(h, header, allowed)
	}
	if truncated {
		body = nil
	}
	// Marshalling a status, an http.Header and bytes cannot fail.
	b, _ := json.Marshal(storedResponse{Status: status, Header: h, Body: body, Truncated: truncated})
	return b
}

func (m *Middleware) replay(w http.ResponseWriter, out *idempotency.Outcome) {
	data := out.Result
	if out.Failure != nil {
		data = out.Failure.Data
	}
	var resp storedResponse
	if err := json.Unmarshal(data, &resp); err != nil || resp.Status < 200 || resp.Status > 599 {
		w.Header().Set(HeaderReplayed, "true")
		if out.Failure != nil {
			// Settled without a response of the middleware, for example by
			// a completer that marked an abandoned request failed.
			problem(w, http.StatusInternalServerError, "Request failed",
				fmt.Sprintf("The request with this Idempotency-Key ended with the failure %q and is not run again; send a new request with a new key.", out.Failure.Code))
			return
		}
		// Not written by this middleware (another client used the same scope).
		problem(w, http.StatusInternalServerError, "Stored response unreadable", "The request was already processed.")
		return
	}
	copyHeader(w.Header(), resp.Header, m.cfg.ReplayHeaders)
	w.Header().Set(HeaderReplayed, "true")
	if !resp.Truncated {
		w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// copyHeader sets dst's fields named in names to src's values.
func copyHeader(dst, src http.Header, names []string) {
	for _, name := range names {
		if vs := src.Values(name); len(vs) > 0 {
			dst[http.CanonicalHeaderKey(name)] = vs
		}
	}
}

// errResponseTooLarge is what a handler's Write returns in ModeAtomic once
// the response exceeds MaxResponseBytes.
var errResponseTooLarge = errors.New("idemhttp: response larger than Config.MaxResponseBytes; ModeAtomic buffers the response until COMMIT (use ModeLeased)")

// response is what the middleware keeps of a handler's answer: its status,
// its header as of the status, and its body up to max bytes.
type response struct {
	status   int
	header   http.Header
	body     bytes.Buffer
	max      int
	overflow bool
}

// answer takes code as the status, with the header h as it is now, unless
// the status is set already or code is interim (1xx, not the answer).
func (r *response) answer(code int, h http.Header) {
	if r.status == 0 && code >= 200 {
		r.status, r.header = code, h.Clone()
	}
}

// keep copies p into the body and reports whether it fits; once the body
// would be larger than max it is dropped, and nothing more is kept.
func (r *response) keep(p []byte) bool {
	if r.overflow || r.body.Len()+len(p) > r.max {
		r.overflow = true
		r.body.Reset()
		return false
	}
	r.body.Write(p)
	return true
}

// stored is the answer's status (200 when the handler wrote nothing; h is
// the header then) and the answer as the middleware stores it, with only the
// allowed headers.
func (r *response) stored(h http.Header, allowed []string) (int, []byte) {
	r.answer(http.StatusOK, h)
	return r.status, encode(r.status, r.header, allowed, r.body.Bytes(), r.overflow)
}

// buffer keeps a ModeAtomic handler's response until the COMMIT: nothing
// reaches the client before its writes are durable. It is deliberately not
// an http.Flusher and does not unwrap to the connection: a handler cannot
// stream, hijack the connection or answer before the COMMIT.
type buffer struct {
	response
	live http.Header // what the handler's Header returns
}

func (b *buffer) Header() http.Header { return b.live }

func (b *buffer) WriteHeader(code int) { b.answer(code, b.live) }

func (b *buffer) Write(p []byte) (int, error) {
	b.answer(http.StatusOK, b.live)
	if !b.keep(p) {
		return 0, errResponseTooLarge
	}
	return len(p), nil
}

// send writes the buffered response, once stored, to the client.
func (b *buffer) send(w http.ResponseWriter) {
	h := w.Header()
	maps.Copy(h, b.header)
	if h.Get("Content-Length") == "" && h.Get("Transfer-Encoding") == "" {
		h.Set("Content-Length", strconv.Itoa(b.body.Len()))
	}
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body.Bytes())
}

// recorder passes a ModeLeased handler's response through and keeps a
// bounded copy of it.
type recorder struct {
	http.ResponseWriter
	response
}

func (w *recorder) WriteHeader(code int) {
	w.answer(code, w.ResponseWriter.Header())
	w.ResponseWriter.WriteHeader(code)
}

// Write keeps p; a first Write is the answer 200, which the underlying
// writer sends itself.
func (w *recorder) Write(p []byte) (int, error) {
	w.answer(http.StatusOK, w.ResponseWriter.Header())
	w.keep(p)
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

// Hijack refuses: a hijacked connection's answer bypasses the recorder, and
// the key would store an empty 200 that every duplicate then gets. (Without
// this method, http.ResponseController would reach the underlying writer's
// Hijack through Unwrap.)
func (w *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, fmt.Errorf("idemhttp: a response kept for an Idempotency-Key cannot be hijacked (leave this route out of the middleware): %w", http.ErrNotSupported)
}

// problem writes an RFC 9457 problem document.
func problem(w http.ResponseWriter, status int, title, detail string) {
	body, _ := json.Marshal(map[string]any{"title": title, "status": status, "detail": detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
