package bench

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// statementCounter is a pgx tracer that counts the statements a pool sends:
// every query, every Exec (BEGIN and COMMIT included) and every statement
// queued in a batch or pipeline. The bench divides it by the operations.
type statementCounter struct{ n atomic.Int64 }

var (
	_ pgx.QueryTracer = (*statementCounter)(nil)
	_ pgx.BatchTracer = (*statementCounter)(nil)
)

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if data.Batch != nil {
		c.n.Add(int64(data.Batch.Len()))
	}
	return ctx
}

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Load returns the statements counted so far.
func (c *statementCounter) Load() int64 { return c.n.Load() }
