package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// acceptedAPI is the asynchronous mode of an order API: POST /orders
// enqueues the order as an ordered task through the transaction that holds
// the idempotency key and answers 202 Accepted with the task's status URL,
// so the task exists if and only if that answer is stored, and every
// duplicate gets the same answer. GET /orders/status/{id} answers only the
// principal whose order it is. fail makes the handler fail after enqueuing.
func acceptedAPI(t *testing.T, db *pgfencetest.Database, fail *bool) http.Handler {
	t.Helper()
	store, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	principal := func(r *http.Request) string { return r.Header.Get("X-User") }
	mw, err := idemhttp.New(store, db.Pool, &idemhttp.Config{Principal: principal})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payload, _ := json.Marshal(map[string]string{"user": principal(r)})
		task, err := tasks.Enqueue(r.Context(), idemhttp.Tx(r.Context()), "stock/sku-42", payload, nil)
		if err != nil || *fail {
			http.Error(w, "try again", http.StatusServiceUnavailable) // not stored: the task rolls back with the key
			return
		}
		w.Header().Set("Location", "/orders/status/"+strconv.FormatInt(task.ID, 10))
		w.WriteHeader(http.StatusAccepted)
	})))
	mux.HandleFunc("GET /orders/status/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		task, err := tasks.Status(r.Context(), db.Pool, id)
		var owner struct{ User string }
		if err == nil {
			err = json.Unmarshal(task.Payload, &owner)
		}
		switch {
		case errors.Is(err, pgfence.ErrNotFound) || err == nil && owner.User != principal(r):
			http.NotFound(w, r) // another principal's order does not exist for this one
		case err != nil:
			http.Error(w, "try again", http.StatusServiceUnavailable)
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"state":%q,"seq":%d}`, task.State, task.Seq)
		}
	})
	return mux
}

// The asynchronous mode answers at once and replays its 202 with the same
// Location for a duplicate; a failed handler leaves no task; the status URL
// answers its principal only, and reaches done once a consumer applied it.
func TestAcceptedAnswerIsReplayedAndPolled(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fail := false
	api := acceptedAPI(t, db, &fail)
	do := func(method, path, user, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(`{"sku":"sku-42","qty":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", user)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		return rec
	}
	countTasks := func() (n int) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.tasks`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	fail = true
	if rec := do("POST", "/orders", "alice", "order-1"); rec.Code != http.StatusServiceUnavailable || countTasks() != 0 {
		t.Fatalf("a failed handler: %d with %d tasks, want 503 and no task (it rolls back with the key)", rec.Code, countTasks())
	}
	fail = false
	first := do("POST", "/orders", "alice", "order-1")
	loc := first.Header().Get("Location")
	if first.Code != http.StatusAccepted || !strings.HasPrefix(loc, "/orders/status/") {
		t.Fatalf("first request: %d, Location %q; want 202 with the status URL", first.Code, loc)
	}
	dup := do("POST", "/orders", "alice", "order-1")
	if dup.Code != http.StatusAccepted || dup.Header().Get("Location") != loc || dup.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("duplicate: %d, Location %q, replayed %q; want the stored 202 with Location %q",
			dup.Code, dup.Header().Get("Location"), dup.Header().Get(idemhttp.HeaderReplayed), loc)
	}
	if n := countTasks(); n != 1 {
		t.Fatalf("%d tasks after a request and its duplicate, want 1", n)
	}
	if rec := do("GET", loc, "bob", ""); rec.Code != http.StatusNotFound {
		t.Fatalf("another principal's poll: %d, want 404", rec.Code)
	}
	if rec := do("GET", loc, "alice", ""); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"state":"pending"`) {
		t.Fatalf("poll before any consumer: %d %s, want 200 pending", rec.Code, rec.Body)
	}

	client, err := leases.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	consumer, err := tasks.NewConsumer(client, func(ctx context.Context, tx pgx.Tx, batch []tasks.Task) ([]json.RawMessage, error) {
		return make([]json.RawMessage, len(batch)), nil
	}, &tasks.Config{PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx) }()
	defer func() { stop(); <-done }()
	for {
		rec := do("GET", loc, "alice", "")
		if rec.Code == http.StatusOK && rec.Body.String() == `{"state":"done","seq":1}` {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the order never got done: last poll %d %s", rec.Code, rec.Body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
