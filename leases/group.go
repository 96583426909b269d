package leases

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/telemetry"
	"github.com/pgfence/pgfence/internal/tracesql"
)

// Group commit ([Config.GroupCommit]): grant attempts and releases that
// overlap in time are sent together, as one call of pgfence.lease_batch (one
// statement, one commit). A call that finds nothing in flight is sent at
// once, by its own goroutine; calls that arrive while a send is in flight
// go in the next batch (up to groupFlushers in flight). So a lone caller waits for nothing
// more than its own round trip, and under load each caller waits at most for
// the batch ahead of it.
const (
	// groupFlushers is how many batches of one client may be in flight at
	// once: two keep the server busy while a batch's reply travels back.
	groupFlushers = 2
	// groupMaxBatch caps a batch: its rows stay locked until it commits.
	groupMaxBatch = 64
	// groupLockWait is the longest an element of a batch waits for a row
	// lock; one that would wait longer is sent again on its own, so that it
	// does not hold up the rest of its batch (and the calls queued behind).
	groupLockWait = time.Millisecond
)

// sqlLeaseBatch runs a batch; holders travel as text (pgx has no uuid type
// for a Go string) and remaining as microseconds.
const sqlLeaseBatch = `SELECT ord, ok, holder::text, token, granted_at, expires_at,
       (extract(epoch FROM remaining) * 1000000)::bigint, status, taken_over,
       sqlstate, message, detail, hint
  FROM pgfence.lease_batch($1::text[], $2::text[], $3::interval[], $4::text[], $5::text[]::uuid[],
                           $6::bigint[], $7::boolean[], $8::text[], $9, $10, $11, $12)`

// The states of a groupOp.
const (
	opQueued    int32 = iota // waiting for a batch
	opTaken                  // in a batch that waits for a connection: not sent yet
	opSending                // in a batch being sent: the batch answers it
	opAbandoned              // its caller stopped waiting before it was sent
)

// A batchWait ties a batch's connection wait to its callers: when every
// one of them has stopped waiting, the wait is cancelled.
type batchWait struct {
	cancel    context.CancelFunc
	size      atomic.Int32
	abandoned atomic.Int32
}

// abandon records that one more caller of the batch stopped waiting.
func (w *batchWait) abandon() {
	if w.abandoned.Add(1) == w.size.Load() {
		w.cancel()
	}
}

// A groupOp is one grant attempt or release waiting for, or in, a batch.
type groupOp struct {
	release      bool
	key, holder  string
	ttl          time.Duration // grants
	info         string        // grants
	announce     bool          // grants
	token        int64         // releases
	readTakeover bool          // grants: read back whether the grant replaced an expired one

	ctx         context.Context // the caller's, for its values (trace id) only
	traceID     string
	deadline    time.Time
	hasDeadline bool

	state atomic.Int32
	wait  *batchWait       // set before the state becomes opTaken
	done  chan groupResult // buffered (1)
}

// groupResult is a groupOp's answer. sent is false only when the op
// certainly did not reach the server (err then says why).
type groupResult struct {
	sent bool
	err  error

	ok         bool
	holder     *string
	token      *int64
	granted    *time.Time
	expires    *time.Time
	remainingµ *int64
	status     *string
	takenOver  *bool
}

// group is a client's queue of operations waiting for a batch.
type group struct {
	mu       sync.Mutex
	pending  []*groupOp
	flushers int
}

// submitGroup queues op and waits for its result. If ctx ends before op is
// sent, nothing was sent; after, the outcome is unknown (the result is the
// context's error with sent set).
func (c *Client) submitGroup(ctx context.Context, op *groupOp) groupResult {
	op.done = make(chan groupResult, 1)
	op.ctx = context.WithoutCancel(ctx)
	op.traceID = telemetry.TraceID(ctx)
	op.deadline, op.hasDeadline = ctx.Deadline()
	if c.unbatched.Load() {
		return c.sendDirect(ctx, op)
	}
	g := &c.group
	g.mu.Lock()
	if g.flushers == 0 {
		// Nothing in flight, nothing to batch with: sent at once, from this
		// goroutine, as a client without group commit sends it. Calls made
		// meanwhile queue; the send slot passes to a batch of them
		// afterwards. (With one send in flight, a call queues instead: the
		// next batch is where calls meet.)
		g.flushers++
		g.mu.Unlock()
		r := c.sendDirect(ctx, op)
		g.mu.Lock()
		if len(g.pending) > 0 {
			go c.flushGroup()
		} else {
			g.flushers--
		}
		g.mu.Unlock()
		return r
	}
	g.pending = append(g.pending, op)
	if g.flushers < groupFlushers {
		g.flushers++
		go c.flushGroup()
	}
	g.mu.Unlock()
	select {
	case r := <-op.done:
		return r
	case <-ctx.Done():
	}
	if op.state.CompareAndSwap(opQueued, opAbandoned) {
		return groupResult{err: context.Cause(ctx)}
	}
	if op.state.CompareAndSwap(opTaken, opAbandoned) {
		op.wait.abandon()
		return groupResult{err: context.Cause(ctx)}
	}
	select {
	case r := <-op.done: // answered meanwhile
		return r
	default:
	}
	return groupResult{sent: true, err: fmt.Errorf("the batch it was sent in has not answered: %w", context.Cause(ctx))}
}

// flushGroup sends the pending operations, a batch at a time, until none
// are left.
func (c *Client) flushGroup() {
	g := &c.group
	for {
		ctx, cancel := context.WithCancel(context.Background())
		w := &batchWait{cancel: cancel}
		g.mu.Lock()
		var batch []*groupOp
		for len(g.pending) > 0 && len(batch) < groupMaxBatch {
			op := g.pending[0]
			g.pending[0] = nil
			g.pending = g.pending[1:]
			op.wait = w
			if op.state.CompareAndSwap(opQueued, opTaken) {
				batch = append(batch, op)
			}
		}
		if len(batch) == 0 {
			g.pending = nil // lets go of the backing array
			g.flushers--
			g.mu.Unlock()
			cancel()
			return
		}
		g.mu.Unlock()
		w.size.Store(int32(len(batch)))
		if w.abandoned.Load() == int32(len(batch)) {
			cancel()
		}
		c.sendGroup(ctx, batch)
		cancel()
	}
}

// sendGroup sends batch as one pgfence.lease_batch call and hands each
// operation its row. ctx is cancelled when every caller stopped waiting
// before the batch was sent. The statement is bounded by the latest
// deadline of its callers (none if one has none): a caller that stops
// waiting once it is sent is told the outcome is unknown, and settles it
// as any lost reply.
func (c *Client) sendGroup(ctx context.Context, batch []*groupOp) {
	bounded := true
	var latest time.Time
	for _, op := range batch {
		if !op.hasDeadline {
			bounded = false
			break
		}
		if op.deadline.After(latest) {
			latest = op.deadline
		}
	}
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	conn, err := c.conn(ctx) // fails only when nothing was sent
	// From here on the batch answers each operation it still has; one whose
	// caller stopped waiting is left out, unsent.
	batch = slices.DeleteFunc(batch, func(op *groupOp) bool { return !op.state.CompareAndSwap(opTaken, opSending) })
	if err != nil {
		for _, op := range batch {
			op.done <- groupResult{err: err}
		}
		return
	}
	defer conn.Release()
	switch len(batch) {
	case 0:
		return
	case 1:
		// A batch of one would cost a subtransaction and the batch
		// function's call for nothing: the statement a client without
		// group commit sends.
		batch[0].done <- c.sendOne(mergeValues(ctx, batch[0].ctx), conn, batch[0])
		return
	}
	// A stable lock order between batches: by key, a release before a
	// grant of the same key.
	slices.SortStableFunc(batch, func(a, b *groupOp) int {
		if n := strings.Compare(a.key, b.key); n != 0 {
			return n
		}
		switch {
		case a.release && !b.release:
			return -1
		case b.release && !a.release:
			return 1
		}
		return 0
	})
	n := len(batch)
	var (
		ops       = make([]string, n)
		keys      = make([]string, n)
		ttls      = make([]time.Duration, n)
		infos     = make([]string, n)
		holders   = make([]string, n)
		tokens    = make([]int64, n)
		announce  = make([]bool, n)
		traceIDs  = make([]string, n)
		readTaken bool
	)
	for i, op := range batch {
		ops[i], keys[i], holders[i], traceIDs[i] = "acquire", op.key, op.holder, op.traceID
		if op.release {
			ops[i], tokens[i] = "release", op.token
		} else {
			ttls[i], infos[i], announce[i] = op.ttl, op.info, op.announce
			readTaken = readTaken || op.readTakeover
		}
	}
	fail := func(r groupResult) {
		for _, op := range batch {
			op.done <- r
		}
	}
	rows, err := conn.Query(ctx, sqlLeaseBatch, ops, keys, ttls, infos, holders, tokens, announce, traceIDs,
		ClientVersion(), c.cfg.DurableRelease, readTaken, groupLockWait)
	if pgerr.Code(err) == pgerr.CodeUndefinedFunction {
		c.unbatch(batch, err)
		return
	}
	if err != nil {
		fail(groupResult{sent: true, err: err})
		return
	}
	results := make([]groupResult, n)
	seen := 0
	for rows.Next() {
		var (
			ord                   int32
			ok                    *bool
			state, msg, det, hint *string
			r                     = groupResult{sent: true}
		)
		if err := rows.Scan(&ord, &ok, &r.holder, &r.token, &r.granted, &r.expires, &r.remainingµ,
			&r.status, &r.takenOver, &state, &msg, &det, &hint); err != nil {
			rows.Close()
			fail(groupResult{sent: true, err: err})
			return
		}
		if ord < 1 || int(ord) > n || results[ord-1].sent {
			rows.Close()
			fail(groupResult{sent: true, err: fmt.Errorf("pgfence.lease_batch answered element %d of %d twice or out of range", ord, n)})
			return
		}
		if state != nil {
			pe := &pgconn.PgError{Severity: "ERROR", Code: *state}
			if msg != nil {
				pe.Message = *msg
			}
			if det != nil {
				pe.Detail = *det
			}
			if hint != nil {
				pe.Hint = *hint
			}
			r.err = pe
		} else if ok != nil {
			r.ok = *ok
		}
		results[ord-1] = r
		seen++
	}
	// The batch commits when the statement ends: until rows.Err says it
	// did, no row is final (a lost reply here leaves every outcome unknown).
	if err := rows.Err(); err != nil {
		if seen == 0 && pgerr.Code(err) == pgerr.CodeUndefinedFunction {
			c.unbatch(batch, err)
			return
		}
		fail(groupResult{sent: true, err: err})
		return
	}
	if seen != n {
		fail(groupResult{sent: true, err: fmt.Errorf("pgfence.lease_batch answered %d of %d elements", seen, n)})
		return
	}
	for i, op := range batch {
		if pe, ok := results[i].err.(*pgconn.PgError); ok && pe.Code == pgerr.CodeLockNotAvailable {
			// It waited for a row lock longer than groupLockWait and was
			// rolled back alone: send it on its own, where it may wait.
			go func() { op.done <- c.sendAlone(op) }()
			continue
		}
		op.done <- results[i]
	}
}

// unbatch sends each operation of batch on its own, and every later call
// too: the schema has no pgfence.lease_batch (it was not migrated since
// batches came), so the batch's statement was refused before anything ran.
func (c *Client) unbatch(batch []*groupOp, err error) {
	if !c.unbatched.Swap(true) {
		c.log.Warn("leases: group commit sends every call on its own: the pgfence schema has no lease_batch; run the migrations", "err", err)
	}
	for _, op := range batch {
		go func() { op.done <- c.sendAlone(op) }()
	}
}

// sendDirect sends op under its caller's context, as a client without
// group commit does.
func (c *Client) sendDirect(ctx context.Context, op *groupOp) groupResult {
	conn, err := c.conn(ctx) // fails only when nothing was sent
	if err != nil {
		return groupResult{err: err}
	}
	defer conn.Release()
	return c.sendOne(ctx, conn, op) // ctx is the caller's: its values too
}

// sendAlone sends op on its own, on a connection of its own: an element
// that would have held up its batch waiting for a row lock.
func (c *Client) sendAlone(op *groupOp) groupResult {
	ctx := op.ctx
	if op.hasDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, op.deadline)
		defer cancel()
	}
	conn, err := c.conn(ctx)
	if err != nil {
		// Its batch was sent, and rolled it back: nothing of it stays.
		return groupResult{err: err}
	}
	defer conn.Release()
	return c.sendOne(mergeValues(ctx, op.ctx), conn, op)
}

// sendOne sends op as the statement a client without group commit sends,
// on conn. ctx must carry the values (trace id) of op's caller.
func (c *Client) sendOne(ctx context.Context, conn *pgxpool.Conn, op *groupOp) groupResult {
	r := groupResult{sent: true}
	if op.release {
		var status string
		r.err = tracesql.QueryRow(ctx, conn, sqlRelease, op.key, op.holder, op.token, c.cfg.DurableRelease).Scan(&r.ok, &status)
		r.status = &status
		return r
	}
	var (
		takenOver  bool
		remainingµ int64
	)
	takenOver, r.err = c.sendGrant(ctx, conn, op.key, op.holder, op.ttl, op.info, op.announce, op.readTakeover,
		&r.ok, &r.holder, &r.token, &r.granted, &r.expires, &remainingµ)
	r.takenOver, r.remainingµ = &takenOver, &remainingµ
	return r
}

// mergeValues is ctx (its deadline and cancellation) with the values of
// values too.
func mergeValues(ctx, values context.Context) context.Context {
	return valuesContext{ctx, values}
}

type valuesContext struct {
	context.Context // deadline, cancellation
	values          context.Context
}

// Value looks in the context that is cancelled first: the context package
// finds its own cancellation there, so contexts derived from this one need
// no goroutine to follow it.
func (v valuesContext) Value(key any) any {
	if x := v.Context.Value(key); x != nil {
		return x
	}
	return v.values.Value(key)
}

// groupGrant sends one grant attempt through the client's batches and scans
// its answer like sendGrant. sent is false only when nothing reached the
// server.
func (c *Client) groupGrant(ctx context.Context, key, holder string, ttl time.Duration, info string, announce bool,
	acquired *bool, gotHolder **string, token **int64, granted, expiresAt **time.Time, remainingµ *int64) (sent bool, err error) {
	countTakeovers := c.tel.takeovers.Enabled(ctx)
	r := c.submitGroup(ctx, &groupOp{key: key, holder: holder, ttl: ttl, info: info, announce: announce, readTakeover: countTakeovers})
	if r.err == nil {
		*acquired, *gotHolder, *token, *granted, *expiresAt = r.ok, r.holder, r.token, r.granted, r.expires
		if r.remainingµ != nil {
			*remainingµ = *r.remainingµ
		}
		if r.ok && (r.token == nil || r.granted == nil || r.expires == nil) {
			r.err = errors.New("pgfence.lease_batch granted a lease without its token or times")
		}
	}
	if r.sent { // as without group commit: an attempt that never left is not counted
		c.tel.attempted(ctx, r.err, *acquired, r.takenOver != nil && *r.takenOver)
	}
	return r.sent, r.err
}

// groupRelease sends l's release through the client's batches; like
// releaseOnce, its error is classified.
func (c *Client) groupRelease(ctx context.Context, l *Lease) (changed bool, status string, err error) {
	r := c.submitGroup(ctx, &groupOp{release: true, key: l.key, holder: l.holder, token: l.token})
	if r.err != nil {
		if !r.sent {
			return false, "", r.err // as c.conn classified it
		}
		return false, "", classify(r.err)
	}
	if r.status == nil {
		return false, "", classify(errors.New("pgfence.lease_batch answered a release without a status"))
	}
	return r.ok, *r.status, nil
}
