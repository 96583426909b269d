package pgfence_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Run with, e.g.:
//
//	go test -run '^$' -bench . -benchtime 2000x ./pgfence/
//
// Every write is one durable commit, so the figures are dominated by fsync and
// vary with the disk; compare sub-benchmarks of one run, not runs.

const benchKeys = 1000

// benchTable creates kv with benchKeys rows; the leases of their resources
// (kv:k0 …) have issued every token up to madeUp.
func benchTable(b *testing.B) *pgfencetest.Database {
	db := pgfencetest.NewDatabase(b)
	mustExec(b, db.Pool, `CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL, token bigint NOT NULL)`)
	mustExec(b, db.Pool, `INSERT INTO kv SELECT 'k' || i, 'init', 0 FROM generate_series(0, $1 - 1) i`, benchKeys)
	for i := range benchKeys {
		issue(b, db.Pool, "kv:k"+strconv.Itoa(i))
	}
	return db
}

const benchUpdate = `UPDATE kv SET v = $1, token = $2 WHERE k = $3`

// BenchmarkWrite compares the same single-row UPDATE unfenced, fenced in one
// round trip (Exec), and fenced in an explicit transaction (Write).
func BenchmarkWrite(b *testing.B) {
	ctx := context.Background()
	db := benchTable(b)
	pool := db.Pool
	var token atomic.Int64
	token.Store(1)
	ops := map[string]func(i int) error{
		"unfenced": func(i int) error {
			k := "k" + strconv.Itoa(i%benchKeys)
			_, err := pool.Exec(ctx, benchUpdate, "v", token.Add(1), k)
			return err
		},
		"fenced-exec": func(i int) error {
			k := "k" + strconv.Itoa(i%benchKeys)
			t := token.Add(1)
			_, err := pgfence.Exec(ctx, pool, pgfence.LeaseOf("kv:"+k, "", t), benchUpdate, "v", t, k)
			return err
		},
		"fenced-write": func(i int) error {
			k := "k" + strconv.Itoa(i%benchKeys)
			t := token.Add(1)
			_, err := pgfence.Write(ctx, pool, pgfence.LeaseOf("kv:"+k, "", t), func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, benchUpdate, "v", t, k)
				return err
			})
			return err
		},
	}
	for _, name := range []string{"unfenced", "fenced-exec", "fenced-write"} {
		op := ops[name]
		for i := range benchKeys { // warm the fence rows and statement caches
			if err := op(i); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if err := op(i); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/parallel8", func(b *testing.B) {
			// Each writer has its own keys (its residue mod 8; benchKeys is a
			// multiple of 8), so its tokens reach each key in order.
			var writers atomic.Int64
			b.SetParallelism(4) // 4 x GOMAXPROCS(2) = 8 writers
			b.RunParallel(func(pb *testing.PB) {
				g := int(writers.Add(1)-1) % 8
				for j := 0; pb.Next(); j++ {
					if err := op(g + 8*j); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkFencedVsUnfenced alternates the unfenced UPDATE and the same UPDATE
// fenced with Exec on one connection, so that both see the same fsync weather,
// and reports each one's mean latency and their ratio (goal: <= 1.15).
func BenchmarkFencedVsUnfenced(b *testing.B) {
	ctx := context.Background()
	db := benchTable(b)
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	c := conn.Conn()
	var token int64 = 1
	unfenced := func(i int) error {
		token++
		_, err := c.Exec(ctx, benchUpdate, "v", token, "k"+strconv.Itoa(i%benchKeys))
		return err
	}
	fenced := func(i int) error {
		token++
		k := "k" + strconv.Itoa(i%benchKeys)
		_, err := pgfence.Exec(ctx, c, pgfence.LeaseOf("kv:"+k, "", token), benchUpdate, "v", token, k)
		return err
	}
	for i := range benchKeys {
		if err := errors.Join(unfenced(i), fenced(i)); err != nil {
			b.Fatal(err)
		}
	}
	var tu, tf time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		if err := unfenced(i); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := fenced(i); err != nil {
			b.Fatal(err)
		}
		tu += mid.Sub(start)
		tf += time.Since(mid)
	}
	b.ReportMetric(float64(tu.Nanoseconds())/float64(b.N), "unfenced-ns/op")
	b.ReportMetric(float64(tf.Nanoseconds())/float64(b.N), "fenced-ns/op")
	b.ReportMetric(float64(tf)/float64(tu), "ratio")
}

// BenchmarkLeaseChecked is the same UPDATE checked against a live lease.
func BenchmarkLeaseChecked(b *testing.B) {
	ctx := context.Background()
	db := benchTable(b)
	l := grant(b, db.Pool, "job")
	for i := 0; b.Loop(); i++ {
		if _, err := pgfence.Exec(ctx, db.Pool, pgfence.Checked(l.lease()), benchUpdate, "v", int64(i), "k"+strconv.Itoa(i%benchKeys)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProtectedRows measures the guard trigger per row: one fenced
// statement updates 100 rows of one resource, on a protected and an
// unprotected table. The rows/s metric is the one to compare.
func BenchmarkProtectedRows(b *testing.B) {
	ctx := context.Background()
	const rows = 100
	for _, protected := range []bool{false, true} {
		name := map[bool]string{false: "unprotected", true: "protected"}[protected]
		b.Run(name, func(b *testing.B) {
			db := pgfencetest.NewDatabase(b)
			mustExec(b, db.Pool, `CREATE TABLE items (id int PRIMARY KEY, tenant text NOT NULL, n int NOT NULL)`)
			mustExec(b, db.Pool, `INSERT INTO items SELECT i, 't' || (i / $1), 0 FROM generate_series(0, 10 * $1 - 1) i`, rows)
			for i := range 10 {
				issue(b, db.Pool, "tenant:t"+strconv.Itoa(i))
			}
			if protected {
				if err := pgfence.Protect(ctx, db.Pool, pgx.Identifier{"items"}, "tenant", "tenant:"); err != nil {
					b.Fatal(err)
				}
			}
			var token int64 = 1
			for i := 0; b.Loop(); i++ {
				tenant := "t" + strconv.Itoa(i%10)
				token++
				n, err := pgfence.Exec(ctx, db.Pool, pgfence.LeaseOf("tenant:"+tenant, "", token), `UPDATE items SET n = n + 1 WHERE tenant = $1`, tenant)
				if err != nil || n != rows {
					b.Fatal(n, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*rows), "ns/row")
		})
	}
}
