package faultproxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Startup packet request codes (protocol 3.0).
const (
	codeCancel  = 80877102
	codeSSL     = 80877103
	codeGSSEnc  = 80877104
	maxStartup  = 10000
	maxMessage  = 1 << 30
	queueLength = 256
)

var errCancelDropped = errors.New("faultproxy: cancel request for a cut session dropped")

// conn is one proxied connection: four goroutines, a reader and a writer per
// direction, joined by queues that carry each chunk's due time.
type conn struct {
	p              *Proxy
	client, server net.Conn

	done      chan struct{}
	closeOnce sync.Once

	// dropReplies is set when a cut-after-forward sends its message: from then
	// on nothing the server says reaches the client.
	dropReplies atomic.Bool
	spoke       chan struct{} // closed when the server has answered the cut message
	spokeOnce   sync.Once

	// The server has finished a request when it sends ReadyForQuery ('Z'):
	// one after the startup, one per Sync, simple Query and FunctionCall. A
	// reply to an earlier message of a pipeline (its rows, CommandComplete)
	// does not mean the transaction that the cut message ends has committed.
	requests   atomic.Int64 // requests forwarded that end with ReadyForQuery
	ready      atomic.Int64 // ReadyForQuery messages the server sent
	replyReady atomic.Int64 // the count of ready that answers the cut message

	// The server→client message parser (readServer only): the current
	// message's header, the body bytes left to skip, and the body of
	// BackendKeyData ('K'), which names the session in cancel requests.
	hdr     [5]byte
	hdrN    int
	skip    int64
	keyData []byte
	key     atomic.Pointer[[8]byte] // the session's process id and secret key

	mu      sync.Mutex
	claimed []*Trigger // triggers this connection took, finished at the end
}

// chunk is a run of bytes read in one direction.
type chunk struct {
	data []byte
	due  time.Time
	eof  bool     // the sender closed its side
	cut  *Trigger // cut the connection after this chunk (before it if !cut.forward)
	// startup: the startup packet, which the server answers with
	// ReadyForQuery once the session is ready.
	startup bool
}

func newConn(p *Proxy, client, server net.Conn) *conn {
	c := &conn{p: p, client: client, server: server, done: make(chan struct{}), spoke: make(chan struct{})}
	c.replyReady.Store(math.MaxInt64)
	return c
}

// endsRequest reports whether a client message makes the server finish with
// ReadyForQuery: Sync, simple Query, FunctionCall.
func endsRequest(data []byte) bool {
	return len(data) > 0 && (data[0] == 'S' || data[0] == 'Q' || data[0] == 'F')
}

// scanServer follows the server's messages: it counts ReadyForQuery and keeps
// BackendKeyData. Every server message has a type byte and a length, from the
// first byte on (the proxy answers SSL and GSS requests itself).
func (c *conn) scanServer(b []byte) {
	for len(b) > 0 {
		if c.skip > 0 {
			k := min(int64(len(b)), c.skip)
			if c.keyData != nil {
				c.keyData = append(c.keyData, b[:k]...)
				if len(c.keyData) == 8 {
					key := [8]byte(c.keyData)
					c.key.Store(&key)
					c.keyData = nil
				}
			}
			c.skip -= k
			b = b[k:]
			continue
		}
		k := copy(c.hdr[c.hdrN:], b)
		c.hdrN += k
		b = b[k:]
		if c.hdrN < len(c.hdr) {
			return
		}
		c.skip = int64(binary.BigEndian.Uint32(c.hdr[1:])) - 4
		c.hdrN = 0
		switch {
		case c.hdr[0] == 'Z':
			c.ready.Add(1)
		case c.hdr[0] == 'K' && c.skip == 8:
			c.keyData = make([]byte, 0, 8)
		}
	}
}

func (c *conn) run() {
	up := make(chan chunk, queueLength)
	down := make(chan chunk, queueLength)
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); c.readClient(up) }()
	go func() { defer wg.Done(); c.write(ClientToServer, c.server, up) }()
	go func() { defer wg.Done(); c.readServer(down) }()
	go func() { defer wg.Done(); c.write(ServerToClient, c.client, down) }()
	wg.Wait()
	c.close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.claimed {
		t.finish(false) // no-op for a trigger that completed its cut
	}
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		close(c.done)
		_ = c.client.Close()
		_ = c.server.Close()
	})
}

func (c *conn) closed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// push queues ch for the writer of dir, stamped with the current delay. It
// reports false when the connection closed first.
func (c *conn) push(dir Direction, q chan<- chunk, ch chunk) bool {
	delay, _ := c.p.settings(dir)
	ch.due = time.Now().Add(delay)
	select {
	case q <- ch:
		return true
	case <-c.done:
		return false
	}
}

// readErr ends a reader: EOF is passed on to the writer (after the delay, as
// a FIN would be), any other error closes the connection.
func (c *conn) readErr(dir Direction, q chan<- chunk, err error) {
	if errors.Is(err, io.EOF) && !c.closed() {
		c.push(dir, q, chunk{eof: true})
		return
	}
	c.close()
}

// readServer copies the server's bytes into the queue, or discards them once a
// cut-after-forward has sent its message.
func (c *conn) readServer(q chan<- chunk) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			c.scanServer(buf[:n])
			if c.dropReplies.Load() {
				if c.ready.Load() >= c.replyReady.Load() {
					c.spokeOnce.Do(func() { close(c.spoke) })
				}
			} else if !c.push(ServerToClient, q, chunk{data: append([]byte(nil), buf[:n]...)}) {
				return
			}
		}
		if err != nil {
			if c.dropReplies.Load() {
				return // the cut closes the connection
			}
			c.readErr(ServerToClient, q, err)
			return
		}
	}
}

// readClient parses the frontend protocol: the startup phase, then typed
// messages, each checked against the armed triggers.
func (c *conn) readClient(q chan<- chunk) {
	r := bufio.NewReaderSize(c.client, 64<<10)
	raw, err := c.startup(r, q)
	if err != nil {
		c.readErr(ClientToServer, q, err)
		return
	}
	if raw {
		c.copyRaw(r, q)
		return
	}
	st := &statements{stmts: map[string]string{}, portals: map[string]string{}}
	var pending *Trigger // a cut-after-forward waiting for the next Sync
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			c.readErr(ClientToServer, q, err)
			return
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n < 4 || n > maxMessage {
			c.close() // not the PostgreSQL protocol
			return
		}
		data := make([]byte, 1+int(n))
		copy(data, hdr[:])
		if _, err := io.ReadFull(r, data[5:]); err != nil {
			c.readErr(ClientToServer, q, err)
			return
		}
		m := Message{Type: hdr[0], Body: data[5:]}
		st.describe(&m)
		ch := chunk{data: data}
		if pending == nil {
			if t := c.p.claim(m); t != nil {
				c.mu.Lock()
				c.claimed = append(c.claimed, t)
				c.mu.Unlock()
				if !t.forward || m.Type == 'Q' || m.Type == 'S' {
					ch.cut = t
				} else {
					pending = t
				}
			}
		} else if m.Type == 'S' {
			ch.cut, pending = pending, nil
		}
		if !c.push(ClientToServer, q, ch) || ch.cut != nil {
			return // nothing after a cut is read
		}
	}
}

// startup forwards the startup packet. It answers SSL and GSS encryption
// requests with "N" itself so the stream stays plain, and reports raw for a
// cancel request (which has no message phase).
func (c *conn) startup(r *bufio.Reader, q chan<- chunk) (raw bool, err error) {
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return false, err
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		if n < 8 || n > maxStartup {
			return false, fmt.Errorf("faultproxy: startup packet length %d", n)
		}
		code := binary.BigEndian.Uint32(hdr[4:])
		data := make([]byte, n)
		copy(data, hdr[:])
		if _, err := io.ReadFull(r, data[8:]); err != nil {
			return false, err
		}
		switch code {
		case codeSSL, codeGSSEnc:
			if _, err := c.client.Write([]byte{'N'}); err != nil {
				return false, err
			}
			continue
		}
		if code == codeCancel && len(data) == 16 && c.p.wasCut([8]byte(data[8:16])) {
			// The client lost its connection to this session in a cut: its
			// network is down, and its cancel request is lost with it.
			c.p.droppedCancels.Add(1)
			return false, errCancelDropped
		}
		if !c.push(ClientToServer, q, chunk{data: data, startup: code != codeCancel}) {
			return false, net.ErrClosed
		}
		return code == codeCancel, nil
	}
}

func (c *conn) copyRaw(r io.Reader, q chan<- chunk) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 && !c.push(ClientToServer, q, chunk{data: append([]byte(nil), buf[:n]...)}) {
			return
		}
		if err != nil {
			c.readErr(ClientToServer, q, err)
			return
		}
	}
}

// write forwards the queued chunks of dir to dst when each is due, unless the
// direction is blackholed then, and carries out cuts.
func (c *conn) write(dir Direction, dst net.Conn, q <-chan chunk) {
	for {
		var ch chunk
		select {
		case ch = <-q:
		case <-c.done:
			return
		}
		if wait := time.Until(ch.due); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-c.done:
				timer.Stop()
				return
			}
		}
		if hold := c.p.held(dir); hold != nil {
			select {
			case <-hold:
			case <-c.done:
				return
			}
		}
		_, blackhole := c.p.settings(dir)
		if ch.cut != nil {
			c.cut(ch, blackhole)
			return
		}
		if blackhole {
			continue // swallowed, FIN included
		}
		if ch.eof {
			c.close()
			return
		}
		if dir == ServerToClient && c.dropReplies.Load() {
			continue
		}
		if _, err := dst.Write(ch.data); err != nil {
			c.close()
			return
		}
		if dir == ClientToServer && (ch.startup || endsRequest(ch.data)) {
			c.requests.Add(1)
		}
	}
}

// cut carries out a trigger on the client→server writer.
func (c *conn) cut(ch chunk, blackhole bool) {
	t := ch.cut
	c.p.cuts.Add(1)
	fatal := c.p.poolerFatal() && !blackhole
	if !t.forward || blackhole {
		if fatal {
			c.dropReplies.Store(true)
			_, _ = c.client.Write(poolerFatalMessage)
		}
		c.close()
		t.finish(false)
		return
	}
	// The cut message is a Sync or a Query: the server has processed it, and
	// committed what it ends, when it sends the ReadyForQuery that answers it.
	c.replyReady.Store(c.requests.Add(1))
	c.dropReplies.Store(true)
	if key := c.key.Load(); key != nil {
		c.p.markCut(*key)
	}
	if _, err := c.server.Write(ch.data); err != nil {
		c.close()
		t.finish(false)
		return
	}
	// The client sees its connection break only once the server has
	// finished (or the grace period passed): a reply lost on the way, noticed
	// afterwards. Closing it at once would let the client act on the break
	// (reconnect, stop the backend with pg_terminate_backend) while the server
	// is still running the message, and make the outcome a race.
	timer := time.NewTimer(c.p.cfg.CutGrace)
	defer timer.Stop()
	replied := false
	select {
	case <-c.spoke:
		replied = true
	case <-timer.C:
	case <-c.done:
	}
	if fatal {
		_, _ = c.client.Write(poolerFatalMessage)
	}
	c.close()
	t.finish(replied)
}

// poolerFatalMessage is PgBouncer's answer to a client whose server
// connection broke, sent whether or not the request had reached the server.
var poolerFatalMessage = func() []byte {
	var body []byte
	for _, f := range []struct {
		code byte
		text string
	}{{'S', "FATAL"}, {'V', "FATAL"}, {'C', "08P01"}, {'M', "server conn crashed?"}} {
		body = append(append(append(body, f.code), f.text...), 0)
	}
	body = append(body, 0)
	msg := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(4+len(body)))
	return append(msg, body...)
}()
