package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/idempotency/idemhttp"
)

// The HTTP cases serve a POST in process (no network: the difference is what
// the middleware adds) with a handler that inserts one order. The raw case
// inserts in its own transaction; the idempotent one inserts in the
// middleware's transaction, which stores the response in the same commit.
func httpCases() []*Case {
	return []*Case{
		{Name: "raw-http-insert", Group: "idempotency", What: "an HTTP handler (in process) inserting one order row in its own transaction (1 commit)",
			prepare: prepareHTTP(false)},
		{Name: "idempotent-http", Group: "idempotency", What: "the same handler behind idemhttp in atomic mode: a new Idempotency-Key, the insert and the stored response in one commit",
			prepare: prepareHTTP(true)},
	}
}

func prepareHTTP(idempotent bool) func(context.Context, *Lab, int) (benchrun.Op, func(), error) {
	return func(_ context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
		var handler http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			item, err := strconv.Atoi(r.URL.Query().Get("item"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			insert := func(tx pgx.Tx) error {
				_, err := tx.Exec(r.Context(), sqlInsert, item)
				return err
			}
			if tx := idemhttp.Tx(r.Context()); tx != nil {
				err = insert(tx)
			} else {
				err = pgx.BeginFunc(r.Context(), lab.pool, insert)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"item":%d}`, item)
		})
		if idempotent {
			store, err := idempotency.NewStore(nil)
			if err != nil {
				return nil, nil, err
			}
			mw, err := idemhttp.New(store, lab.pool, &idemhttp.Config{
				Principal: func(*http.Request) string { return "bench" },
				Route:     func(*http.Request) string { return "POST /orders" },
			})
			if err != nil {
				return nil, nil, err
			}
			handler = mw.Wrap(handler)
		}
		var seq atomic.Int64
		run := strconv.FormatInt(time.Now().UnixNano(), 36) // new keys in every run and measurement
		return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders?item="+strconv.Itoa(w.Key()), strings.NewReader(`{"qty": 1}`))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", `"`+run+"-"+strconv.FormatInt(seq.Add(1), 10)+`"`)
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, r)
			if rec.Code != http.StatusCreated {
				return 0, fmt.Errorf("POST /orders: %d %s", rec.Code, strings.TrimSpace(rec.Body.String()))
			}
			return 0, nil
		}, func() {}, nil
	}
}
