package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Direction is one half of a proxied connection.
type Direction int

const (
	// ClientToServer carries requests (the frontend protocol).
	ClientToServer Direction = iota
	// ServerToClient carries replies (the backend protocol).
	ServerToClient
)

func (d Direction) String() string {
	if d == ServerToClient {
		return "server→client"
	}
	return "client→server"
}

// Defaults for [Config].
const (
	// DialTimeoutDefault bounds the dial to the target for each new connection.
	DialTimeoutDefault = 5 * time.Second
	// CutGraceDefault is how long a cut-after-forward waits for the server's
	// reply before it closes the server side anyway.
	CutGraceDefault = 5 * time.Second
)

// Config configures [Start]. A nil *Config and zero fields use the defaults.
type Config struct {
	// DialTimeout bounds the dial to the target. Default [DialTimeoutDefault].
	DialTimeout time.Duration
	// CutGrace is how long a cut-after-forward keeps the server side open
	// waiting for the server to answer the forwarded message. Default
	// [CutGraceDefault].
	CutGrace time.Duration
}

// Proxy forwards TCP connections from a local listener to one target and
// injects faults on command. All methods are safe for concurrent use.
type Proxy struct {
	target string
	cfg    Config
	ln     net.Listener
	wg     sync.WaitGroup

	mu        sync.Mutex
	conns     map[*conn]struct{}
	triggers  []*Trigger
	refuse    bool
	delay     [2]time.Duration
	blackhole [2]bool
	hold      [2]chan struct{} // open while a direction is held; closed to release it
	fatal     bool             // cuts answer the client with a pooler's FATAL
	closed    bool
	cutKeys   map[[8]byte]struct{} // sessions cut after forwarding: process id, secret key

	accepted atomic.Int64
	refused  atomic.Int64
	cuts     atomic.Int64

	droppedCancels atomic.Int64
}

// Start listens on 127.0.0.1 on a free port and forwards every connection to
// target (host:port). Close it when done.
func Start(target string, cfg *Config) (*Proxy, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.DialTimeout < 0 {
		return nil, fmt.Errorf("faultproxy: Config.DialTimeout must not be negative, got %v", c.DialTimeout)
	}
	if c.CutGrace < 0 {
		return nil, fmt.Errorf("faultproxy: Config.CutGrace must not be negative, got %v", c.CutGrace)
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DialTimeoutDefault
	}
	if c.CutGrace == 0 {
		c.CutGrace = CutGraceDefault
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{target: target, cfg: c, ln: ln, conns: make(map[*conn]struct{}), cutKeys: make(map[[8]byte]struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's listening address, host:port on 127.0.0.1.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// ConnString returns connString (a postgres:// URL) with its host and port
// replaced by the proxy's, so a client connects through the proxy.
func (p *Proxy) ConnString(connString string) (string, error) {
	u, err := url.Parse(connString)
	if err != nil {
		return "", fmt.Errorf("faultproxy: connection string: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", fmt.Errorf("faultproxy: connection string must be a postgres:// URL, got scheme %q", u.Scheme)
	}
	u.Host = p.Addr()
	return u.String(), nil
}

// SetDelay delays every byte read in direction dir from now on by d before it
// is forwarded. Zero removes the delay.
func (p *Proxy) SetDelay(dir Direction, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay[dir] = d
}

// SetBlackhole makes the proxy read and discard, instead of forward, every
// byte in direction dir while on is true. Connections stay open.
func (p *Proxy) SetBlackhole(dir Direction, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole[dir] = on
}

// SetHold holds every byte of direction dir, read before or after the call,
// before it is forwarded, while on is true; setting it false releases them in
// order. Unlike a delay, a held request arrives exactly when the test says
// so, however slow the machine. Connections stay open.
func (p *Proxy) SetHold(dir Direction, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.hold[dir] == nil:
		p.hold[dir] = make(chan struct{})
	case !on && p.hold[dir] != nil:
		close(p.hold[dir])
		p.hold[dir] = nil
	}
}

// held returns the channel a writer of dir waits on while dir is held, or nil.
func (p *Proxy) held(dir Direction) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hold[dir]
}

// SetPoolerFatal makes every cut from now on (while on is true) answer the
// client as PgBouncer does when its server connection breaks: an
// ErrorResponse with severity FATAL and SQLSTATE 08P01 ("server conn
// crashed?"), then the close. For [Proxy.CutAfter] the server has run the
// message first, so the client hears a connection exception about a request
// that committed; for [Proxy.CutBefore] it hears the same about one that
// never reached the server.
func (p *Proxy) SetPoolerFatal(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fatal = on
}

// poolerFatal reports whether cuts answer with a pooler's FATAL.
func (p *Proxy) poolerFatal() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fatal
}

// SetRefuse makes the proxy reset every new connection while on is true (the
// client's connect fails); open connections are not affected.
func (p *Proxy) SetRefuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
}

// Heal removes every delay, hold, blackhole and refusal and disarms every trigger.
// It does not reopen cut connections.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = false
	p.fatal = false
	p.delay = [2]time.Duration{}
	p.blackhole = [2]bool{}
	for dir, ch := range p.hold {
		if ch != nil {
			close(ch)
			p.hold[dir] = nil
		}
	}
	p.triggers = nil
}

// CutAll closes every open connection now, both sides, and returns how many
// it closed.
func (p *Proxy) CutAll() int {
	p.mu.Lock()
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	p.cuts.Add(int64(len(conns)))
	return len(conns)
}

// Stats counts what the proxy has seen.
type Stats struct {
	Accepted int64 // connections accepted and forwarded
	Refused  int64 // connections reset by SetRefuse or a failed dial
	Open     int   // connections open now
	Cuts     int64 // connections closed by CutAll or a trigger
	// DroppedCancels counts cancel requests for sessions cut after
	// forwarding, which the proxy drops.
	DroppedCancels int64
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := len(p.conns)
	p.mu.Unlock()
	return Stats{Accepted: p.accepted.Load(), Refused: p.refused.Load(), Open: open, Cuts: p.cuts.Load(),
		DroppedCancels: p.droppedCancels.Load()}
}

// markCut remembers a session cut after forwarding, by the process id and
// secret key its cancel requests carry.
func (p *Proxy) markCut(key [8]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutKeys[key] = struct{}{}
}

func (p *Proxy) wasCut(key [8]byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.cutKeys[key]
	return ok
}

// Close stops listening, closes every connection and waits until every
// goroutine of the proxy has exited. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	triggers := p.triggers
	p.triggers = nil
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range conns {
		c.close()
	}
	p.wg.Wait()
	for _, t := range triggers {
		t.cancel()
	}
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		refuse, closed := p.refuse, p.closed
		p.mu.Unlock()
		if refuse || closed {
			p.refused.Add(1)
			reset(client)
			continue
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// reset closes c with an RST instead of a FIN, as a host that refuses does.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, p.cfg.DialTimeout)
	if err != nil {
		p.refused.Add(1)
		reset(client)
		return
	}
	c := newConn(p, client, server)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		reset(client)
		_ = server.Close()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	p.accepted.Add(1)
	c.run()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// settings returns the fault settings for direction dir.
func (p *Proxy) settings(dir Direction) (delay time.Duration, blackhole bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay[dir], p.blackhole[dir]
}
