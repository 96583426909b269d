// Command metrics shows pgfence's OpenTelemetry metrics moving under
// contention, and the audit trail that joins a lease grant to the write it
// protected through the trace id stored beside both.
//
// Four workers increment one counter row, each increment under the lease on
// the counter, fenced with the lease's token and deduplicated by an
// idempotency key in the same transaction (every request is sent twice). After every round the
// program prints the metrics, as an OpenTelemetry exporter would see them
// (an SDK MeterProvider with a manual reader, installed as the global
// provider, printed in a compact text form).
// Then one worker freezes past its lease: it is taken over, its late write is
// rejected and its late release finds the key granted to another since: the
// takeovers, stale_token and not_held series move.
//
// Run it:
//
//	go run ./examples/metrics                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/metrics
//
// It exits non-zero if the counter differs from the number of accepted
// writes, if the late write or release was not refused, or if the last write
// cannot be joined to its grant; its test also checks every metric series
// against what happened.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	key       = "counter/1" // the lease key and the fenced resource
	workers   = 4
	rounds    = 3
	perRound  = 3 // increments per worker per round
	ttl       = 2 * time.Second
	pausedTTL = 200 * time.Millisecond
)

func main() {
	reader, shutdown := setupTelemetry()
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("metrics", func(ctx context.Context, db *pgfencetest.Database) error {
		defer shutdown()
		_, err := run(ctx, db.Pool, reader, os.Stdout)
		return err
	})
}

// setupTelemetry installs the global OpenTelemetry providers, as an
// application does once, at start: the metrics go to a manual reader that run
// prints after every round, and spans are recorded (only their trace ids
// matter: they are stored beside lease events and writes). pgfence's writes,
// the leases client and the idempotency store all report to them. The
// returned function shuts them down.
func setupTelemetry() (*sdkmetric.ManualReader, func()) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tp := sdktrace.NewTracerProvider()
	otel.SetMeterProvider(mp)
	otel.SetTracerProvider(tp)
	return reader, func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	}
}

// result is what happened, checked by main_test.go against the database and
// the metrics.
type result struct {
	Counter      int64 // the counter row at the end
	Accepted     int64 // increments that committed
	Replays      int64 // duplicate requests answered from the store
	StaleWrite   bool  // the frozen worker's late write was rejected
	StaleRelease bool  // its late release found the key held by another
	Metrics      metricdata.ResourceMetrics
	AuditEvent   string // the lease event joined to the last write by trace id
	AuditToken   int64  // its token, equal to the accepted write's token
	WriteToken   int64
}

// run runs the example; the metrics it prints are read from reader, the
// global meter provider's (setupTelemetry).
func run(ctx context.Context, pool *pgxpool.Pool, reader *sdkmetric.ManualReader, out io.Writer) (res result, err error) {
	tracer := otel.Tracer("examples/metrics")

	if _, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS example_counter;
		CREATE TABLE example_counter (id int PRIMARY KEY, n bigint NOT NULL, token bigint NOT NULL);
		INSERT INTO example_counter VALUES (1, 0, 0);`); err != nil {
		return res, err
	}
	client, err := leases.New(pool, nil) // reports to the global providers
	if err != nil {
		return res, err
	}
	defer client.Close()
	store, err := idempotency.NewStore(nil) // so does the store, and so do pgfence's writes
	if err != nil {
		return res, err
	}

	// The idempotency keys name the requests; they are kept for a day, so a
	// run id in the scope keeps reruns on the same database apart (else a
	// rerun's requests would all be replays of the previous run's, and write
	// nothing). The lease rows and accepted tokens need no run id: tokens keep
	// increasing across runs.
	runID := make([]byte, 4)
	rand.Read(runID)
	scope := "counter/run-" + hex.EncodeToString(runID)

	var mu sync.Mutex
	// increment is one request, in one trace: it takes the lease, then claims
	// the request's idempotency key, presents the lease's token and increments
	// the counter in one transaction, and releases the lease. A duplicate of a
	// request that committed gets the stored answer and writes nothing.
	increment := func(ctx context.Context, requestKey string) error {
		ctx, span := tracer.Start(ctx, "increment")
		defer span.End()
		l, err := client.Acquire(ctx, key, ttl, &leases.AcquireOptions{MaxWait: 20 * time.Second})
		if err != nil {
			return err
		}
		o, err := store.Do(ctx, pool, idempotency.Request{Scope: scope, Key: requestKey},
			func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				_, err := pgfence.Exec(ctx, tx, l,
					`UPDATE example_counter SET n = n + 1, token = $1 WHERE id = 1`, l.Token())
				return nil, err
			})
		mu.Lock()
		switch {
		case err != nil:
		case !o.Replayed:
			res.Accepted++
		case o.Replayed:
			res.Replays++
		}
		mu.Unlock()
		return errors.Join(err, l.Release(ctx))
	}

	fmt.Fprintf(out, "metrics: %d workers increment one counter under one lease, %d requests each per round, every request sent twice\n", workers, perRound)
	for round := 1; round <= rounds; round++ {
		var wg sync.WaitGroup
		errs := make(chan error, workers*perRound*2)
		for w := range workers {
			wg.Go(func() {
				for i := range perRound {
					requestKey := fmt.Sprintf("round-%d/worker-%d/%d", round, w, i)
					errs <- increment(ctx, requestKey)
					errs <- increment(ctx, requestKey) // a retried duplicate
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return res, err
			}
		}
		fmt.Fprintf(out, "\n--- after round %d\n", round)
		if err := print(ctx, out, reader, &res); err != nil {
			return res, err
		}
	}

	// A worker freezes past its lease (a GC pause, SIGSTOP): another takes
	// over and writes; the frozen one wakes up, writes and releases late.
	frozen, err := client.Acquire(ctx, key, pausedTTL, &leases.AcquireOptions{NoKeepAlive: true}) // frozen: nothing renews it
	if err != nil {
		return res, err
	}
	if err := increment(ctx, "after-the-pause"); err != nil { // waits for the expiry, takes over
		return res, err
	}
	_, err = pgfence.Exec(ctx, pool, frozen, `UPDATE example_counter SET n = n + 1, token = $1 WHERE id = 1`, frozen.Token())
	res.StaleWrite = errors.Is(err, pgfence.ErrStaleToken)
	res.StaleRelease = errors.Is(frozen.Release(ctx), pgfence.ErrLeaseLost)
	fmt.Fprintf(out, "\n--- after a worker froze past its lease (late write rejected: %v, late release refused: %v)\n", res.StaleWrite, res.StaleRelease)
	if err := print(ctx, out, reader, &res); err != nil {
		return res, err
	}

	// The audit trail: the grant and the write it protected share a trace id.
	if err := pool.QueryRow(ctx, `SELECT n FROM example_counter WHERE id = 1`).Scan(&res.Counter); err != nil {
		return res, err
	}
	err = pool.QueryRow(ctx, `SELECT e.event, e.token, f.token
  FROM pgfence.fences f JOIN pgfence.lease_events e USING (trace_id)
 WHERE f.resource = $1 AND e.event IN ('acquired', 'taken_over')`, key).Scan(&res.AuditEvent, &res.AuditToken, &res.WriteToken)
	if err != nil {
		return res, fmt.Errorf("audit join: %w", err)
	}
	fmt.Fprintf(out, "\naudit: the last accepted write (token %d) joins, by trace id, the lease event %q with token %d\n",
		res.WriteToken, res.AuditEvent, res.AuditToken)
	fmt.Fprintf(out, "counter = %d, accepted writes = %d, replayed duplicates = %d\n", res.Counter, res.Accepted, res.Replays)
	if res.Counter != res.Accepted || !res.StaleWrite || !res.StaleRelease || res.AuditToken != res.WriteToken {
		return res, errors.New("the counter, the rejections or the audit trail are wrong")
	}
	return res, nil
}

// print collects the metrics and writes one line per data point:
// counters as their value, histograms as count and mean.
func print(ctx context.Context, out io.Writer, reader *sdkmetric.ManualReader, res *result) error {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	res.Metrics = rm
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s%s %d", m.Name, labels(dp.Attributes), dp.Value))
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s%s count=%d mean=%.1fms", m.Name, labels(dp.Attributes),
						dp.Count, 1000*dp.Sum/float64(max(dp.Count, 1))))
				}
			}
		}
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Fprintln(out, "  "+l)
	}
	return nil
}

func labels(set attribute.Set) string {
	if set.Len() == 0 {
		return ""
	}
	var kv []string
	for _, a := range set.ToSlice() {
		kv = append(kv, strings.TrimPrefix(string(a.Key), "pgfence.")+"="+a.Value.String())
	}
	return "{" + strings.Join(kv, ",") + "}"
}
