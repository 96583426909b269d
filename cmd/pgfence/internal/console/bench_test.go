package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// BenchmarkQueries runs every page's statements, and every page, on 10^5
// leases, 10^6 lease events, 10^5 fences and 10^5 idempotency keys, as a
// member of pgfence_app with one prefix granted (row-level security on):
//
//	go test ./cmd/pgfence/internal/console -run '^$' -bench Queries -benchtime 20x
//
// Seeding takes about a minute.
func BenchmarkQueries(b *testing.B) {
	ctx := context.Background()
	db := pgfencetest.NewDatabase(b)
	pool := seed(b, db, 100_000)
	s, err := New(ctx, &Config{Pool: pool})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const key = "orders:0050000"
	page := func(l string, prefix string, q map[string]string) func() error {
		for _, x := range lists {
			if x.name == l {
				return func() error { _, _, _, err := x.fetch(s, ctx, prefix, q); return err }
			}
		}
		panic(l)
	}
	rows := func(sql string, args ...any) func() error {
		return func() error {
			_, err := collect(ctx, pool, func(row pgx.CollectableRow) (struct{}, error) { return struct{}{}, nil }, sql, args...)
			return err
		}
	}
	for _, q := range []struct {
		name string
		run  func() error
	}{
		{"overview/holders", func() error {
			var now time.Time
			if err := pool.QueryRow(ctx, sqlNow).Scan(&now); err != nil {
				return err
			}
			return rows(sqlHolders, now, overviewRows)()
		}},
		{"overview/waiters", rows(sqlWaiters, overviewRows)},
		{"overview/pauses", func() error { _, err := s.leases.Pauses(ctx); return err }},
		{"overview/rejections", rows(sqlRecentRejections, overviewRows)},
		{"overview/abandoned", func() error {
			_, err := s.store.Abandoned(ctx, pool, &idempotency.RecoverOptions{Limit: overviewRows})
			return err
		}},
		{"key/lease", func() error { _, err := s.leases.Get(ctx, key); return err }},
		{"key/history", func() error { _, err := s.leases.History(ctx, key, timelineEvents); return err }},
		{"key/rejections", func() error { _, err := pgfence.Rejections(ctx, pool, key, timelineEvents); return err }},
		{"key/fence", func() error { _, err := pgfence.LookupFence(ctx, pool, key); return err }},
		{"leases/first", page("leases", "", nil)},
		{"leases/prefix", page("leases", "orders:004", nil)},
		{"leases/next", page("leases", "orders:", map[string]string{"after": "orders:0060000"})},
		{"fences/prefix", page("fences", "orders:004", nil)},
		{"keys/prefix", page("keys", "orders:004", nil)},
		{"keys/next", page("keys", "orders:", map[string]string{"after": "orders:0060000", "after_key": "k"})},
		{"elections/prefix", page("elections", "orders:004", nil)},
	} {
		b.Run(q.name, func(b *testing.B) {
			for b.Loop() {
				if err := q.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	s.cfg.Doctor = nil // the doctor's checks are its own command's
	for _, p := range []struct{ name, path string }{
		{"page/overview", "/"}, {"page/key", "/key?k=orders%3A0050000"}, {"page/leases", "/leases?prefix=orders%3A004"},
		{"page/elections", "/elections?prefix=orders%3A004"},
	} {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8089"+p.path, nil))
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d\n%s", p.path, w.Code, w.Body)
				}
			}
		})
	}
}
