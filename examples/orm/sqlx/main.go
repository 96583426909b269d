// Command sqlx is an idempotent HTTP handler written with sqlx: the
// Idempotency-Key claim (idempotency.Store.DoSQL), a fenced stock deduction
// (pgfence.WriteSQL) and the order row are one sqlx transaction, so a retried
// request creates one order, and an instance whose lease was taken over
// writes nothing.
//
// Two instances of the order API serve the same database. Instance A holds
// the lease on the SKU and freezes past its expiry; instance B takes the
// lease over. The client sends an order to B and retries it: one order, the
// retry gets the stored response (Idempotent-Replayed: true). It sends
// another order to A, which is stale: 409, nothing written, the key left
// free; the client retries that order at B: created once.
//
// Run it from examples/orm:
//
//	go run ./sqlx                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./sqlx
package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jmoiron/sqlx"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	sku          = "sku-1"
	initialStock = 10
	leaseTTL     = 300 * time.Millisecond
)

func main() {
	pgfencetest.Run("sqlx", func(ctx context.Context, db *pgfencetest.Database) error {
		res, err := run(ctx, db.URL, os.Stdout)
		if err == nil && !res.ok() {
			err = fmt.Errorf("invariant broken: %+v", res)
		}
		return err
	})
}

// orderRequest is the body of POST /orders.
type orderRequest struct {
	Quantity int `json:"quantity"`
}

// api is one instance of the order API: its database handle and the lease
// it holds on the SKU.
type api struct {
	db    *sqlx.DB
	store *idempotency.Store
	lease pgfence.Lease
	name  string
}

// ServeHTTP handles POST /orders with an Idempotency-Key header.
func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, err := io.ReadAll(r.Body)
	var req orderRequest
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	key := r.Header.Get("Idempotency-Key")
	if err != nil || key == "" || req.Quantity <= 0 {
		http.Error(w, "a JSON body with a positive quantity and an Idempotency-Key header", http.StatusBadRequest)
		return
	}
	tx, err := a.db.BeginTxx(ctx, nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer tx.Rollback() //nolint:errcheck // after Commit: sql.ErrTxDone
	// The claim, the fenced deduction and the order share sqlx's
	// transaction: DoSQL and pgfence.WriteSQL take the *sql.Tx it wraps and
	// run in savepoints of it; the handler's own statements keep using tx.
	out, err := a.store.DoSQL(ctx, tx.Tx, idempotency.Request{Scope: "orders", Key: key, Payload: body}, func(ctx context.Context, _ *sql.Tx) ([]byte, error) {
		var id int64
		_, err := pgfence.WriteSQL(ctx, tx.Tx, a.lease, func(ctx context.Context, _ *sql.Tx) error {
			res, err := tx.ExecContext(ctx, `UPDATE example_sqlx_items SET stock = stock - $2 WHERE sku = $1 AND stock >= $2`, sku, req.Quantity)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return errors.Join(err, errors.New("out of stock"))
			}
			return tx.GetContext(ctx, &id, `INSERT INTO example_sqlx_orders (sku, quantity, instance) VALUES ($1, $2, $3) RETURNING id`, sku, req.Quantity, a.name)
		})
		if err != nil {
			return nil, err
		}
		return json.Marshal(map[string]any{"order": id, "quantity": req.Quantity})
	})
	switch {
	case errors.Is(err, pgfence.ErrStaleToken), errors.Is(err, pgfence.ErrLeaseLost):
		// This instance's lease was taken over: nothing was written and the
		// key is free, so the client may retry elsewhere.
		http.Error(w, "this instance no longer holds the lease: "+err.Error(), http.StatusConflict)
		return
	case errors.Is(err, idempotency.ErrMismatch):
		http.Error(w, "the key was used with another body", http.StatusUnprocessableEntity)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	if err := tx.Commit(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	if out.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(out.Result)
}

// result is the business outcome, checked by main_test.go.
type result struct {
	FinalStock int
	Orders     map[string]int // orders stored, by instance
	Replayed   int            // responses with Idempotent-Replayed: true
	Conflicts  int            // 409s from the stale instance
}

func (r result) ok() bool {
	return r.FinalStock == initialStock-4 && r.Orders["A"] == 0 && r.Orders["B"] == 2 && r.Replayed == 1 && r.Conflicts == 1
}

func run(ctx context.Context, url string, out io.Writer) (result, error) {
	res := result{Orders: map[string]int{}}
	db, err := sqlx.Open("pgx", url)
	if err != nil {
		return res, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `
		DROP TABLE IF EXISTS example_sqlx_orders, example_sqlx_items;
		CREATE TABLE example_sqlx_items (sku text PRIMARY KEY, stock int NOT NULL);
		CREATE TABLE example_sqlx_orders (id serial PRIMARY KEY, sku text NOT NULL, quantity int NOT NULL, instance text NOT NULL);
		INSERT INTO example_sqlx_items VALUES ('sku-1', 10)`); err != nil {
		return res, err
	}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		return res, err
	}
	run := time.Now().UnixNano() // keys of earlier runs on the same database do not replay

	la, err := acquire(ctx, db, "stock:"+sku)
	if err != nil {
		return res, err
	}
	fmt.Fprintf(out, "  instance A holds the lease (token %d) and freezes\n", la.Token())
	time.Sleep(leaseTTL + 200*time.Millisecond)
	lb, err := acquire(ctx, db, "stock:"+sku)
	if err != nil {
		return res, err
	}
	fmt.Fprintf(out, "  instance B took the lease over (token %d)\n", lb.Token())
	a := httptest.NewServer(&api{db: db, store: store, lease: la, name: "A"})
	defer a.Close()
	b := httptest.NewServer(&api{db: db, store: store, lease: lb, name: "B"})
	defer b.Close()

	post := func(name string, srv *httptest.Server, key string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", bytes.NewReader([]byte(`{"quantity": 2}`)))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		replayed := resp.Header.Get("Idempotent-Replayed") == "true"
		if replayed {
			res.Replayed++
		}
		if resp.StatusCode == http.StatusConflict {
			res.Conflicts++
		}
		fmt.Fprintf(out, "  POST /orders to %s, key ...%s: %d replayed=%v %s\n", name, key[len(key)-2:], resp.StatusCode, replayed, bytes.TrimSpace(body))
		return resp.StatusCode, nil
	}
	k1, k2 := fmt.Sprintf("%d-k1", run), fmt.Sprintf("%d-k2", run)
	for _, step := range []struct {
		name string
		srv  *httptest.Server
		key  string
		want int
	}{
		{"B", b, k1, http.StatusCreated},  // a new order at B
		{"B", b, k1, http.StatusCreated},  // its retry: the stored response
		{"A", a, k2, http.StatusConflict}, // another order at the stale A: refused
		{"B", b, k2, http.StatusCreated},  // retried at B: created once
	} {
		code, err := post(step.name, step.srv, step.key)
		if err != nil {
			return res, err
		}
		if code != step.want {
			return res, fmt.Errorf("status %d, want %d", code, step.want)
		}
	}

	if err := db.GetContext(ctx, &res.FinalStock, `SELECT stock FROM example_sqlx_items WHERE sku = $1`, sku); err != nil {
		return res, err
	}
	rows := []struct {
		Instance string `db:"instance"`
		N        int    `db:"n"`
	}{}
	if err := db.SelectContext(ctx, &rows, `SELECT instance, pg_catalog.count(*) AS n FROM example_sqlx_orders GROUP BY instance`); err != nil {
		return res, err
	}
	for _, r := range rows {
		res.Orders[r.Instance] = r.N
	}
	fmt.Fprintf(out, "  stock %d (from %d), orders by instance %v\n", res.FinalStock, initialStock, res.Orders)
	return res, nil
}

// acquire grants the lease on key through SQL (autocommit) and wraps the
// grant for pgfence.WriteSQL.
func acquire(ctx context.Context, db *sqlx.DB, key string) (pgfence.Lease, error) {
	var g struct {
		Acquired bool           `db:"acquired"`
		Holder   sql.NullString `db:"holder"`
		Token    sql.NullInt64  `db:"token"`
	}
	if err := db.GetContext(ctx, &g, `SELECT acquired, holder::pg_catalog.text AS holder, token FROM pgfence.try_acquire($1, $2::pg_catalog.interval)`, key, leaseTTL.String()); err != nil {
		return nil, err
	}
	if !g.Acquired {
		return nil, fmt.Errorf("lease %s is held", key)
	}
	return pgfence.LeaseOf(key, g.Holder.String, g.Token.Int64), nil
}
