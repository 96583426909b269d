// Package tracesql stores the current trace id beside the rows pgfence writes
// (lease events, accepted tokens, idempotency keys, rejections): it sends, in
// the same pipeline as the statement that writes them, the statement that
// names the trace for the transaction, so tracing adds no round trip.
package tracesql

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/telemetry"
)

// SetTraceIDSQL names the trace for the rest of the current transaction
// (pgfence.current_trace_id() reads it).
const SetTraceIDSQL = `SELECT pg_catalog.set_config('pgfence.trace_id', $1, true)`

// Queue queues SetTraceIDSQL on b when ctx carries a trace id and reports
// whether it did.
func Queue(ctx context.Context, b *pgx.Batch) bool {
	id := telemetry.TraceID(ctx)
	if id == "" {
		return false
	}
	b.Queue(SetTraceIDSQL, id)
	return true
}

// Querier is a pool, a connection, or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// batcher is the part of [*pgxpool.Pool], [*pgx.Conn] and [pgx.Tx] that sends
// a pipeline.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// QueryRow is q.QueryRow, preceded in the same pipeline (one implicit
// transaction on a pool or connection, no extra round trip) by
// SetTraceIDSQL when ctx carries a trace id and q can send a pipeline.
func QueryRow(ctx context.Context, q Querier, sql string, args ...any) pgx.Row {
	b, ok := q.(batcher)
	if !ok {
		return q.QueryRow(ctx, sql, args...)
	}
	batch := &pgx.Batch{}
	if !Queue(ctx, batch) {
		return q.QueryRow(ctx, sql, args...)
	}
	batch.Queue(sql, args...)
	return row{b.SendBatch(ctx, batch)}
}

// row is the second statement's row of a two-statement batch.
type row struct{ br pgx.BatchResults }

func (r row) Scan(dest ...any) error {
	_, err := r.br.Exec()
	if err == nil {
		err = r.br.QueryRow().Scan(dest...)
	}
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}
