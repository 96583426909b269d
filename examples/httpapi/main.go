// Command httpapi shows an order API that creates one order per
// Idempotency-Key, however many times and however concurrently the request
// arrives.
//
// POST /orders is wrapped by the idempotency middleware (package idemhttp,
// IETF Idempotency-Key header draft) in its atomic mode: the middleware
// claims the key in a transaction, the handler inserts the order through that
// transaction (idemhttp.Tx), and the order and the response the client gets
// commit together, so no crash can leave an order without its stored response
// (or a response without its order). The handler is slow (an injected 200 ms
// pause, say a payment check). client-1 sends a checkout and its connection
// drops while the handler runs: its order is being created but it never sees
// the answer. It retries with the same key, and at the same moment five
// duplicates arrive (a double click, a proxy replaying the request…). They wait
// for the first request's transaction (a duplicate that waits longer than the
// store's WaitTimeout gets 409 with Retry-After and retries); once it
// committed, all six get its stored 201 marked "Idempotent-Replayed: true",
// even with the JSON members in another order. Finally the same key is sent
// with another body and gets 422.
//
// Run it:
//
//	go run ./examples/httpapi                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/httpapi
//
// It exits non-zero unless exactly one order was created and every client got
// the same response.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	clients      = 6
	handlerPause = 200 * time.Millisecond
	body         = `{"sku":"sku-1","quantity":2}`
	reordered    = `{ "quantity": 2, "sku": "sku-1" }` // the same JSON object
)

func main() {
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("httpapi", func(ctx context.Context, db *pgfencetest.Database) error {
		_, err := run(ctx, db.Pool, os.Stdout)
		return err
	})
}

// response is what one client finally got.
type response struct {
	Status   int
	Body     string
	Replayed bool
}

// result is the business outcome, checked by main_test.go.
type result struct {
	Orders         int // rows in the orders table
	HandlerRuns    int
	InProgress     int // 409 answers while the first request ran
	Responses      []response
	MismatchStatus int // the same key with another body
}

func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (result, error) {
	var res result
	var mu sync.Mutex // serialises output and res
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "  "+format+"\n", args...)
	}

	if _, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS example_http_orders;
		CREATE TABLE example_http_orders (id serial PRIMARY KEY, customer text NOT NULL, sku text NOT NULL, quantity int NOT NULL);`); err != nil {
		return res, err
	}

	started := make(chan struct{}) // closed when the handler first runs
	var startedOnce sync.Once

	// The API: POST /orders creates an order, through the transaction that
	// holds the request's key.
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			SKU      string `json:"sku"`
			Quantity int    `json:"quantity"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Quantity <= 0 {
			http.Error(w, "bad order", http.StatusBadRequest) // stored: a permanent answer
			return
		}
		mu.Lock()
		res.HandlerRuns++
		mu.Unlock()
		startedOnce.Do(func() { close(started) })
		time.Sleep(handlerPause) // the injected pause: duplicates arrive meanwhile
		// Finish the order even if this client hung up: the middleware stores
		// the response with it, and the client's retry gets it. (With the
		// request's context, the insert would fail instead, nothing would
		// commit, and the retry would create the order.)
		wctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
		defer cancel()
		var id int
		if err := idemhttp.Tx(r.Context()).QueryRow(wctx, `INSERT INTO example_http_orders (customer, sku, quantity) VALUES ($1, $2, $3) RETURNING id`,
			r.Header.Get("X-Customer"), in.SKU, in.Quantity).Scan(&id); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // 5xx: not stored, the insert rolls back
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_id":%d,"sku":%q,"quantity":%d}`, id, in.SKU, in.Quantity)
	})

	// The middleware: keys are scoped by customer (established by auth in a
	// real API; a header here) and route, kept in PostgreSQL. The principal
	// is required: without it one customer's stored response would be
	// replayed to another who sent the same key.
	store, err := idempotency.NewStore(nil)
	if err != nil {
		return res, err
	}
	mw, err := idemhttp.New(store, pool, &idemhttp.Config{
		Required:  true,
		Principal: func(r *http.Request) string { return r.Header.Get("X-Customer") },
	})
	if err != nil {
		return res, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Wrap(createOrder))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // returns ErrServerClosed on Shutdown
	defer srv.Shutdown(context.Background())
	url := "http://" + ln.Addr().String() + "/orders"

	// A client generates the key once per user action and sends it with every
	// retry of that action. (The random part keeps reruns apart.)
	suffix := make([]byte, 4)
	rand.Read(suffix)
	key := "checkout-" + hex.EncodeToString(suffix)
	post := func(ctx context.Context, payload string) (response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(payload))
		if err != nil {
			return response{}, err
		}
		req.Header.Set(idemhttp.HeaderKey, `"`+key+`"`) // a structured-header string
		req.Header.Set("X-Customer", "alice")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return response{}, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return response{resp.StatusCode, string(b), resp.Header.Get(idemhttp.HeaderReplayed) == "true"}, err
	}
	fmt.Fprintf(out, "httpapi: %d clients POST /orders %s with Idempotency-Key %q; the handler takes %s\n", clients, body, key, handlerPause)

	// client-1 sends first, over a bad network: its connection drops while the
	// handler is working, and it does not know whether the order exists.
	actx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-started:
		case <-time.After(5 * time.Second):
		}
		cancel()
	}()
	_, err = post(actx, body)
	cancel()
	if !errors.Is(err, context.Canceled) {
		return res, fmt.Errorf("client-1's first request: %v, want a dropped connection", err)
	}
	say("client-1: connection dropped while the server was working (outcome unknown): retries with the same key")

	// Now client-1 retries and five duplicates arrive, all at once.
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := 1; c <= clients; c++ {
		wg.Go(func() {
			payload := body
			if c%2 == 0 {
				payload = reordered
			}
			for range 100 {
				r, err := post(ctx, payload)
				if err != nil {
					errs <- fmt.Errorf("client-%d: %w", c, err)
					return
				}
				if r.Status == http.StatusConflict {
					// In progress longer than the wait: retry after a pause
					// (Retry-After says 1 s at the least; a short poll keeps
					// the demo quick).
					mu.Lock()
					res.InProgress++
					mu.Unlock()
					time.Sleep(50 * time.Millisecond)
					continue
				}
				say("client-%d: %d %s (Idempotent-Replayed: %t)", c, r.Status, r.Body, r.Replayed)
				mu.Lock()
				res.Responses = append(res.Responses, r)
				mu.Unlock()
				return
			}
			errs <- fmt.Errorf("client-%d: still in progress after 100 attempts", c)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return res, err
	}

	// The same key with another request is a client bug: 422, nothing runs.
	r, err := post(ctx, `{"sku":"sku-1","quantity":5}`)
	if err != nil {
		return res, err
	}
	res.MismatchStatus = r.Status
	say("same key, quantity 5 instead of 2: %d", r.Status)

	// Check the business state: one order, one answer for everyone.
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM example_http_orders`).Scan(&res.Orders); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "result: %d order(s) created, handler ran %d time(s), %d answers of 409 in progress, %d clients got the same response; mismatched body got %d\n",
		res.Orders, res.HandlerRuns, res.InProgress, len(res.Responses), res.MismatchStatus)
	switch {
	case res.Orders != 1 || res.HandlerRuns != 1:
		return res, errors.New("the order was created more than once")
	case res.MismatchStatus != http.StatusUnprocessableEntity:
		return res, errors.New("a reused key with another body was not refused")
	}
	for _, r := range res.Responses {
		// The request that ran lost its client, so everyone got the replay.
		if r.Status != http.StatusCreated || r.Body != res.Responses[0].Body || !r.Replayed {
			return res, fmt.Errorf("clients got different answers: %+v", res.Responses)
		}
	}
	fmt.Fprintln(out, "OK: one order, the same response for every client")
	return res, nil
}
