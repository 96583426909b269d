package robustness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// actor is one client of the system under test: a pool, a lease client and an
// idempotency store, doing what an application does. The same code runs in
// the test process and in worker processes (see worker_test.go). Its methods
// return the [Op] they performed, with the outcome classified; the caller
// stamps call and return times.
type actor struct {
	pool   *pgxpool.Pool
	leases *leases.Client
	store  *idempotency.Store

	mu   sync.Mutex
	held map[string]*leases.Lease
}

// resolveTimeout bounds the leases client's read-back of a grant whose reply
// was lost. That read-back runs past the caller's deadline (it must learn
// whether a grant committed), so an Acquire returns by its deadline plus this.
const resolveTimeout = time.Second

type actorConfig struct {
	URL      string        `json:"url"`
	App      string        `json:"app"` // application_name, "pf-..." so reconcile waits for it
	MaxConns int32         `json:"max_conns"`
	Wakeups  bool          `json:"wakeups"`
	Margin   time.Duration `json:"margin"`
}

func newActor(ctx context.Context, c actorConfig) (*actor, error) {
	cfg, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = c.App
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	if c.MaxConns > 0 {
		cfg.MaxConns = c.MaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	lc, err := leases.New(pool, &leases.Config{DisableWakeups: !c.Wakeups, SafetyMargin: c.Margin, ResolveTimeout: resolveTimeout})
	if err != nil {
		pool.Close()
		return nil, err
	}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		_ = lc.Close()
		pool.Close()
		return nil, err
	}
	return &actor{pool: pool, leases: lc, store: store, held: map[string]*leases.Lease{}}, nil
}

func (a *actor) close() {
	_ = a.leases.Close()
	a.pool.Close()
}

func (a *actor) lease(key string) *leases.Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held[key]
}

// acquire waits up to wait for the lease on key. The lease is not kept
// alive: the actor renews it by hand (renew), and a scenario's holder that
// stops renewing lets it run out, as a paused or crashed one would.
func (a *actor) acquire(ctx context.Context, key string, ttl, wait time.Duration) Op {
	return a.acquireWith(ctx, key, ttl, &leases.AcquireOptions{MaxWait: wait, NoKeepAlive: true})
}

// acquireKept makes one attempt for the lease on key, kept alive by the
// client until it ends.
func (a *actor) acquireKept(ctx context.Context, key string, ttl time.Duration) Op {
	return a.acquireWith(ctx, key, ttl, nil)
}

func (a *actor) acquireWith(ctx context.Context, key string, ttl time.Duration, opts *leases.AcquireOptions) Op {
	op := Op{Kind: Acquire, Key: key}
	var (
		l   *leases.Lease
		err error
	)
	if opts != nil && opts.MaxWait > 0 {
		l, err = a.leases.Acquire(ctx, key, ttl, opts)
	} else {
		l, err = a.leases.TryAcquire(ctx, key, ttl, opts)
	}
	if err != nil {
		op.Outcome, op.Err = classify(err), err.Error()
		return op
	}
	a.mu.Lock()
	a.held[key] = l
	a.mu.Unlock()
	op.Token, op.Outcome = l.Token(), OK
	return op
}

// renew renews the lease this actor holds on key.
func (a *actor) renew(ctx context.Context, key string) error {
	l := a.lease(key)
	if l == nil {
		return fmt.Errorf("no lease on %q", key)
	}
	return l.Renew(ctx)
}

// renewOp renews the lease this actor holds on key and returns the
// operation: Rejected only when the database refused the renewal, Failed when
// the client refused it itself (its trust window had run out: nothing sent).
func (a *actor) renewOp(ctx context.Context, key string) Op {
	op := Op{Kind: Renew, Key: key, Outcome: OK}
	if l := a.lease(key); l != nil {
		op.Token = l.Token()
	}
	if err := a.renew(ctx, key); err != nil {
		op.Outcome, op.Err = classify(err), err.Error()
		if op.Outcome == Rejected && pgerr.Code(err) != pgerr.CodeLeaseNotHeld {
			op.Outcome = Failed
		}
	}
	return op
}

// release releases the lease this actor holds on key.
func (a *actor) release(ctx context.Context, key string) Op {
	op := Op{Kind: Release, Key: key}
	l := a.lease(key)
	if l == nil {
		op.Outcome, op.Err = Failed, "no lease held"
		return op
	}
	op.Token = l.Token()
	if err := l.Release(ctx); err != nil {
		op.Outcome, op.Err = classify(err), err.Error()
		return op
	}
	op.Outcome = OK
	return op
}

// writeSQL is the business write every fenced write makes.
const writeSQL = `UPDATE stock SET value = $2, token = $3 WHERE resource = $1`

// write sets resource key to value with a fenced write carrying token. It
// does not look at the lease first: the point is that the database judges.
func (a *actor) write(ctx context.Context, key string, token int64, value string) Op {
	op, _ := a.fencedWrite(ctx, key, token, value)
	return op
}

// fencedWrite is write; it also returns the error behind the outcome.
func (a *actor) fencedWrite(ctx context.Context, key string, token int64, value string) (Op, error) {
	op := Op{Kind: Write, Key: key, Token: token, Value: value}
	_, err := pgfence.Write(ctx, a.pool, pgfence.LeaseOf(key, "", token), func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, writeSQL, key, value, token)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("resource %q: %d rows updated", key, tag.RowsAffected())
		}
		return err
	})
	if err != nil {
		op.Outcome, op.Err = classify(err), err.Error()
		return op, err
	}
	op.Outcome = OK
	return op, nil
}

// writeResolved is write, but a write whose outcome is unknown is read back
// with pgfence.Resolve before it returns, as a careful caller does: applied
// is OK, not applied (final: the write can no longer land) is Failed, and
// superseded (it may have landed before a newer write) stays Unknown. The
// checker then holds Resolve to its answer.
func (a *actor) writeResolved(ctx context.Context, key string, token int64, value string) Op {
	op, err := a.fencedWrite(ctx, key, token, value)
	var unknown *pgfence.OutcomeUnknownError
	if op.Outcome != Unknown || !errors.As(err, &unknown) {
		return op
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	got, err := pgfence.Resolve(rctx, a.pool, unknown)
	if err != nil {
		op.Err += "; resolve: " + err.Error()
		return op
	}
	op.Resolved = got.String()
	switch got {
	case pgfence.Applied:
		op.Outcome = OK
	case pgfence.NotApplied:
		op.Outcome = Failed
	}
	return op
}

// writeLeased sets resource key to value with a lease-checked write: the
// database checks that this actor's grant of lease key (the one with token,
// if token is not 0) is still live.
func (a *actor) writeLeased(ctx context.Context, key string, token int64, value string) Op {
	op := Op{Kind: Write, Key: key, Token: token, Value: value}
	l := a.lease(key)
	if l == nil || token != 0 && l.Token() != token {
		op.Outcome, op.Err = Failed, "no lease held with that token"
		return op
	}
	op.Token = l.Token()
	// The lease-checked write also presents the token to the fence, so the
	// register's token order is kept even across both kinds of write.
	_, err := pgfence.Write(ctx, a.pool, pgfence.Checked(l), func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pgfence.fence($1, $2)`, key, l.Token()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, writeSQL, key, value, l.Token())
		return err
	})
	if err != nil {
		op.Outcome, op.Err = classify(err), err.Error()
		return op
	}
	op.Outcome = OK
	return op
}

// effect runs intent once: it records a shipment whose result is value, in
// the same transaction as the idempotency key (atomic mode).
func (a *actor) effect(ctx context.Context, intent, value string) Op {
	op := Op{Kind: Effect, Key: intent, Value: value}
	out, err := a.store.Do(ctx, a.pool, idempotency.Request{Scope: scope, Key: intent, Payload: []byte(`"` + intent + `"`)},
		func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO shipments (intent, result) VALUES ($1, $2)`, intent, value); err != nil {
				return nil, err
			}
			return []byte(value), nil
		})
	switch {
	case err == nil && out.Failure == nil:
		op.Outcome, op.Result = OK, string(out.Result)
	case err == nil:
		op.Outcome, op.Err = Rejected, "stored failure "+out.Failure.Code
	default:
		op.Outcome, op.Err = classify(err), err.Error()
	}
	return op
}

// effectResolved is effect, but an effect whose outcome is unknown is asked
// again with the same key and value until it gets the intent's answer (at
// most resolveTimeout longer), as a client retries an idempotent request:
// the stored result, whichever attempt executed.
func (a *actor) effectResolved(ctx context.Context, intent, value string) Op {
	op := a.effect(ctx, intent, value)
	if op.Outcome != Unknown {
		return op
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	for {
		again := a.effect(rctx, intent, value)
		if again.Outcome == OK {
			op.Outcome, op.Result, op.Resolved = OK, again.Result, "retried"
			return op
		}
		select {
		case <-rctx.Done():
			return op
		case <-time.After(10 * time.Millisecond): // the first attempt may still be in flight
		}
	}
}

// classify maps an error to the outcome the caller can rely on. Anything not
// known to have changed nothing is Unknown: the checker then allows both.
func classify(err error) Outcome {
	switch {
	case errors.Is(err, pgfence.ErrStaleToken):
		return Stale
	case errors.Is(err, pgfence.ErrLeaseHeld), errors.Is(err, pgfence.ErrLeaseLost),
		errors.Is(err, idempotency.ErrInProgress),
		errors.Is(err, idempotency.ErrMismatch):
		return Rejected
	case errors.Is(err, pgerr.ErrOutcomeUnknown):
		return Unknown
	case errors.Is(err, pgerr.ErrUnavailable), errors.Is(err, pgerr.ErrInvalid), errors.Is(err, pgerr.ErrNotPrimary):
		return Failed
	}
	if pg := pgerr.PgError(err); pg != nil && !pgerr.IsConnectionError(err) {
		return Failed // the server answered with an error: the transaction rolled back
	}
	return Unknown
}

// recorded runs fn as client c's operation and records it with its times.
func (e *env) recorded(c int, fn func() Op) Op {
	call := e.rec.Now()
	op := fn()
	op.Client, op.Call, op.Return = c, call, e.rec.Now()
	e.rec.Add(op)
	return op
}
