package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// BenchmarkAtomicMiddleware compares one order request (a handler that
// INSERTs one row) served three ways, each with a fresh Idempotency-Key:
//
//	autocommit  the handler without the middleware, its INSERT on its own
//	            (1 statement, 1 commit)
//	tx          the handler without the middleware, its INSERT in a
//	            transaction (BEGIN, INSERT, COMMIT)
//	atomic      the handler behind the middleware in ModeAtomic (BEGIN,
//	            claim, INSERT, result + COMMIT in one pipeline)
//	do          the handler calling idempotency.Store.Do with the INSERT
//	            (the same statements; the idempotent-tx case of pgfence bench)
//
// by 1 and 8 concurrent workers, calling ServeHTTP directly (no network).
// The four run interleaved in rounds so that fsync jitter hits them alike;
// µs/op is wall time per request over all workers, p50 the median latency,
// stmts/op the statements sent per request (counted by a pgx tracer).
//
//	go test -run '^$' -bench AtomicMiddleware -benchtime 4000x ./idempotency/idemhttp
//	PGFENCE_TEST_DURABLE=1 go test -run '^$' -bench AtomicMiddleware -benchtime 4000x ./idempotency/idemhttp
func BenchmarkAtomicMiddleware(b *testing.B) {
	db := pgfencetest.NewDatabase(b)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	statements := &statementCounter{}
	cfg.ConnConfig.Tracer = statements
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	createOrders(b, pool)
	store := newStore(b, nil)
	mw := newMiddleware(b, store, pool, &idemhttp.Config{Principal: byUser})

	// The handler inserts through the key's transaction behind the
	// middleware, and through the pool (or its own transaction) without.
	handler := func(ownTx bool) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			var err error
			switch tx := idemhttp.Tx(ctx); {
			case tx != nil:
				_, err = tx.Exec(ctx, `INSERT INTO orders (body) VALUES ('x')`)
			case ownTx:
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO orders (body) VALUES ('x')`)
					return err
				})
			default:
				_, err = pool.Exec(ctx, `INSERT INTO orders (body) VALUES ('x')`)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"order":1}`))
		})
	}
	variants := []struct {
		name string
		h    http.Handler
	}{
		{"autocommit", handler(false)},
		{"tx", handler(true)},
		{"atomic", mw.Wrap(handler(false))},
		{"do", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Store.Do in the handler (the idempotent-tx case of pgfence bench).
			_, err := store.Do(r.Context(), pool, idempotency.Request{Scope: "bench", Key: r.Header.Get(idemhttp.HeaderKey)},
				func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
					_, err := tx.Exec(ctx, `INSERT INTO orders (body) VALUES ('x')`)
					return []byte(`{"order":1}`), err
				})
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})},
	}
	var seq atomic.Int64
	serve := func(h http.Handler) time.Duration {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"a-1"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", "bench")
		req.Header.Set(idemhttp.HeaderKey, strconv.FormatInt(seq.Add(1), 36))
		rec := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(rec, req)
		d := time.Since(start)
		if rec.Code != http.StatusCreated {
			b.Errorf("status %d: %s", rec.Code, rec.Body)
		}
		return d
	}
	for _, workers := range []int{1, 8} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			round := 2 * workers // requests per variant per round, over all workers: short rounds, so that the variants see the same disk
			wall := make([]time.Duration, len(variants))
			sent := make([]int64, len(variants))
			lat := make([][]time.Duration, len(variants))
			b.ResetTimer()
			for done := 0; done < b.N; done += round {
				for i, v := range variants {
					var mu sync.Mutex
					var next atomic.Int64
					var wg sync.WaitGroup
					start := time.Now()
					before := statements.n.Load()
					for range workers {
						wg.Go(func() {
							for next.Add(1) <= int64(round) {
								d := serve(v.h)
								mu.Lock()
								lat[i] = append(lat[i], d)
								mu.Unlock()
							}
						})
					}
					wg.Wait()
					wall[i] += time.Since(start)
					sent[i] += statements.n.Load() - before
				}
			}
			b.StopTimer()
			n := float64(len(lat[0]))
			for i, v := range variants {
				b.ReportMetric(float64(wall[i].Microseconds())/n, v.name+"-µs/op")
				b.ReportMetric(float64(p50(lat[i]).Microseconds()), v.name+"-p50-µs")
				b.ReportMetric(float64(sent[i])/n, v.name+"-stmts/op")
			}
			b.ReportMetric(float64(wall[2])/float64(wall[0]), "atomic/autocommit")
			b.ReportMetric(float64(wall[2])/float64(wall[1]), "atomic/tx")
		})
	}
	var keys int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pgfence.idempotency_keys`).Scan(&keys); err != nil {
		b.Fatal(err)
	}
	if orders := countOrders(b, pool); keys == 0 || orders < keys {
		b.Fatalf("%d keys, %d orders", keys, orders)
	}
}

// statementCounter counts the statements a pool sends, batched or not.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.n.Add(1)
}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func p50(ops []time.Duration) time.Duration {
	if len(ops) == 0 {
		return 0
	}
	s := slices.Clone(ops)
	slices.Sort(s)
	return s[len(s)/2]
}
