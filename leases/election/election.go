package election

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// Defaults for [Config] fields left zero.
const (
	ttlDefault          = 15 * time.Second
	pollIntervalDefault = 30 * time.Second
)

// Sentinels. Test with [errors.Is]. A term whose lease was lost ends with
// the lease's error ([pgfence.ErrLeaseLost], or [leases.ErrMaxHold] with a
// MaxHold).
var (
	// ErrResigned: the term ended because its leader resigned
	// ([Election.Resign], or the context of [Election.Run] ended).
	ErrResigned = errors.New("election: resigned")
	// ErrRunning: [Election.Run] was called while it runs: one replica
	// campaigns once.
	ErrRunning = errors.New("election: already campaigning")
)

// Config configures an [Election]. A nil *Config and zero fields use the
// defaults.
type Config struct {
	// TTL is the leadership lease's TTL: a leader that dies is replaced
	// about this long after its last renewal. Default 15 s (client-go's
	// LeaseDuration).
	TTL time.Duration
	// AcquireOptions say how a term's lease is taken and kept. HolderInfo is
	// the value the leader publishes when elected (default host:pid;
	// [Term.Proclaim] changes it);
	// RenewInterval defaults to TTL/3; MaxHold defaults to
	// [leases.NoMaxHold] (a term lasts until its leader resigns or fails).
	// Fair makes candidates lead in the order they began to campaign (set
	// it on every replica): each waits in the database's queue
	// (pgfence.lease_waiters), a resigned leader joins its end once its
	// successor is elected, and each candidate polls its place: about one
	// statement per [leases.Config.PollInterval] of its client
	// ([leases.Config.BackoffMax] without wake-ups). Without it,
	// followers send nothing while the leader is healthy and race for each
	// vacancy. TryOnce and MaxWait are refused: Run campaigns until its
	// context ends; NoKeepAlive too: a term lasts while it is renewed.
	// Grants and renewals are always announced.
	leases.AcquireOptions
	// PollInterval is how often a follower reads an election without a
	// leader while wake-ups work (see [leases.WatchOptions.PollInterval]).
	// Default 30 s. A follower of a leader does not poll: grants,
	// resignations and published values are announced, the leader's signed
	// renewal announcements move its expiry, and the follower reads the
	// election at that expiry. Without wake-ups followers read every
	// [leases.Config.BackoffMax] of the client, and at the leader's expiry.
	PollInterval time.Duration

	// OnStartedLeading is called by [Election.Run], in a goroutine of its
	// own, when this replica is elected. ctx ends when the term ends
	// (context.Cause says why: [ErrResigned], or the lost lease's error); the function
	// must return then. Everything it writes should go through the fence
	// with term ([pgfence.Write] and friends take it as the lease). The
	// next term starts only after it returned.
	//
	// [pgfence.Write]: https://pkg.go.dev/github.com/pgfence/pgfence/pgfence#Write
	OnStartedLeading func(ctx context.Context, term *Term)
	// OnStoppedLeading is called by Run after a term of this replica ended
	// and OnStartedLeading returned, with the reason.
	OnStoppedLeading func(term *Term, cause error)
	// OnLeader is called by Run for every change of leadership it observes,
	// in the order the database recorded them: a new leader (a new term), a
	// new value of the current leader, or no leader (Term 0). It is called
	// synchronously from Run's loop: it must return quickly.
	OnLeader func(Leader)
	// Logger receives the election's transitions. Default: discard.
	Logger *slog.Logger
}

func (c *Config) resolve() (Config, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	switch {
	case cfg.TTL < 0:
		return cfg, fmt.Errorf("%w: Config.TTL: must not be negative, got %s", pgfence.ErrInvalid, cfg.TTL)
	case cfg.PollInterval != 0 && (cfg.PollInterval < time.Millisecond || cfg.PollInterval > leases.MaxTTLLimit):
		return cfg, fmt.Errorf("%w: Config.PollInterval: must be 1ms to %s (0 for the default), got %s", pgfence.ErrInvalid, leases.MaxTTLLimit, cfg.PollInterval)
	case cfg.TryOnce || cfg.MaxWait != 0:
		return cfg, fmt.Errorf("%w: Config.TryOnce, Config.MaxWait: Run campaigns until its context ends", pgfence.ErrInvalid)
	case cfg.NoKeepAlive:
		return cfg, fmt.Errorf("%w: Config.NoKeepAlive: a term lasts while its lease is renewed", pgfence.ErrInvalid)
	}
	cfg.TTL = cmp.Or(cfg.TTL, ttlDefault)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, pollIntervalDefault)
	cfg.MaxHold = cmp.Or(cfg.MaxHold, leases.NoMaxHold)
	cfg.RenewInterval = cmp.Or(cfg.RenewInterval, cfg.TTL/3)
	cfg.Announce = true
	cfg.TryOnce = !cfg.Fair // an attempt per vacancy, or a place in the queue
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return cfg, nil
}

// Election is one replica's part in the election named by a lease key. Its
// methods are safe for concurrent use.
type Election struct {
	client *leases.Client
	key    string
	cfg    Config

	mu      sync.Mutex
	running bool // Run is active
	term    *Term
	resign  chan struct{} // Run: Resign asks to step down (buffered, 1)
	watch   *leases.Watcher
	health  error // why Run is not healthy, nil when it is
}

// New returns this replica's part in the election named key (a lease key:
// members of pgfence_app need a granted prefix of it). Every replica uses
// the same key and TTL. The client is the caller's: the election does not
// close it.
func New(client *leases.Client, key string, cfg *Config) (*Election, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client: must not be nil", pgfence.ErrInvalid)
	}
	resolved, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	// What each term's grant and keep-alive would refuse (the key
	// included), refused now: a keep-alive refused later would leave every
	// term to lapse unrenewed.
	if err := client.Check(key, resolved.TTL, &resolved.AcquireOptions); err != nil {
		return nil, fmt.Errorf("election: Config.TTL %s: %w", resolved.TTL, err)
	}
	return &Election{client: client, key: key, cfg: resolved, resign: make(chan struct{}, 1)}, nil
}

// Term returns this replica's current term, or nil when it does not lead.
// A term that has just ended may still be returned: check [Term.Err].
func (e *Election) Term() *Term {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.term
}

// IsLeader reports whether this replica leads now: it has a term whose
// lease is trusted at this moment by the local clock (see
// [leases.Lease.Err]). Any write the leader makes must still go through the
// fence with its term: the answer can be stale by the time the write
// reaches the database.
func (e *Election) IsLeader() bool {
	t := e.Term()
	return t != nil && t.Err() == nil
}

// Resign steps down from the current term of [Election.Run]: the term's
// context ends with [ErrResigned] and, once the leader's work returned
// (OnStartedLeading), the lease is released so that another replica is
// elected at once. It returns once Run has stepped down (OnStartedLeading
// returned, the lease was released, OnStoppedLeading returned), with the
// release's error, or nil when this replica does not lead; this replica
// campaigns again, but not before the TTL has passed or another leader has
// been elected.
//
// From OnStartedLeading, which Run waits for, pass the callback's context:
// Resign then returns nil as soon as the term has ended, and Run releases
// the lease when the callback returns. With another context it would wait
// for the callback, until that context ends. Do not call it from
// OnStoppedLeading or OnLeader, which Run also waits for.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	t := e.term
	if t != nil {
		// Signalled under the lock: stepDown clears the term and drains the
		// signal under it too, so a signal meant for a term that ended by
		// itself never ends the next one.
		select {
		case e.resign <- struct{}{}:
		default:
		}
	}
	e.mu.Unlock()
	if t == nil {
		return nil
	}
	select {
	case <-t.stepped:
		return t.releaseErr
	case <-ctx.Done():
		if errors.Is(context.Cause(ctx), ErrResigned) && errors.Is(context.Cause(t.ctx), ErrResigned) {
			return nil // called with the term's own context: it ended by this resignation
		}
		return context.Cause(ctx)
	}
}

// Leader reads the current leader from the database: its term, holder and
// value, or a Leader with Term 0 when nobody leads.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	st, err := e.client.Get(ctx, e.key)
	switch {
	case errors.Is(err, pgfence.ErrNotFound) || err == nil && !st.Live:
		return Leader{}, nil
	case err != nil:
		return Leader{}, fmt.Errorf("election %q: %w", e.key, err)
	}
	return Leader{Term: st.Token, Holder: st.Holder, Value: st.HolderInfo, Since: st.GrantedAt}, nil
}

// Observe streams the changes of leadership, in the order the database
// recorded them, until ctx ends (then the channel is closed): first the
// current leader (or Term 0), then every new term, value and vacancy. It
// costs a watch of the key ([leases.Client.Watch]). A slow reader delays
// the stream, never loses a change.
func (e *Election) Observe(ctx context.Context) (<-chan Leader, error) {
	w, err := e.client.Watch(ctx, e.key, &leases.WatchOptions{PollInterval: e.cfg.PollInterval})
	if err != nil {
		return nil, fmt.Errorf("election %q: observe: %w", e.key, err)
	}
	out := make(chan Leader)
	go func() {
		defer close(out)
		var (
			cur  Leader
			sent bool
		)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case ev, ok := <-w.Events():
				if !ok {
					return
				}
				if next, changed := cur.apply(ev); changed || !sent {
					cur, sent = next, true
					select {
					case out <- cur:
					case <-ctx.Done():
						for range w.Events() {
						}
						return
					}
				}
			case <-timer.C:
				// A key never leased has no events: say so once the first
				// read has answered.
				if !sent {
					if st := w.State(); !st.ReadAt.IsZero() && st.Lease.Key == "" {
						sent = true
						select {
						case out <- cur:
						case <-ctx.Done():
						}
					} else {
						timer.Reset(10 * time.Millisecond)
					}
				}
			}
		}
	}()
	return out, nil
}

// Health reports whether this replica takes part in the election as it
// should, for a readiness probe: nil while [Election.Run] runs and either
// leads with a trusted lease or, as a follower, its last read of the
// election succeeded and it heard from the election recently (a read or the
// leader's signed renewal announcement, within twice the poll interval plus
// the TTL). Otherwise the error says why. It sends nothing to the database.
func (e *Election) Health() error {
	// Read under the lock, ask outside it: Term.Err may end a lease whose
	// trust window has run out, which logs, and a logger may call back
	// into the election.
	e.mu.Lock()
	running, term, health, watch := e.running, e.term, e.health, e.watch
	e.mu.Unlock()
	switch {
	case !running:
		return fmt.Errorf("election %q: not campaigning (Run is not running)", e.key)
	case term != nil && term.Err() == nil:
		return nil
	case health != nil:
		return health
	case watch == nil:
		return fmt.Errorf("election %q: starting", e.key)
	}
	st := watch.State()
	if st.Err != nil {
		return fmt.Errorf("election %q: the database cannot be read: %w", e.key, st.Err)
	}
	if limit := 2*e.cfg.PollInterval + e.cfg.TTL; st.HeardAt.IsZero() || time.Since(st.HeardAt) > limit {
		return fmt.Errorf("election %q: nothing heard from the election for %s (limit %s)", e.key, time.Since(st.HeardAt).Round(time.Millisecond), limit)
	}
	return nil
}
