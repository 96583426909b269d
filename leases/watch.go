package leases

import (
	"bytes"
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
)

// WatchKind says what a [WatchEvent] is.
type WatchKind string

// Watch event kinds. The first five are transitions the database recorded in
// the key's history (pgfence.lease_events); WatchExpired and WatchGap are what
// the watcher saw.
const (
	// WatchAcquired: a grant of a free key (Holder, Token, HolderInfo are the
	// new grant's).
	WatchAcquired WatchKind = "acquired"
	// WatchTakenOver: a grant of a key whose previous grant had expired
	// without a release (its holder died or lost the database); Reason names
	// the expired grant.
	WatchTakenOver WatchKind = "taken_over"
	// WatchReleased: the holder released its grant.
	WatchReleased WatchKind = "released"
	// WatchForceReleased: an operator ended the grant; Reason is theirs.
	WatchForceReleased WatchKind = "force_released"
	// WatchInfoChanged: the holder changed its holder info
	// ([Lease.SetHolderInfo]).
	WatchInfoChanged WatchKind = "info_changed"
	// WatchExpired: the watcher read the key and found its grant expired and
	// not released: nobody holds it until the next grant (which will be a
	// taken_over). At is the grant's expiry by the database clock; ID is 0.
	// A grant taken over before the watcher read it gets no WatchExpired: the
	// taken_over event says it.
	WatchExpired WatchKind = "expired"
	// WatchGap: the database pruned events this watcher had not read yet (it
	// keeps about the newest 100 per key): some transitions were missed
	// between the previous event and the next one. ID is 0.
	WatchGap WatchKind = "gap"
)

// WatchEvent is one transition of a watched key.
type WatchEvent struct {
	// ID orders the events of a key (pgfence.lease_events.id; later is
	// larger). Pass the last one seen as [WatchOptions.After] to resume. It
	// is 0 for WatchExpired and WatchGap.
	ID int64
	// Kind says what happened.
	Kind WatchKind
	// Key is the watched key.
	Key string
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
	// came too late.
	Reason string
}

// Granted reports whether e is a new grant (acquired or taken_over).
func (e WatchEvent) Granted() bool { return e.Kind == WatchAcquired || e.Kind == WatchTakenOver }

// Ended reports whether e ends a grant (released, force_released, expired).
func (e WatchEvent) Ended() bool {
	return e.Kind == WatchReleased || e.Kind == WatchForceReleased || e.Kind == WatchExpired
}

// WatchOptions tunes [Client.Watch]. A nil *WatchOptions uses the defaults.
type WatchOptions struct {
	// After resumes after the event with this ID (a [WatchEvent.ID] seen
	// before): every later event still in the history comes first. If the
	// key's history no longer holds that event (pruned), the watch starts
	// with one [WatchGap], then the key's events after it. Zero: see
	// History.
	After int64
	// History replays up to this many of the key's newest events first (the
	// database keeps about 100); it cannot be combined with After. Zero (and
	// no After): the watch starts with
	// the events of the key's current (or last) grant, so the first event
	// says who holds it.
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
	events chan WatchEvent
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
// missing, unless the database pruned them first ([WatchGap]).
//
// Members of pgfence_app see only the keys under prefixes granted to their
// role (others look never leased).
func (c *Client) Watch(ctx context.Context, key string, opts *WatchOptions) (*Watcher, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	var o WatchOptions
	if opts != nil {
		o = *opts
	}
	switch {
	case o.After < 0:
		return nil, invalid("WatchOptions.After", "must not be negative, got %d", o.After)
	case o.History < 0:
		return nil, invalid("WatchOptions.History", "must not be negative, got %d", o.History)
	case o.After > 0 && o.History > 0:
		return nil, invalid("WatchOptions.History", "cannot be combined with After (%d): After already says where the watch starts", o.After)
	}
	if err := checkInterval("WatchOptions.PollInterval", o.PollInterval); err != nil {
		return nil, err
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	w := &Watcher{c: c, key: key, opts: o, events: make(chan WatchEvent), signal: make(chan struct{}, 1)}
	c.startListener()
	c.addWatcher(w)
	go w.run(ctx)
	return w, nil
}

// Events delivers the key's transitions; it is closed when the watch's
// context ends or the client is closed.
func (w *Watcher) Events() <-chan WatchEvent { return w.events }

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
	tag := sha256.Sum256(append(bytes.Clone(tagKey), msg[:]...))
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
	sqlWatchFromGrant = `SELECT COALESCE(pg_catalog.max(e.id), 0) FROM pgfence.lease_events AS e
 WHERE e.key = $1 AND e.event IN ('acquired', 'taken_over')`
	sqlWatchHistory = `SELECT COALESCE(pg_catalog.min(t.id), 0)
  FROM (SELECT e.id FROM pgfence.lease_events AS e WHERE e.key = $1 ORDER BY e.id DESC LIMIT $2) AS t`
	// sqlWatch reads the key's lease row and its events from id $2 on (at
	// most $3), in one statement, so both come from one snapshot. Without a
	// lease row or events, it returns one row of NULLs.
	sqlWatch = `SELECT s.key, s.holder::text, s.token, s.granted_at, s.renewed_at, s.expires_at, s.released_at,
       s.holder_info, s.live, (EXTRACT(epoch FROM s.remaining) * 1000000)::bigint, s.client_version,
       e.id, e.event, e.holder::text, e.token, e.at, e.reason, e.holder_info
  FROM (SELECT 1) AS one
  LEFT JOIN pgfence.lease_status AS s ON s.key = $1
  LEFT JOIN LATERAL (SELECT x.id, x.event, x.holder, x.token, x.at, x.reason, x.holder_info
                       FROM pgfence.lease_events AS x
                      WHERE x.key = $1 AND x.id >= $2
                      ORDER BY x.id LIMIT $3) AS e ON true
 ORDER BY e.id`
	// sqlWatchKept says whether the key still has events up to id $2.
	sqlWatchKept = `SELECT EXISTS (SELECT 1 FROM pgfence.lease_events AS e WHERE e.key = $1 AND e.id <= $2)`
	watchBatch   = 100
)

// read is one read: the lease row, and the events from id from on.
func (w *Watcher) read(ctx context.Context, from int64) (st Status, evs []WatchEvent, err error) {
	conn, err := w.c.conn(ctx) // fails only when nothing was sent
	if err != nil {
		return st, nil, err
	}
	defer conn.Release()
	w.reads.Add(1)
	rows, err := conn.Query(ctx, sqlWatch, w.key, from, watchBatch)
	if err != nil {
		return st, nil, classifyRead(ctx, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			key, holder, info, version          *string
			token, remaining                    *int64
			granted, renewed, expires, released *time.Time
			live                                *bool
			id, etoken                          *int64
			event, eholder, reason, einfo       *string
			at                                  *time.Time
		)
		if err := rows.Scan(&key, &holder, &token, &granted, &renewed, &expires, &released, &info, &live, &remaining, &version,
			&id, &event, &eholder, &etoken, &at, &reason, &einfo); err != nil {
			return st, nil, classifyRead(ctx, err)
		}
		if key != nil && st.Key == "" {
			st = Status{Key: *key, Holder: deref(holder), Token: deref(token), GrantedAt: deref(granted), RenewedAt: deref(renewed),
				ExpiresAt: deref(expires), ReleasedAt: deref(released), HolderInfo: deref(info), Live: deref(live),
				Remaining: time.Duration(deref(remaining)) * time.Microsecond, ClientVersion: deref(version)}
		}
		if id != nil {
			evs = append(evs, WatchEvent{ID: *id, Kind: WatchKind(deref(event)), Key: w.key, Holder: deref(eholder), Token: deref(etoken),
				HolderInfo: deref(einfo), At: deref(at), Reason: deref(reason)})
		}
	}
	if err := rows.Err(); err != nil {
		return st, nil, classifyRead(ctx, err)
	}
	return st, evs, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// start finds the id the watch starts from (without After).
func (w *Watcher) start(ctx context.Context) (int64, error) {
	var start int64
	var err error
	switch {
	case w.opts.History > 0:
		err = w.c.pool.QueryRow(ctx, sqlWatchHistory, w.key, w.opts.History).Scan(&start)
	default:
		err = w.c.pool.QueryRow(ctx, sqlWatchFromGrant, w.key).Scan(&start)
	}
	if err != nil {
		return 0, classifyRead(ctx, err)
	}
	return start, nil
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.events)
	defer w.c.removeWatcher(w)
	defer func() {
		// Ended by Close, not by its context: State says so.
		if ctx.Err() == nil && w.c.isClosed() {
			w.mu.Lock()
			w.state.Err = fmt.Errorf("leases: watch %q: %w", w.key, ErrClosed)
			w.mu.Unlock()
		}
	}()
	var (
		started   bool
		from      int64      // events from this id on are new, until one is delivered
		last      int64      // the last event delivered, 0 before the first
		lastGrant WatchEvent // the newest grant delivered
		expired   int64      // the token whose expiry was delivered
		failures  int
	)
	send := func(e WatchEvent) bool {
		select {
		case w.events <- e:
			return true
		case <-ctx.Done():
		case <-w.c.closing:
		}
		return false
	}
	for {
		w.mu.Lock()
		w.readNow = false
		w.lastRead = w.c.now()
		w.mu.Unlock()
		var (
			st  Status
			evs []WatchEvent
			err error
		)
		if !started {
			if w.opts.After > 0 {
				last = w.opts.After // as if delivered: the next one follows it
			} else {
				from, err = w.start(ctx)
			}
			started = err == nil
		}
		if err == nil {
			// Read from the last event delivered, to see that it is still
			// there: if it is not, the history was pruned past it.
			st, evs, err = w.read(ctx, max(from, last))
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			w.mu.Lock()
			w.state.Err = fmt.Errorf("leases: watch %q: %w", w.key, err)
			w.mu.Unlock()
			if !w.sleep(ctx, fullJitter(capped(w.c.cfg.BackoffMin, failures, w.poll()))) {
				return
			}
			continue
		}
		failures = 0
		more := len(evs) == watchBatch
		if last > 0 {
			if len(evs) > 0 && evs[0].ID == last {
				evs = evs[1:]
			} else if pruned, perr := w.pruned(ctx, last); perr == nil && pruned {
				if !send(WatchEvent{Kind: WatchGap, Key: w.key}) {
					return
				}
				// Said once: from here on the watch goes on after the lost
				// event (the events read above all follow it) without
				// checking for it again, or a key whose history has nothing
				// up to it would report the gap at every read.
				from, last = last+1, 0
			}
		}
		if w.tagKey == nil {
			w.fetchTagKey(ctx)
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
		for _, e := range evs {
			if !send(e) {
				return
			}
			last = e.ID
			if e.Granted() {
				lastGrant = e
			}
		}
		if st.Key != "" && !st.Live && st.ReleasedAt.IsZero() && st.Token >= lastGrant.Token && expired != st.Token {
			expired = st.Token
			if !send(WatchEvent{Kind: WatchExpired, Key: w.key, Holder: st.Holder, Token: st.Token, HolderInfo: st.HolderInfo, At: st.ExpiresAt}) {
				return
			}
		}
		if more {
			continue // more events wait
		}
		if !w.wait(ctx) {
			return
		}
	}
}

// fetchTagKey reads the key renewal announcements are signed with. Until it
// succeeds announcements are ignored (the watcher reads at each expiry it
// knows instead); it is tried again after the next read.
func (w *Watcher) fetchTagKey(ctx context.Context) {
	var k []byte
	w.reads.Add(1)
	if err := w.c.pool.QueryRow(ctx, sqlAnnounceKey, w.key).Scan(&k); err != nil {
		w.c.log.DebugContext(ctx, "leases: watch: renewal announcements of this key are not checked", "key", w.key, "err", err)
		return
	}
	w.mu.Lock()
	w.tagKey = k
	w.mu.Unlock()
}

// pruned reports whether the history of the key lost every event up to id
// last (pruning drops the oldest first), so that events after it may be
// missing. (An info_changed event replaced by a newer one of its grant is
// not missed: the newer one follows.)
func (w *Watcher) pruned(ctx context.Context, last int64) (bool, error) {
	var kept bool
	err := w.c.pool.QueryRow(ctx, sqlWatchKept, w.key, last).Scan(&kept)
	return !kept, err
}

// poll is the longest time between two reads now.
func (w *Watcher) poll() time.Duration {
	switch {
	case !w.c.listening():
		return w.c.cfg.BackoffMax
	case w.opts.PollInterval > 0:
		return w.opts.PollInterval
	}
	return w.c.cfg.PollInterval
}

// wait waits until the next read is due: a wake-up, the current grant's
// expiry (plus a jitter), or the poll interval after the last read. It
// returns false when the watch ends.
func (w *Watcher) wait(ctx context.Context) bool {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		poll, listening := w.poll(), w.c.listening() // take the client's lock: not under w.mu
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
		if d <= 0 {
			return true
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-w.c.closing:
			return false
		case <-w.signal:
		case <-timer.C:
			return true
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// sleep sleeps for d unless a wake-up comes first; false when the watch ends.
func (w *Watcher) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(max(d, time.Millisecond))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-w.c.closing:
		return false
	case <-w.signal:
		return true
	case <-t.C:
		return true
	}
}

func (c *Client) addWatcher(w *Watcher) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.watchers == nil {
		c.watchers = make(map[string][]*Watcher)
	}
	c.watchers[w.key] = append(c.watchers[w.key], w)
}

func (c *Client) removeWatcher(w *Watcher) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ws := c.watchers[w.key]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(c.watchers, w.key)
	} else {
		c.watchers[w.key] = ws
	}
}

// watching calls f for every watcher of key, without holding c.mu (a
// watcher takes its own lock, and may take c.mu under it).
func (c *Client) watching(key string, f func(*Watcher)) {
	c.mu.Lock()
	ws := slices.Clone(c.watchers[key])
	c.mu.Unlock()
	for _, w := range ws {
		f(w)
	}
}

// dispatchChange handles a notification on changeNotifyChannel:
// "renewed:<remaining µs>:<token>:<expiry µs>:<tag>:<key>" or
// "<event>:<remaining µs>:<key>". A renewal that does not parse is ignored.
func (c *Client) dispatchChange(payload string) {
	event, rest, ok := strings.Cut(payload, ":")
	if !ok {
		return
	}
	micros, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return
	}
	if n, err := strconv.ParseInt(micros, 10, 64); err != nil || n < 0 {
		return
	}
	if event != "renewed" {
		c.wakeWatchersOf(rest)
		return
	}
	r, key, ok := parseRenewal(rest)
	if !ok {
		return
	}
	c.watching(key, func(w *Watcher) { w.renewed(r) })
}

// parseRenewal parses "<token>:<expiry µs>:<tag>:<key>".
func parseRenewal(s string) (r renewal, key string, ok bool) {
	token, s, ok1 := strings.Cut(s, ":")
	expiry, s, ok2 := strings.Cut(s, ":")
	tag, key, ok3 := strings.Cut(s, ":")
	if !ok1 || !ok2 || !ok3 {
		return r, "", false
	}
	var err error
	if r.token, err = strconv.ParseInt(token, 10, 64); err != nil {
		return r, "", false
	}
	if r.expiry, err = strconv.ParseInt(expiry, 10, 64); err != nil {
		return r, "", false
	}
	if r.tag, err = hex.DecodeString(tag); err != nil {
		return r, "", false
	}
	return r, key, true
}
