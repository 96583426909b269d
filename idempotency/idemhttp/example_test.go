package idemhttp_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// An order API in the atomic mode: the handler inserts the order through
// the transaction that holds the key, and the order commits together with
// the response every duplicate gets. The same JSON with its members in
// another order is the same request; another body under the same key is
// refused; another user's key is another key.
func Example() {
	db, err := pgfencetest.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id serial PRIMARY KEY, body text)`); err != nil {
		log.Fatal(err)
	}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.New(store, db.Pool, &idemhttp.Config{
		// The authenticated caller, as set by the authentication in front.
		Principal: func(r *http.Request) string { return r.Header.Get("X-User") },
	})
	if err != nil {
		log.Fatal(err)
	}
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id int
		if err := idemhttp.Tx(r.Context()).QueryRow(r.Context(), `INSERT INTO orders (body) VALUES ('x') RETURNING id`).Scan(&id); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // not stored: the retry runs the handler
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, id)
	})
	h := mw.Wrap(createOrder)

	for _, c := range []struct{ user, body string }{
		{"alice", `{"sku":"a-1","qty":2}`},
		{"alice", `{ "qty": 2.0, "sku": "a-1" }`},
		{"alice", `{"sku":"a-1","qty":3}`},
		{"bob", `{"sku":"a-1","qty":2}`},
	} {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(c.body))
		req.Header.Set(idemhttp.HeaderKey, `"checkout-1"`)
		req.Header.Set("X-User", c.user)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(c.user, rec.Code, rec.Header().Get(idemhttp.HeaderReplayed), strings.TrimSpace(rec.Body.String()))
	}
	var n int
	_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// alice 201  {"order":1}
	// alice 201 true {"order":1}
	// alice 422  {"detail":"This Idempotency-Key was used with a different request; use a new key for a new request.","status":422,"title":"Idempotency-Key reused"}
	// bob 201  {"order":2}
	// orders: 2
}
