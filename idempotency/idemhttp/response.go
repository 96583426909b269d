package idemhttp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
		for _, name := range allowed {
			if vs := header.Values(name); len(vs) > 0 {
				h[http.CanonicalHeaderKey(name)] = append([]string(nil), vs...)
			}
		}
	}
	if truncated {
		body = nil
	}
	// Marshalling a status, an http.Header and bytes cannot fail.
	b, _ := json.Marshal(storedResponse{Status: status, Header: h, Body: body, Truncated: truncated})
	return b
}

func decode(data []byte) (storedResponse, bool) {
	var resp storedResponse
	if err := json.Unmarshal(data, &resp); err != nil || resp.Status < 200 || resp.Status > 599 {
		return storedResponse{}, false
	}
	return resp, true
}

func (m *Middleware) replay(w http.ResponseWriter, out *idempotency.Outcome) {
	data := out.Result
	if out.Failure != nil {
		data = out.Failure.Data
	}
	resp, ok := decode(data)
	if !ok {
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
	for _, name := range m.cfg.ReplayHeaders {
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

// errResponseTooLarge is what a handler's Write returns in ModeAtomic once
// the response exceeds MaxResponseBytes.
var errResponseTooLarge = errors.New("idemhttp: response larger than Config.MaxResponseBytes; ModeAtomic buffers the response until COMMIT (use ModeLeased)")

// buffer keeps a ModeAtomic handler's response until the COMMIT: nothing
// reaches the client before its writes are durable. It is deliberately not
// an http.Flusher and does not unwrap to the connection: a handler cannot
// stream, hijack the connection or answer before the COMMIT.
type buffer struct {
	header   http.Header
	status   int
	sent     http.Header // the header as of WriteHeader
	body     bytes.Buffer
	max      int
	overflow bool
}

func (b *buffer) Header() http.Header { return b.header }

func (b *buffer) WriteHeader(code int) {
	if b.status != 0 || code < 200 { // a second call, or an interim 1xx (not sent)
		return
	}
	b.status = code
	b.sent = b.header.Clone()
}

func (b *buffer) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.WriteHeader(http.StatusOK)
	}
	if b.overflow || b.body.Len()+len(p) > b.max {
		b.overflow = true
		return 0, errResponseTooLarge
	}
	return b.body.Write(p)
}

// finalStatus is the status the handler answered; 200 when it wrote nothing.
func (b *buffer) finalStatus() int {
	if b.status == 0 {
		b.WriteHeader(http.StatusOK)
	}
	return b.status
}

// send writes the buffered response to the client.
func (b *buffer) send(w http.ResponseWriter) {
	b.finalStatus()
	h := w.Header()
	for name, vs := range b.sent {
		h[name] = vs
	}
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
	max      int
	status   int
	header   http.Header // as of the status
	body     bytes.Buffer
	overflow bool
}

// snapshot keeps the answer's status and its header as sent.
func (w *recorder) snapshot(status int) {
	w.status, w.header = status, w.ResponseWriter.Header().Clone()
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
