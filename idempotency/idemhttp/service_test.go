package idemhttp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Two services share one database, each with a database role of its own
// granted only its own prefix: the same Idempotency-Key, route, principal
// and body sent to both runs both handlers, neither answers with the other's
// stored response, and neither role can read the other's keys.
func TestServicesKeptApart(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		db := pgfencetest.NewDatabase(t)
		createOrders(t, db.Pool)
		serve := func(service string) (*httptest.Server, *pgxpool.Pool) {
			pool := serviceRole(t, db, service+"/")
			mw := newMiddleware(t, newStore(t, nil), pool, &idemhttp.Config{Mode: mode, Principal: byUser, Service: service})
			if got := mw.ScopePrefix(); got != service+"/http:" {
				t.Fatalf("ScopePrefix() = %q, want %q", got, service+"/http:")
			}
			mux := http.NewServeMux()
			mux.Handle("POST /orders/{id}", mw.Wrap(&orderAPI{pool: pool}))
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			return srv, pool
		}
		orders, ordersPool := serve("orders")
		billing, billingPool := serve("billing")

		a := send(t, orders, "POST", "/orders/1", `"same"`, `{"qty":1}`)
		b := send(t, billing, "POST", "/orders/1", `"same"`, `{"qty":1}`)
		if a.status != http.StatusCreated || b.status != http.StatusCreated || b.replayed() || a.body == b.body {
			t.Fatalf("orders %+v, billing %+v: each service must run its own handler", a, b)
		}
		if r := send(t, billing, "POST", "/orders/1", `"same"`, `{"qty":1}`); !r.replayed() || r.body != b.body {
			t.Fatalf("billing's replay %+v, want its own stored response", r)
		}
		for service, pool := range map[string]*pgxpool.Pool{"orders": ordersPool, "billing": billingPool} {
			rows, err := pool.Query(context.Background(), `SELECT scope FROM pgfence.idempotency_keys`)
			if err != nil {
				t.Fatal(err)
			}
			scopes, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if len(scopes) != 1 || !strings.HasPrefix(scopes[0], service+"/http:") {
				t.Errorf("%s's role reads the keys %q, want its own one only", service, scopes)
			}
		}
	})
}

// A Service that would not make a prefix of its own is refused.
func TestServiceNameRefused(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	for _, service := range []string{"a/b", strings.Repeat("s", 65), "nul\x00", "\xff"} {
		if _, err := idemhttp.New(newStore(t, nil), pool, &idemhttp.Config{Principal: byUser, Service: service}); !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("Service %q: %v, want ErrInvalid", service, err)
		}
	}
}

// serviceRole creates a LOGIN role that is a member of pgfence_app, may use
// the names under prefix and write the orders table, and returns a pool
// connected as it.
func serviceRole(t *testing.T, db *pgfencetest.Database, prefix string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "pgfence_t_svc_" + hex.EncodeToString(b[:])
	id := pgx.Identifier{name}.Sanitize()
	for _, q := range []string{
		`CREATE ROLE ` + id + ` LOGIN PASSWORD 'pgfence-test' IN ROLE pgfence_app`,
		`GRANT SELECT, INSERT ON orders TO ` + id,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, $2)`, name, prefix); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = name, "pgfence-test"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+id+` CASCADE`)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+id)
	})
	return pool
}
