package faultproxy

import (
	"bytes"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Message is one client→server protocol message, as a predicate sees it.
type Message struct {
	// Type is the message type byte: 'Q' Query, 'P' Parse, 'B' Bind,
	// 'E' Execute, 'S' Sync, 'X' Terminate, ...
	Type byte
	// SQL is the statement text the message concerns: the query of a 'Q', the
	// statement of a 'P', and for 'B', 'D' and 'E' the statement that the
	// named statement or portal was parsed from ("" if unknown).
	SQL string
	// Body is the message payload after the length word. It is only valid
	// during the predicate call; a [Trigger] keeps a copy.
	Body []byte
}

// Runs reports whether the server executes SQL when it receives m: a simple
// Query or an Execute.
func (m Message) Runs() bool { return m.Type == 'Q' || m.Type == 'E' }

// SQLContains returns a predicate that matches a message that runs SQL (see
// [Message.Runs]) whose text contains substr, case-insensitively.
func SQLContains(substr string) func(Message) bool {
	lower := strings.ToLower(substr)
	return func(m Message) bool {
		return m.Runs() && strings.Contains(strings.ToLower(m.SQL), lower)
	}
}

// IsCommit matches a message that runs COMMIT (or its synonym END): the
// moment a transaction's outcome is decided.
func IsCommit(m Message) bool {
	if !m.Runs() {
		return false
	}
	words := strings.Fields(strings.ToUpper(m.SQL))
	if len(words) == 0 {
		return false
	}
	first := strings.TrimRight(words[0], ";")
	return first == "COMMIT" || first == "END"
}

// statements follows Parse and Bind on one connection, so an Execute can be
// matched by the SQL it runs.
type statements struct {
	stmts   map[string]string // prepared statement name → SQL
	portals map[string]string // portal name → SQL
}

// describe fills m.SQL from the message body.
func (s *statements) describe(m *Message) {
	body := m.Body
	switch m.Type {
	case 'Q':
		m.SQL, _ = cstring(body)
	case 'P':
		name, rest := cstring(body)
		query, _ := cstring(rest)
		s.stmts[name] = query
		m.SQL = query
	case 'B':
		portal, rest := cstring(body)
		stmt, _ := cstring(rest)
		s.portals[portal] = s.stmts[stmt]
		m.SQL = s.portals[portal]
	case 'E':
		portal, _ := cstring(body)
		m.SQL = s.portals[portal]
	case 'D':
		if len(body) > 0 {
			name, _ := cstring(body[1:])
			if body[0] == 'S' {
				m.SQL = s.stmts[name]
			} else {
				m.SQL = s.portals[name]
			}
		}
	case 'C':
		if len(body) > 0 {
			name, _ := cstring(body[1:])
			if body[0] == 'S' {
				delete(s.stmts, name)
			} else {
				delete(s.portals, name)
			}
		}
	}
}

// cstring splits a NUL-terminated string off b.
func cstring(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}

// Trigger is an armed one-shot cut, returned by [Proxy.CutBefore] and
// [Proxy.CutAfter]. The first client→server message on any connection that
// its predicate matches fires it.
type Trigger struct {
	p       *Proxy
	match   func(Message) bool
	forward bool

	claimed atomic.Bool // a connection has taken it
	once    sync.Once
	done    chan struct{}

	mu      sync.Mutex
	fired   bool
	replied bool
	msg     Message
}

// CutBefore arms a trigger that closes the connection on which a client→server
// message matching match is seen, without forwarding that message: the server
// never receives it (a lost request). match runs on the proxy's goroutines and
// must not call the proxy.
func (p *Proxy) CutBefore(match func(Message) bool) *Trigger { return p.arm(match, false) }

// CutAfter arms a trigger that forwards the first client→server message
// matching match (for an extended-protocol message: up to and including the
// next Sync) and then closes the connection, dropping every byte the server
// sends afterwards: the server runs the request, the client never learns the
// result (a lost reply). match runs on the proxy's goroutines and must not call
// the proxy.
func (p *Proxy) CutAfter(match func(Message) bool) *Trigger { return p.arm(match, true) }

func (p *Proxy) arm(match func(Message) bool, forward bool) *Trigger {
	t := &Trigger{p: p, match: match, forward: forward, done: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		t.cancel()
		return t
	}
	p.triggers = append(p.triggers, t)
	return t
}

// claim returns the armed trigger that m fires, removing it, or nil.
func (p *Proxy) claim(m Message) *Trigger {
	p.mu.Lock()
	if len(p.triggers) == 0 {
		p.mu.Unlock()
		return nil
	}
	armed := append([]*Trigger(nil), p.triggers...)
	p.mu.Unlock()
	for _, t := range armed {
		if t.claimed.Load() || !t.match(m) || !t.claimed.CompareAndSwap(false, true) {
			continue
		}
		p.disarm(t)
		t.mu.Lock()
		t.msg = Message{Type: m.Type, SQL: m.SQL, Body: append([]byte(nil), m.Body...)}
		t.mu.Unlock()
		return t
	}
	return nil
}

func (p *Proxy) disarm(t *Trigger) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.triggers {
		if x == t {
			p.triggers = append(p.triggers[:i], p.triggers[i+1:]...)
			return
		}
	}
}

// Done is closed when the cut has happened (the connection is closed on both
// sides) or the trigger was cancelled.
func (t *Trigger) Done() <-chan struct{} { return t.done }

// Fired reports whether a message matched and its connection was cut. A
// client can see its connection break before the proxy has finished the cut,
// so once a message matched, Fired waits for the cut to complete (at most
// settleTimeout) instead of answering false too early.
func (t *Trigger) Fired() bool {
	t.settle()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fired
}

// settleTimeout bounds how long Fired and Replied wait for a cut in progress.
const settleTimeout = 5 * time.Second

// settle waits for a claimed trigger's cut to complete.
func (t *Trigger) settle() {
	if !t.claimed.Load() {
		return
	}
	select {
	case <-t.done:
	case <-time.After(settleTimeout):
	}
}

// Replied reports whether, for [Proxy.CutAfter], the server finished the
// forwarded message before the connection was closed (its ReadyForQuery, and
// the rest of its answer, were dropped): proof that the server processed it
// and committed the implicit transaction it ended, if any.
func (t *Trigger) Replied() bool {
	t.settle()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.replied
}

// Message is the message that fired the trigger (zero until it fired).
func (t *Trigger) Message() Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.msg
}

// Cancel disarms the trigger if it has not fired yet and closes Done. A
// trigger already firing completes its cut.
func (t *Trigger) Cancel() {
	if t.claimed.CompareAndSwap(false, true) {
		t.p.disarm(t)
		t.cancel()
	}
}

func (t *Trigger) cancel() { t.once.Do(func() { close(t.done) }) }

func (t *Trigger) finish(replied bool) {
	t.once.Do(func() {
		t.mu.Lock()
		t.fired, t.replied = true, replied
		t.mu.Unlock()
		close(t.done)
	})
}
