package bench

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"time"

	"github.com/lib/pq"
)

// pqCounter is a lib/pq dialer that counts the statements its connections
// send into a statementCounter, as the pgx tracer counts pgx's: an Execute
// is one statement; a simple query as many as it holds (the bench's
// statements hold no semicolons of their own).
type pqCounter struct {
	n *statementCounter
	d net.Dialer
}

var (
	_ pq.Dialer        = pqCounter{}
	_ pq.DialerContext = pqCounter{}
)

func (c pqCounter) Dial(network, address string) (net.Conn, error) {
	return c.DialContext(context.Background(), network, address)
}

func (c pqCounter) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.DialContext(ctx, network, address)
}

func (c pqCounter) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	conn, err := c.d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, n: c.n, untyped: true}, nil
}

// countingConn follows the client's messages through Write. The first
// message (the startup message, or an SSL request followed by it) has no
// type byte.
type countingConn struct {
	net.Conn
	n       *statementCounter
	untyped bool   // the next message is a startup message
	pending []byte // the start of a message that Write has not finished
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.pending = append(c.pending, b...)
	for {
		head := 5
		if c.untyped {
			head = 4
		}
		if len(c.pending) < head {
			break
		}
		size := int(binary.BigEndian.Uint32(c.pending[head-4 : head])) // includes itself
		end := head - 4 + size
		if len(c.pending) < end {
			break
		}
		if c.untyped {
			// An SSL or GSS request (8 bytes, code 8087...) is followed
			// by the startup message, itself untyped.
			c.untyped = size == 8 && binary.BigEndian.Uint32(c.pending[4:8])>>16 == 1234
		} else {
			switch c.pending[0] {
			case 'E':
				c.n.n.Add(1)
			case 'Q':
				q := strings.TrimRight(string(c.pending[5:end]), "\x00; \n")
				c.n.n.Add(int64(strings.Count(q, ";") + 1))
			}
		}
		c.pending = c.pending[end:]
	}
	if len(c.pending) == 0 {
		c.pending = nil
	}
	return c.Conn.Write(b)
}
