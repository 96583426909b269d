package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestStoreFailures: a store that cannot be reached answers 503 with
// Retry-After: 1, a store that fails otherwise (no pgfence schema) 500; in
// neither case does the handler run.
func TestStoreFailures(t *testing.T) {
	forModes(t, func(t *testing.T, mode idemhttp.Mode) {
		store := newStore(t, nil)
		down, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
		if err != nil {
			t.Fatal(err)
		}
		defer down.Close()
		broken := pgfencetest.NewPool(t)
		if _, err := broken.Exec(context.Background(), `DROP SCHEMA pgfence CASCADE`); err != nil {
			t.Fatal(err)
		}
		ran := false
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran = true })
		for _, c := range []struct {
			db         *pgxpool.Pool
			status     int
			retryAfter string
		}{{down, http.StatusServiceUnavailable, "1"}, {broken, http.StatusInternalServerError, ""}} {
			mw := newMiddleware(t, store, c.db, &idemhttp.Config{Mode: mode, Principal: byUser})
			req := httptest.NewRequest(http.MethodPost, "/jobs", strings.NewReader("{}"))
			req.Header.Set(idemhttp.HeaderKey, "job-1")
			req.Header.Set("X-User", "alice")
			rec := httptest.NewRecorder()
			mw.Wrap(handler).ServeHTTP(rec, req)
			if rec.Code != c.status || rec.Header().Get("Retry-After") != c.retryAfter || ran {
				t.Errorf("status %d, Retry-After %q, handler ran %v; want %d, %q, not run",
					rec.Code, rec.Header().Get("Retry-After"), ran, c.status, c.retryAfter)
			}
		}
	})
}
