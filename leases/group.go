package leases

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// Group commit ([Config.GroupCommit]): grant attempts, and releases, that run
// at the same time in one client go to the database as one statement, so one
// commit makes all of them durable. Each call keeps its own result: a key
// held by someone else is a [HeldError] for that call only.
//
// A call never waits for a timer. When no batch of its kind is in flight it
// is sent at once, alone, by its own goroutine; otherwise it waits for that
// batch to return and goes with everything that queued meanwhile. So one
// caller alone pays nothing, and under load the batches grow with the load.
//
// A statement of the batch runs each call's SQL function, in the order of
// the keys (two batches lock their rows in one order); a batch of one call
// sends the call's own statement. If a batch of several fails with an error
// from the server, it rolled back and granted or released nothing: each call
// is sent again alone, to get its own answer. If the reply is lost, every
// call in it has an unknown outcome and is settled alone by its holder id,
// as a single grant is.
const (
	// groupInFlight is how many batches of one kind a client runs at once.
	groupInFlight = 1
	// groupMaxCalls caps the calls of one batch.
	groupMaxCalls = 64
)

// sqlTryAcquireMany runs pgfence.try_acquire for each element of the arrays,
// in their order, in one statement: one transaction, one commit.
const sqlTryAcquireMany = `SELECT a.i, g.acquired, g.holder::text, g.token, g.granted_at, g.expires_at,
       (extract(epoch FROM g.remaining) * 1000000)::bigint
  FROM unnest($1::text[], $2::bigint[], $3::text[], $4::uuid[], $5::boolean[]) WITH ORDINALITY AS a(key, ttl, info, holder, announce, i)
 CROSS JOIN LATERAL pgfence.try_acquire(a.key, a.ttl * interval '1 microsecond', a.info, a.holder, $6, a.announce) AS g
 ORDER BY a.i`

// sqlReleaseMany runs pgfence.release for each element of the arrays, in
// their order, in one statement.
const sqlReleaseMany = `SELECT a.i, r.released, r.status
  FROM unnest($1::text[], $2::uuid[], $3::bigint[]) WITH ORDINALITY AS a(key, holder, token, i)
 CROSS JOIN LATERAL pgfence.release(a.key, a.holder, a.token, $4) AS r
 ORDER BY a.i`

// errAlone marks a batch the server refused: it rolled back, and each call
// is sent again on its own.
var errAlone = errors.New("leases: the batch was refused; each call goes alone")

// A groupCall is one call waiting in a group: its request, then its reply.
type groupCall[Req, Res any] struct {
	ctx     context.Context
	req     Req
	res     Res
	err     error
	dropped bool // its context ended before its batch was sent
	done    chan struct{}
}

// group coalesces the calls of one kind (grants, or releases) of a client.
type group[Req, Res any] struct {
	c *Client
	// key orders the calls of a batch.
	key func(Req) string
	// send runs one batch and fills in each call's res, or returns an error
	// for all of them.
	send func(ctx context.Context, calls []*groupCall[Req, Res]) error

	mu       sync.Mutex
	queue    []*groupCall[Req, Res]
	inFlight int
}

// do runs req in a batch and returns its result. An error wrapping errAlone
// means the batch was refused and nothing was done: send it alone. When ctx
// ends before the reply, do returns the context's cause, and whether the
// call's batch had been sent.
func (g *group[Req, Res]) do(ctx context.Context, req Req) (res Res, sent bool, err error) {
	call := &groupCall[Req, Res]{ctx: ctx, req: req, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, call)
	var batch []*groupCall[Req, Res]
	if g.inFlight < groupInFlight {
		g.inFlight++
		batch = g.take()
	}
	g.mu.Unlock()
	if batch != nil {
		// This call leads: it sends its batch itself (no hand-off to another
		// goroutine when it is alone), and leaves what queued meanwhile to
		// a goroutine of its own.
		if len(batch) > 0 {
			g.sendBatch(batch)
		}
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.inFlight--
		} else {
			go g.run(g.take())
		}
		g.mu.Unlock()
	}
	select {
	case <-call.done:
	case <-ctx.Done():
		g.mu.Lock()
		if i := slices.Index(g.queue, call); i >= 0 {
			g.queue = slices.Delete(g.queue, i, i+1)
			g.mu.Unlock()
			return res, false, context.Cause(ctx)
		}
		g.mu.Unlock()
		select {
		case <-call.done: // answered, or dropped, meanwhile
		default:
			return res, true, context.Cause(ctx) // its batch is on its way
		}
	}
	return call.res, !call.dropped, call.err
}

// take removes the next batch from the queue: its first groupMaxCalls calls
// whose context has not ended, in key order. g.mu is held.
func (g *group[Req, Res]) take() []*groupCall[Req, Res] {
	n := min(len(g.queue), groupMaxCalls)
	batch := slices.Clone(g.queue[:n])
	g.queue = slices.Delete(g.queue, 0, n)
	batch = slices.DeleteFunc(batch, func(c *groupCall[Req, Res]) bool {
		if c.ctx.Err() == nil {
			return false
		}
		c.err, c.dropped = context.Cause(c.ctx), true
		close(c.done)
		return true
	})
	slices.SortStableFunc(batch, func(a, b *groupCall[Req, Res]) int { return strings.Compare(g.key(a.req), g.key(b.req)) })
	return batch
}

// run sends batch, then the batches that queued while it ran, until the
// queue is empty.
func (g *group[Req, Res]) run(batch []*groupCall[Req, Res]) {
	for {
		if len(batch) > 0 {
			g.sendBatch(batch)
		}
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.inFlight--
			g.mu.Unlock()
			return
		}
		batch = g.take()
		g.mu.Unlock()
	}
}

// sendBatch sends one batch and answers its calls. The batch's context ends
// when every call's context has ended: nobody waits for it any more. Close
// does not end it: a lease may be released after Close, and the background
// settlement of a lost grant releases what it finds.
func (g *group[Req, Res]) sendBatch(batch []*groupCall[Req, Res]) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var mu sync.Mutex
	waiting := len(batch)
	for _, call := range batch {
		stop := context.AfterFunc(call.ctx, func() {
			mu.Lock()
			defer mu.Unlock()
			if waiting--; waiting == 0 {
				cancel(context.Cause(call.ctx))
			}
		})
		defer stop()
	}
	err := g.send(ctx, batch)
	for _, call := range batch {
		if err != nil {
			call.err = err
		}
		close(call.done)
	}
}

// batchError marks the error of a batch statement that the server refused:
// it rolled back (errAlone: send each call alone). Any other error is
// returned as it is, for each call to classify: the batch may have
// committed without its reply, or not have been sent.
func batchError(err error) error {
	if pgerr.PgError(err) != nil && !pgerr.IsConnectionError(err) {
		return fmt.Errorf("%w: %w", errAlone, err)
	}
	return err
}

// A grantRequest is one grant attempt of a batch.
type grantRequest struct {
	key, holder, info string
	ttl               time.Duration
	announce          bool
}

// A grantReply is what try_acquire answered for one attempt.
type grantReply struct {
	acquired           bool
	holder             *string
	token              *int64
	granted, expiresAt *time.Time
	remainingMicros    int64
}

func (c *Client) sendGrants(ctx context.Context, calls []*groupCall[grantRequest, grantReply]) error {
	n := len(calls)
	keys, holders, infos := make([]string, n), make([]string, n), make([]string, n)
	ttls, announce := make([]int64, n), make([]bool, n)
	for i, call := range calls {
		r := call.req
		keys[i], holders[i], infos[i], ttls[i], announce[i] = r.key, r.holder, r.info, r.ttl.Microseconds(), r.announce
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if n == 1 {
		// Alone: the single statement, which costs less than the arrays.
		r := &calls[0].res
		return conn.QueryRow(ctx, sqlTryAcquire, keys[0], ttls[0], infos[0], holders[0], ClientVersion(), announce[0]).
			Scan(&r.acquired, &r.holder, &r.token, &r.granted, &r.expiresAt, &r.remainingMicros)
	}
	rows, err := conn.Query(ctx, sqlTryAcquireMany, keys, ttls, infos, holders, announce, ClientVersion())
	if err != nil {
		return batchError(err)
	}
	got := 0
	for rows.Next() {
		var i int64
		var r grantReply
		if err := rows.Scan(&i, &r.acquired, &r.holder, &r.token, &r.granted, &r.expiresAt, &r.remainingMicros); err != nil {
			rows.Close()
			return batchError(err)
		}
		if i < 1 || i > int64(n) {
			rows.Close()
			return fmt.Errorf("leases: a batch of %d grants answered for attempt %d", n, i)
		}
		calls[i-1].res = r
		got++
	}
	// The statement commits when its rows are done: an error here leaves
	// every attempt's outcome unknown, even after their rows came.
	if err := rows.Err(); err != nil {
		return batchError(err)
	}
	if got != n {
		return fmt.Errorf("leases: a batch of %d grants answered %d: %w", n, got, ErrOutcomeUnknown)
	}
	return nil
}

// A releaseRequest is one release of a batch.
type releaseRequest struct {
	key, holder string
	token       int64
}

// A releaseReply is what pgfence.release answered for one release.
type releaseReply struct {
	changed bool
	status  string
}

func (c *Client) sendReleases(ctx context.Context, calls []*groupCall[releaseRequest, releaseReply]) error {
	n := len(calls)
	keys, holders, tokens := make([]string, n), make([]string, n), make([]int64, n)
	for i, call := range calls {
		keys[i], holders[i], tokens[i] = call.req.key, call.req.holder, call.req.token
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if n == 1 {
		r := &calls[0].res
		return conn.QueryRow(ctx, sqlRelease, keys[0], holders[0], tokens[0], c.cfg.DurableRelease).Scan(&r.changed, &r.status)
	}
	rows, err := conn.Query(ctx, sqlReleaseMany, keys, holders, tokens, c.cfg.DurableRelease)
	if err != nil {
		return batchError(err)
	}
	got := 0
	for rows.Next() {
		var i int64
		var r releaseReply
		if err := rows.Scan(&i, &r.changed, &r.status); err != nil {
			rows.Close()
			return batchError(err)
		}
		if i < 1 || i > int64(n) {
			rows.Close()
			return fmt.Errorf("leases: a batch of %d releases answered for release %d", n, i)
		}
		calls[i-1].res = r
		got++
	}
	if err := rows.Err(); err != nil {
		return batchError(err)
	}
	if got != n {
		return fmt.Errorf("leases: a batch of %d releases answered %d: %w", n, got, ErrOutcomeUnknown)
	}
	return nil
}
