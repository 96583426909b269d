package pgfence_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// BenchmarkFencedVsUnfencedByDriver is the fence's cost on each handle a
// service may have: it alternates an unfenced UPDATE and the same UPDATE
// fenced with a token (Exec on a pgx pool, ExecSQL on a *sql.DB of pgx's
// stdlib driver and of lib/pq), so that both see the same fsync weather, and
// reports each one's mean latency and their ratio. The goal for pgx's
// database/sql driver: a ratio within 10% of the pgx pool's. One connection,
// one writer: the fence's cost, not contention (pgfence bench compare
// measures 8 workers).
func BenchmarkFencedVsUnfencedByDriver(b *testing.B) {
	db := pgfencetest.NewDatabase(b)
	ctx := context.Background()
	const keys = 1000
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE stock (id int PRIMARY KEY, qty bigint NOT NULL);
		INSERT INTO stock SELECT g, 0 FROM generate_series(0, 999) g`); err != nil {
		b.Fatal(err)
	}
	for i := range keys {
		pgfencetest.IssueToken(b, db.Pool, "stock:"+strconv.Itoa(i), 5)
	}
	const update = `UPDATE stock SET qty = qty + 1 WHERE id = $1`
	type pair struct{ unfenced, fenced func(id int) error }
	onSQL := func(driverName, url string) pair {
		sdb := openDB(b, driverName, url)
		sdb.SetMaxOpenConns(1)
		sdb.SetMaxIdleConns(1)
		return pair{
			unfenced: func(id int) error { _, err := sdb.ExecContext(ctx, update, id); return err },
			fenced: func(id int) error {
				_, err := pgfence.ExecSQL(ctx, sdb, pgfence.LeaseOf("stock:"+strconv.Itoa(id), "", 5), update, id)
				return err
			},
		}
	}
	for _, h := range []struct {
		name string
		pair func() pair
	}{
		{"pgx-pool", func() pair {
			return pair{
				unfenced: func(id int) error { _, err := db.Pool.Exec(ctx, update, id); return err },
				fenced: func(id int) error {
					_, err := pgfence.Exec(ctx, db.Pool, pgfence.LeaseOf("stock:"+strconv.Itoa(id), "", 5), update, id)
					return err
				},
			}
		}},
		{"pgx-stdlib", func() pair { return onSQL("pgx", db.URL) }},
		// lib/pq cannot pipeline: the fenced write is a transaction of its
		// own, BEGIN, the fence, the write, COMMIT; a statement with
		// parameters takes two round trips by default (binary_parameters=yes:
		// one).
		{"lib-pq", func() pair { return onSQL("postgres", db.URL) }},
		{"lib-pq-binary", func() pair { return onSQL("postgres", db.URL+"&binary_parameters=yes") }},
	} {
		b.Run(h.name, func(b *testing.B) {
			p := h.pair()
			for i := range keys { // every statement prepared, every row warm
				if err := errors.Join(p.unfenced(i), p.fenced(i)); err != nil {
					b.Fatal(err)
				}
			}
			var tu, tf time.Duration
			for i := 0; b.Loop(); i++ {
				start := time.Now()
				if err := p.unfenced(i % keys); err != nil {
					b.Fatal(err)
				}
				mid := time.Now()
				if err := p.fenced(i % keys); err != nil {
					b.Fatal(err)
				}
				tu += mid.Sub(start)
				tf += time.Since(mid)
			}
			b.ReportMetric(float64(tu.Nanoseconds())/float64(b.N), "unfenced-ns/op")
			b.ReportMetric(float64(tf.Nanoseconds())/float64(b.N), "fenced-ns/op")
			b.ReportMetric(float64(tf)/float64(tu), "ratio")
		})
	}
}
