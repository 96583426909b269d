package leases

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Event is one transition of a key: one the database recorded
// (pgfence.lease_events), as [Client.History] returns it and [Client.Watch]
// streams it, or one a watcher observed (expired, gap).
type Event struct {
	// ID orders the events of a key (pgfence.lease_events.id; later is
	// larger). It is 0 for expired and gap.
	ID int64
	// Key is the lease key.
	Key string
	// Kind says what happened:
	//   - "acquired": a grant of a free key.
	//   - "taken_over": a grant of a key whose previous grant had expired
	//     without a release (its holder died or lost the database); Reason
	//     names the expired grant.
	//   - "released": the holder released its grant.
	//   - "force_released": an operator ended the grant; Reason is theirs.
	//   - "info_changed": the holder changed its holder info
	//     ([Lease.SetHolderInfo]).
	//   - "expired" (a watch only): the watcher read the key and found its
	//     grant expired and not released: nobody holds it until the next
	//     grant (a taken_over). At is the grant's expiry. A grant taken over
	//     before the watcher read it gets none: the taken_over says it.
	//   - "gap" (a watch only): the database pruned events the watcher had
	//     not read yet (it keeps about the newest 100 per key): some
	//     transitions were missed between the previous event and the next.
	Kind string
	// Holder and Token identify the grant the event is about.
	Holder string
	Token  int64
	// HolderInfo is the grant's holder info: as granted (acquired,
	// taken_over), as changed (info_changed), or the last known (expired).
	// Empty for events a holder that recorded none, and for released events.
	HolderInfo string
	// At is the time of the event by the database clock.
	At time.Time
	// Reason says more: the expired grant for taken_over, the operator's
	// reason for force_released, "released after expiry" for a release that
	// came after the grant had expired.
	Reason string
	// ClientVersion is the granting client's library version on acquired and
	// taken_over events (see [Status.ClientVersion]); empty otherwise.
	ClientVersion string
}

// Granted reports whether e is a new grant (acquired or taken_over).
func (e Event) Granted() bool { return e.Kind == "acquired" || e.Kind == "taken_over" }

// Ended reports whether e ends a grant (released, force_released, expired).
func (e Event) Ended() bool {
	return e.Kind == "released" || e.Kind == "force_released" || e.Kind == "expired"
}

// WatchOptions tunes [Client.Watch]. A nil *WatchOptions uses the defaults.
type WatchOptions struct {
	// History replays up to this many of the key's newest events first (the
	// database keeps about 100). Zero: the watch starts with the events of
	// the key's current (or last) grant, so the first event says who holds
	// it.
	History int
	// PollInterval is the longest time between two reads of a free key
	// while wake-ups (LISTEN, see [Config.DisableWakeups]) work: it bounds
	// how late a grant that was not announced is seen. While the key is
	// held the watcher does not poll: every way a grant ends is either
	// announced (a release, a force-release) or its expiry, at which the
	// watcher reads the key, and a signed renewal announcement
	// (of a lease granted with [AcquireOptions.Announce]) moves that time. Default
	// [Config.PollInterval]. Without wake-ups (disabled, or the LISTEN
	// connection down) the watcher reads every [Config.BackoffMax] and at
	// the holder's expiry: that bounds how late a release or an unannounced
	// grant is seen.
	PollInterval time.Duration
}

// WatchState is what a [Watcher] read last.
type WatchState struct {
	// Lease is the key's lease row as of ReadAt (a zero Key when the key has
	// never been leased). Its Live and Remaining are as of ReadAt.
	Lease Status
	// ReadAt is when the last successful read returned, by the local clock
	// (zero before the first).
	ReadAt time.Time
	// HeardAt is when the watcher last learned the key's state, by the local
	// clock: ReadAt, or a later signed renewal announcement it believed
	// (zero before the first read).
	HeardAt time.Time
	// Err is the last read's error, nil when it succeeded; after the
	// client was closed ([Client.Close]) it wraps [ErrClosed].
	Err error
}

// Watcher streams the transitions of one key; see [Client.Watch].
type Watcher struct {
	c      *Client
	key    string
	opts   WatchOptions
	events chan Event
	signal chan struct{} // a wake-up or an announced expiry (buffered, 1)
	reads  atomic.Int64  // reads sent (for tests)

	mu       sync.Mutex
	state    WatchState
	readNow  bool      // a wake-up asked for a read
	expiry   time.Time // local time the current grant runs out, zero if none
	lastRead time.Time // local time of the last read attempt
	// The database time readAtDB (the current grant's expiry less its
	// remaining time) was readAtLocal here: announced expiries are moved
	// onto the local clock with them.
	readAtDB, readAtLocal time.Time
	// tagKey checks renewal announcements (pgfence.announce_key); nil until
	// read, and announcements are ignored until then.
	tagKey []byte
}

// Watch streams the transitions of key, in the order the database recorded
// them, from pgfence.lease_events and wake-ups: grants, takeovers,
// releases, force-releases and holder info changes, each with who (holder
// id and holder info), the token and the time by the database clock; plus
// the expiries it observes. Events come on [Watcher.Events] until ctx ends
// or the client is closed, then the channel is closed. Reading errors
// (database unreachable) do not end the watch: it retries with backoff and
// reports them in [Watcher.State].
//
// A watcher that idles costs nothing while wake-ups work and the holder
// announces its renewals (a free key is read every
// [WatchOptions.PollInterval]); it reads the key when a grant, release or change is announced, and when
// the holder's lease runs out. The events of a key are consecutive, none
// missing, unless the database pruned them first (a gap event).
//
// Members of pgfence_app see only the keys under prefixes granted to their
// role (others look never leased).
func (c *Client) Watch(ctx context.Context, key string, opts *WatchOptions) (*Watcher, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	o := deref(opts)
	if o.History < 0 {
		return nil, invalid("WatchOptions.History", "must not be negative, got %d", o.History)
	}
	if err := checkInterval("WatchOptions.PollInterval", o.PollInterval); err != nil {
		return nil, err
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	o.PollInterval = cmp.Or(o.PollInterval, c.cfg.PollInterval)
	w := &Watcher{c: c, key: key, opts: o, events: make(chan Event), signal: make(chan struct{}, 1)}
	c.startListener()
	c.mu.Lock()
	c.watchers[key] = append(c.watchers[key], w)
	c.mu.Unlock()
	go w.run(ctx)
	return w, nil
}

// Events delivers the key's transitions; it is closed when the watch's
// context ends or the client is closed.
func (w *Watcher) Events() <-chan Event { return w.events }

// State returns what the watcher read last.
func (w *Watcher) State() WatchState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state
}

// wake asks for a read now (a grant, release or change was announced).
func (w *Watcher) wake() {
	w.mu.Lock()
	w.readNow = true
	w.mu.Unlock()
	offer(w.signal, struct{}{})
}

// renewal is a renewal announcement: the grant token of the key runs out at
// expiry by the database clock; tag signs it (see pgfence.announce_renewal).
type renewal struct {
	token  int64
	expiry int64 // microseconds since the Unix epoch
	tag    []byte
}

// signed reports whether r's tag is the one pgfence.announce_renewal computes
// for key with tagKey.
func (r renewal) signed(tagKey []byte, key string) bool {
	if len(tagKey) != sha256.Size {
		return false
	}
	msg := sha256.Sum256([]byte(strconv.FormatInt(r.token, 10) + ":" + strconv.FormatInt(r.expiry, 10) + ":" + key))
	tag := sha256.Sum256(slices.Concat(tagKey, msg[:]))
	return subtle.ConstantTimeCompare(r.tag, tag[:]) == 1
}

// renewed moves the current grant's expiry to an announced renewal's, when
// the announcement is signed, is about the grant the watcher read, and moves
// the expiry later (a replayed older one does not). Anything else is
// ignored: the grant that makes a free key live is announced and read, and a
// watcher reads the key at the expiry it knows anyway.
func (w *Watcher) renewed(r renewal) {
	w.mu.Lock()
	moved := false
	if st := w.state.Lease; st.Live && r.token == st.Token && r.signed(w.tagKey, w.key) && !w.readAtLocal.IsZero() {
		at := w.readAtLocal.Add(time.UnixMicro(r.expiry).Sub(w.readAtDB))
		if at.After(w.expiry) {
			w.expiry = at
			w.state.HeardAt = w.c.now()
			moved = true
		}
	}
	w.mu.Unlock()
	if moved {
		offer(w.signal, struct{}{})
	}
}

const (
	// sqlWatchStart is the id a watch starts from: the oldest of the key's
	// newest $2 events, or (with $2 = 0) the current or last grant's.
	sqlWatchStart = `SELECT COALESCE(CASE WHEN $2 > 0
  THEN (SELECT pg_catalog.min(t.id) FROM (SELECT e.id FROM pgfence.lease_events AS e WHERE e.key = $1 ORDER BY e.id DESC LIMIT $2) AS t)
  ELSE (SELECT pg_catalog.max(e.id) FROM pgfence.lease_events AS e WHERE e.key = $1 AND e.event IN ('acquired', 'taken_over')) END, 0)`
	// sqlWatch reads the key's lease row, its events from id $2 on (at most
	// $3) and whether the key still has events up to id $2, in one statement,
	// so all come from one snapshot. Without a lease row or events, it returns
	// one row of NULLs (coalesced).
	sqlWatch = `SELECT ` + statusColumns + `, ` + eventColumns + `,
       EXISTS (SELECT 1 FROM pgfence.lease_events AS k WHERE k.key = $1 AND k.id <= $2)
  FROM (SELECT 1) AS one
  LEFT JOIN pgfence.lease_status AS s ON s.key = $1
  LEFT JOIN LATERAL (SELECT * FROM pgfence.lease_events AS x WHERE x.key = $1 AND x.id >= $2 ORDER BY x.id LIMIT $3) AS e ON true
 ORDER BY e.id`
	watchBatch = 100
)

// read is one read: the lease row, the events from id from on, and whether
// the key still has events up to id from (pruning drops the oldest first: if
// none is left, events after from may be missing; an info_changed event
// replaced by a newer one of its grant is not missed, the newer one follows).
func (w *Watcher) read(ctx context.Context, from int64) (st Status, evs []Event, kept bool, err error) {
	w.reads.Add(1)
	evs, err = read(ctx, w.c, fmt.Sprintf("watch %q", w.key), func(row pgx.CollectableRow) (e Event, err error) {
		var s statusRow
		err = row.Scan(append(append(s.dest(), e.dest()...), &kept)...)
		st = s.status() // every row carries the same lease row and kept
		return e, err
	}, sqlWatch, w.key, from, watchBatch)
	// A key without events (from from on) has one row with a zero event.
	return st, slices.DeleteFunc(evs, func(e Event) bool { return e.ID == 0 }), kept, err
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.events)
	defer func() {
		w.c.mu.Lock()
		w.c.watchers[w.key] = slices.DeleteFunc(w.c.watchers[w.key], func(x *Watcher) bool { return x == w })
		w.c.mu.Unlock()
		// Ended by Close, not by its context: State says so.
		if ctx.Err() == nil && w.c.isClosed() {
			w.mu.Lock()
			w.state.Err = fmt.Errorf("leases: watch %q: %w", w.key, ErrClosed)
			w.mu.Unlock()
		}
	}()
	var (
		started   bool
		from      int64 // events from this id on are new, until one is delivered
		last      int64 // the last event delivered, 0 before the first
		lastGrant int64 // the token of the newest grant delivered
		expired   int64 // the token whose expiry was delivered
		failures  int
	)
	for {
		w.mu.Lock()
		w.readNow = false
		w.lastRead = w.c.now()
		w.mu.Unlock()
		var (
			st   Status
			evs  []Event
			kept bool
			err  error
		)
		if !started {
			err = w.c.pool.QueryRow(ctx, sqlWatchStart, w.key, w.opts.History).Scan(&from)
			if started = err == nil; !started {
				err = fmt.Errorf("leases: watch %q: %w", w.key, classifyRead(ctx, err))
			}
		}
		if err == nil {
			// Read from the last event delivered, to see that it is still
			// there: if it is not, the history was pruned past it.
			st, evs, kept, err = w.read(ctx, max(from, last))
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			w.mu.Lock()
			w.state.Err = err
			w.mu.Unlock()
			if !w.wait(ctx, max(time.Millisecond, fullJitter(capped(w.c.cfg.BackoffMin, failures, w.poll())))) {
				return
			}
			continue
		}
		failures = 0
		more := len(evs) == watchBatch
		var out []Event
		if last > 0 {
			if len(evs) > 0 && evs[0].ID == last {
				evs = evs[1:]
			} else if !kept {
				// Said once: from here on the watch goes on after the lost
				// event (the events read above all follow it) without
				// checking for it again, or a key whose history has nothing
				// up to it would report the gap at every read.
				out = append(out, Event{Kind: "gap", Key: w.key})
				from, last = last+1, 0
			}
		}
		out = append(out, evs...)
		for _, e := range evs {
			if e.Granted() {
				lastGrant = e.Token
			}
		}
		if st.Key != "" && !st.Live && st.ReleasedAt.IsZero() && st.Token >= lastGrant && expired != st.Token {
			expired = st.Token
			out = append(out, Event{Kind: "expired", Key: w.key, Holder: st.Holder, Token: st.Token, HolderInfo: st.HolderInfo, At: st.ExpiresAt})
		}
		if w.tagKey == nil { // renewal announcements are ignored until it is read
			var k []byte
			w.reads.Add(1)
			if w.c.pool.QueryRow(ctx, sqlAnnounceKey, w.key).Scan(&k) == nil {
				w.mu.Lock()
				w.tagKey = k
				w.mu.Unlock()
			}
		}
		// The state first: a consumer that got the events sees it.
		now := w.c.now()
		w.mu.Lock()
		w.state = WatchState{Lease: st, ReadAt: now, HeardAt: now}
		w.expiry, w.readAtLocal, w.readAtDB = time.Time{}, time.Time{}, time.Time{}
		if st.Live {
			w.expiry = now.Add(st.Remaining)
			w.readAtLocal, w.readAtDB = now, st.ExpiresAt.Add(-st.Remaining)
		}
		w.mu.Unlock()
		for _, e := range out {
			select {
			case w.events <- e:
			case <-ctx.Done():
				return
			case <-w.c.lifetime.Done():
				return
			}
			last = max(last, e.ID)
		}
		if !more && !w.wait(ctx, 0) {
			return
		}
	}
}

// poll is the longest time between two reads now.
func (w *Watcher) poll() time.Duration {
	if !w.c.listenUp.Load() {
		return w.c.cfg.BackoffMax
	}
	return w.opts.PollInterval
}

// wait waits until the next read is due: a wake-up, the current grant's
// expiry (plus a jitter), the poll interval after the last read, or (after
// a failed read) retry. It returns false when the watch ends.
func (w *Watcher) wait(ctx context.Context, retry time.Duration) bool {
	timer := time.NewTimer(time.Hour) // Reset discards a stale tick (Go 1.23)
	defer timer.Stop()
	retryAt := w.c.now().Add(retry)
	for {
		poll, listening := w.poll(), w.c.listenUp.Load()
		w.mu.Lock()
		if w.readNow {
			w.mu.Unlock()
			return true
		}
		d := w.c.until(w.lastRead.Add(poll))
		if !w.expiry.IsZero() {
			// A held key is read at its expiry; without wake-ups, also at
			// every poll (a release would not be heard).
			at := w.c.until(w.expiry) + fullJitter(w.c.cfg.BackoffMin)
			if listening {
				d = at
			} else {
				d = min(d, at)
			}
		}
		w.mu.Unlock()
		if retry > 0 {
			d = min(d, w.c.until(retryAt))
		}
		if d <= 0 {
			return true
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-w.c.lifetime.Done():
			return false
		case <-w.signal:
		case <-timer.C:
			return true
		}
	}
}

// watching calls f for every watcher of key (of every key when key is ""),
// without holding c.mu (a watcher takes its own lock, and may take c.mu
// under it).
func (c *Client) watching(key string, f func(*Watcher)) {
	c.mu.Lock()
	ws := ofKey(c.watchers, key)
	c.mu.Unlock()
	for _, w := range ws {
		f(w)
	}
}

// dispatchChange handles a notification on changeNotifyChannel:
// "renewed:<remaining µs>:<token>:<expiry µs>:<tag>:<key>" or
// "<event>:<remaining µs>:<key>". A renewal that does not parse is ignored.
func (c *Client) dispatchChange(payload string) {
	f := strings.SplitN(payload, ":", 3)
	if len(f) != 3 {
		return
	}
	if n, err := strconv.ParseInt(f[1], 10, 64); err != nil || n < 0 {
		return
	}
	if f[0] != "renewed" {
		c.watching(f[2], (*Watcher).wake)
		return
	}
	// "<token>:<expiry µs>:<tag>:<key>"
	r := strings.SplitN(f[2], ":", 4)
	if len(r) != 4 {
		return
	}
	token, err1 := strconv.ParseInt(r[0], 10, 64)
	expiry, err2 := strconv.ParseInt(r[1], 10, 64)
	tag, err3 := hex.DecodeString(r[2])
	if err1 == nil && err2 == nil && err3 == nil {
		c.watching(r[3], func(w *Watcher) { w.renewed(renewal{token: token, expiry: expiry, tag: tag}) })
	}
}
