package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// codeAbandoned is the [Failure.Code] that [Store.Recover] stores for an
// abandoned key when it has no function to resume it with.
const codeAbandoned = "abandoned"

// releaseTimeout bounds the release of a key whose resumption panicked,
// which does not end with the caller's context.
const releaseTimeout = 10 * time.Second

// RecoverOptions selects the abandoned keys of [Store.Recover] and
// [Store.Abandoned]. A nil *RecoverOptions and the zero value use the
// defaults.
type RecoverOptions struct {
	// ScopePrefix limits the call to keys whose scope starts with it, for
	// example "payments.capture/". Default "": every scope. At most
	// [MaxScopeBytes].
	ScopePrefix string
	// ExpiredFor is how long a lease must have been over before its key
	// counts as abandoned (database clock). A client that retries shortly
	// after a crash then resumes its own request; a completer takes what
	// nobody came back for. Default 0: as soon as the lease ended.
	ExpiredFor time.Duration
	// Limit is the most keys one call lists or recovers, oldest lease end
	// first; call again for more. Default 100; at most
	// math.MaxInt32.
	Limit int
}

// abandonedSQL lists leased keys in progress whose lease ended at least $1
// µs ago, oldest first.
const abandonedSQL = sqlKeyColumns + `
 WHERE status = 'in_progress' AND mode = 'leased'
   AND lease_expires_at <= pg_catalog.clock_timestamp() - $1 * interval '1 microsecond'
   AND ($2 = '' OR pg_catalog.starts_with(scope, $2))
 ORDER BY lease_expires_at
 LIMIT $3`

func (o *RecoverOptions) check() (RecoverOptions, error) {
	c := *cmp.Or(o, &RecoverOptions{})
	switch {
	case c.ExpiredFor < 0:
		return c, fmt.Errorf("%w: RecoverOptions.ExpiredFor must not be negative, got %v", ErrInvalid, c.ExpiredFor)
	case c.Limit < 0 || c.Limit > math.MaxInt32:
		return c, fmt.Errorf("%w: RecoverOptions.Limit must be 0 to %d, got %d", ErrInvalid, math.MaxInt32, c.Limit)
	}
	c.Limit = cmp.Or(c.Limit, 100)
	return c, checkText("RecoverOptions.ScopePrefix", c.ScopePrefix, 0, MaxScopeBytes)
}

// Abandoned lists leased keys left in progress after their lease ended
// (see [RecoverOptions] for which), oldest lease end first: their owner
// crashed, was paused or cut off, or released the key after a transient
// error ([KeyState.Released]), and no retry has taken them over since. It
// only reads: a key listed here may be taken over by a retry or a completer
// at any moment. pgfence_app may call it.
func (s *Store) Abandoned(ctx context.Context, db DB, opts *RecoverOptions) ([]KeyState, error) {
	o, err := opts.check()
	return listKeys(ctx, db, err, abandonedSQL, o.ExpiredFor.Microseconds(), o.ScopePrefix, o.Limit)
}

// RecoverResult counts what [Store.Recover] did.
type RecoverResult struct {
	// Found is the number of abandoned keys listed.
	Found int
	// Resumed counts keys that Recover's function completed (or failed).
	Resumed int
	// Failed counts keys marked failed with the code "abandoned" (no
	// function given).
	Failed int
	// Released counts keys whose function failed transiently: released
	// again, with their recovery point, for a later retry or completer.
	Released int
	// Skipped counts keys somebody else got first: a retry of the request or
	// another completer took them over (before the claim, or while the
	// function ran and its lease ran out), or they were completed
	// meanwhile.
	Skipped int
}

// Recover finishes keys abandoned in progress (see [Store.Abandoned] and
// [RecoverOptions]). It takes each over the way a retry of its request
// would, under the key's row lock with the key's own fingerprint, so one
// claimant wins whatever runs concurrently (other completers, the client's
// retry): a key taken by somebody else is skipped, and fn runs at most once
// per takeover. Then:
//
//   - fn != nil: fn resumes the key from its recovery point. a owns the
//     key: Recover took it over exactly as a retry of the original request
//     would have, so [Attempt.RecoveryPoint] and [Attempt.RecoveryData] say
//     where the last owner got to and [Attempt.DerivedKey] gives the
//     downstream keys it used. fn does the remaining phases (each with
//     [Attempt.AdvanceTx] in the transaction of its writes) and ends with
//     [Attempt.Complete] or [Attempt.CompleteTx]; or returns a [*Failure]
//     to store it as the key's permanent answer; or returns any other error
//     to release the key for a later retry or completer. Returning nil
//     without completing the key releases it too, and counts as an error.
//   - fn == nil: the key is marked failed: a [Failure] with Code "abandoned"
//     and a message naming the recovery point it was abandoned at, which
//     every later duplicate gets instead of a second execution. The
//     takeover and the failure stay in the key's row (epoch, trace id,
//     failure code and message, completed_at), and are logged at info
//     level.
//
// Each takeover gets the store's [Config.Lease]; a fn that runs longer must
// heartbeat. A fn that panics gets the key released, and the panic goes on.
// Recover stops at the first error that is not about one key (the database
// is unreachable, ctx ended) and returns what it did so far.
func (s *Store) Recover(ctx context.Context, db DB, opts *RecoverOptions, fn func(ctx context.Context, a *Attempt) error) (res RecoverResult, err error) {
	o, err := opts.check()
	if err != nil {
		return res, err
	}
	ctx, done := s.tel.recovered(ctx)
	defer func() { done(&res, err) }()
	keys, err := listKeys(ctx, db, nil, abandonedSQL, o.ExpiredFor.Microseconds(), o.ScopePrefix, o.Limit)
	if err != nil {
		return res, err
	}
	res.Found = len(keys)
	completed := &res.Resumed
	if fn == nil {
		completed = &res.Failed
		fn = func(_ context.Context, a *Attempt) error {
			return &Failure{Code: codeAbandoned, Message: abandonedMessage(a.RecoveryPoint())}
		}
	}
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		c := claimArgs{store: s, scope: k.Scope, key: k.Key, fingerprint: []byte(k.fingerprint), wait: s.wait, retention: k.retention}
		out, err := c.claim(ctx, db)
		switch {
		case errors.Is(err, ErrInProgress), errors.Is(err, ErrMismatch), err == nil && out.Replayed:
			res.Skipped++
			continue
		case err != nil:
			return res, fmt.Errorf("idempotency: recover %s/%s: %w", k.Scope, k.Key, err)
		}
		a := out.Attempt
		s.tel.log.InfoContext(ctx, "idempotency: abandoned key taken over", "scope", k.Scope, "key", k.Key,
			"epoch", a.epoch, "recovery_point", a.RecoveryPoint())
		n, err := s.resume(ctx, a, fn, &res, completed)
		if err != nil {
			return res, err
		}
		*n++
		if n == &res.Failed {
			s.tel.log.InfoContext(ctx, "idempotency: abandoned key marked failed", "scope", k.Scope, "key", k.Key,
				"epoch", a.epoch, "recovery_point", a.RecoveryPoint())
		}
	}
	return res, nil
}

// settledSQL reads whether an attempt still owns its key in progress, and
// whether the key was settled by the attempt's own epoch (a takeover raises
// the epoch; a completion clears the owner but keeps it).
const settledSQL = `SELECT coalesce(pg_catalog.bool_or(owner = $3::uuid AND status = 'in_progress'), false),
       coalesce(pg_catalog.bool_or(epoch = $4 AND status <> 'in_progress'), false)
  FROM pgfence.idempotency_keys WHERE scope = $1 AND key = $2`

// releaseDetached releases a's key after a call failed, with a context of
// its own (the caller's may have ended), so that it is not held for a lease.
func releaseDetached(ctx context.Context, a *Attempt) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	_ = a.Release(rctx)
}

// resume runs fn on a and settles what fn left: a stored failure, or a
// release. It returns the counter of res that the key adds to: completed,
// Released, or Skipped when somebody else took the key over (or completed
// it) meanwhile; and an error, without a counter, only when the database
// failed. A panic in fn releases the key and goes on unwinding.
func (s *Store) resume(ctx context.Context, a *Attempt, fn func(context.Context, *Attempt) error, res *RecoverResult, completed *int) (_ *int, err error) {
	panicked := true
	defer func() {
		if panicked {
			releaseDetached(ctx, a)
		}
	}()
	err = fn(ctx, a)
	panicked = false
	release := func() (*int, error) {
		if err := a.Release(ctx); err != nil && !errors.Is(err, ErrLeaseLost) {
			return nil, err
		}
		return &res.Released, nil
	}
	if failure := (*Failure)(nil); errors.As(err, &failure) {
		switch _, err = a.Fail(ctx, failure); {
		case err == nil:
			return completed, nil
		case errors.Is(err, ErrLeaseLost):
			return &res.Skipped, nil // its lease ran out and somebody took it, or fn completed it after all
		case !errors.Is(err, ErrInvalid):
			releaseDetached(ctx, a)
			return nil, err
		} // a failure the database would not store is released as a transient error is
	}
	if err != nil {
		s.tel.log.WarnContext(ctx, "idempotency: recover: resuming failed; key released", "scope", a.scope, "key", a.key,
			"recovery_point", a.RecoveryPoint(), "error", err)
		return release()
	}
	// fn returned nil: it completed the key (perhaps in a transaction of its
	// own, which the attempt cannot see), or it forgot to, or the key was
	// taken from it meanwhile (its lease ran out).
	var owned, settled bool
	if err := a.db.QueryRow(ctx, settledSQL, a.scope, a.key, a.owner, a.epoch).Scan(&owned, &settled); err != nil {
		return nil, fmt.Errorf("idempotency: recover %s/%s: %w", a.scope, a.key, classify(err, false))
	}
	switch {
	case settled:
		return completed, nil
	case !owned:
		s.tel.log.WarnContext(ctx, "idempotency: recover: the key was taken over while it was resumed",
			"scope", a.scope, "key", a.key, "epoch", a.epoch)
		return &res.Skipped, nil
	}
	s.tel.log.WarnContext(ctx, "idempotency: recover: the resumption returned without completing the key; released",
		"scope", a.scope, "key", a.key)
	return release()
}

// abandonedMessage is the failure message of an abandoned key; a recovery
// point of at most 256 bytes keeps it far below the message's limit.
func abandonedMessage(point string) string {
	if point == "" {
		return "abandoned in progress before its first recovery point; marked failed by a completer"
	}
	return fmt.Sprintf("abandoned in progress at recovery point %q; marked failed by a completer", point)
}
