package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// How the CLI tells a pooler from a direct connection, and a
// transaction-mode pooler from a session-mode one.
//
// A pooler cannot be seen by watching one client connection alone: an idle
// PgBouncer gives a client back the server connection it just released (it
// reuses the most recent one first), so consecutive statements of one client
// reach one backend until other clients compete for them. Two facts do not
// depend on the load:
//
//   - The cancel key. At startup the server tells a client its backend's pid
//     (BackendKeyData), which a direct connection's pg_backend_pid() repeats.
//     A pooler answers the startup itself with a cancel key of its own
//     (PgBouncer: random), so the two differ.
//   - Sharing. Two client connections of a session-mode pooler, like two
//     direct ones, never reach the same backend, and each keeps its own.
//     With transaction pooling a backend serves whichever client's
//     transaction comes next. The probe takes turns between two client
//     connections (one, one, two, two) on autocommit statements: an idle
//     PgBouncer then hands the backend one client released to the other
//     (most recent first), and a round-robin one moves a client that runs
//     twice in a row to another backend (oldest first). Either is proof; so
//     is any switch other clients' load causes.
//
// PgBouncer answers SHOW commands itself only on its admin console (the
// database named pgbouncer, for admin_users or stats_users), which an
// application's URL does not reach, so the probe does not rely on it.

// poolerRounds bounds the probe: each round is four statements.
const poolerRounds = 8

// poolerProbeTimeout bounds the doctor's probe: a session-mode pooler whose
// pool is full makes the second client connection wait for a backend.
const poolerProbeTimeout = 10 * time.Second

// sqlBackend names the backend that runs a statement, and the port it
// listens on (NULL over a Unix socket).
const sqlBackend = `SELECT pg_catalog.pg_backend_pid(), pg_catalog.inet_server_port()`

// poolerProbe is what the probe saw.
type poolerProbe struct {
	// cancelKeyDiffers: a client connection's cancel key is not its
	// backend's pid: something answered the startup in the server's place.
	cancelKeyDiffers bool
	// shared: one backend served both client connections, or one client
	// connection reached several backends: transaction (or statement)
	// pooling.
	shared bool
	// backends is the number of distinct backends seen.
	backends int
	// rounds the probe ran before it could tell.
	rounds int
	// clientPort is the port the client connected to; serverPort the one
	// the backend listens on (0 over a Unix socket).
	clientPort, serverPort int
}

// pooled reports whether a pooler answered the startup: the CLI then needs
// a pooler-safe exec mode, whatever the pool mode.
func (p poolerProbe) pooled() bool { return p.cancelKeyDiffers || p.shared }

// probePooler runs the probe on two connections of pool. Its statements use
// the simple protocol, which works through every pooler whatever the pool's
// exec mode.
func probePooler(ctx context.Context, pool *pgxpool.Pool) (poolerProbe, error) {
	var p poolerProbe
	var conns [2]*pgxpool.Conn
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return p, err
		}
		defer c.Release()
		conns[i] = c
	}
	p.clientPort = int(conns[0].Conn().Config().Port)
	// clients[pid] holds the client connections (1, 2) a backend served.
	clients := map[int32]int{}
	seen := [2]map[int32]bool{{}, {}}
	backend := func(i int) error {
		var pid int32
		var port *int32
		if err := conns[i].QueryRow(ctx, sqlBackend, pgx.QueryExecModeSimpleProtocol).Scan(&pid, &port); err != nil {
			return err
		}
		if port != nil {
			p.serverPort = int(*port)
		}
		if uint32(pid) != conns[i].Conn().PgConn().PID() {
			p.cancelKeyDiffers = true
		}
		clients[pid] |= 1 << i
		seen[i][pid] = true
		if clients[pid] == 3 || len(seen[i]) > 1 {
			p.shared = true
		}
		return nil
	}
	for p.rounds < poolerRounds && !p.shared {
		p.rounds++
		for _, i := range []int{0, 0, 1, 1} {
			if err := backend(i); err != nil {
				return p, err
			}
		}
		if !p.cancelKeyDiffers {
			// The startup came from the server itself: no pooler, and the
			// backends stay put (shared would be set by now otherwise).
			break
		}
	}
	p.backends = len(clients)
	return p, nil
}

// poolerCheck turns the probe into the doctor's finding.
func poolerCheck(ctx context.Context, pool *pgxpool.Pool) check {
	const name = "pooler"
	p, err := probePooler(ctx, pool)
	if err != nil {
		return check{Name: name, Status: statusFail, Detail: fmt.Sprintf("cannot probe for a pooler: %v", err)}
	}
	ports := ""
	if p.serverPort != 0 && p.serverPort != p.clientPort {
		ports = fmt.Sprintf("; this connection reached port %d, the server listens on %s", p.clientPort, strconv.Itoa(p.serverPort))
	}
	switch {
	case p.shared:
		return check{Name: name, Status: statusWarn, Detail: fmt.Sprintf(
			"transaction-mode pooler: two client connections shared %d server backend(s) between their transactions%s. "+
				"Leases, fenced writes and idempotency keys work through it; connect with default_query_exec_mode=exec "+
				"(this CLI does so by itself) or PgBouncer >= 1.21 with max_prepared_statements; LISTEN wake-ups need a direct "+
				"connection (or leave them off: the bounded poll stays)", p.backends, ports)}
	case p.cancelKeyDiffers:
		return check{Name: name, Status: statusOK, Detail: fmt.Sprintf(
			"session-mode pooler: the cancel key is not the backend's pid, and each of two client connections kept its own backend over %d rounds%s; "+
				"everything works as on a direct connection", p.rounds, ports)}
	}
	return check{Name: name, Status: statusOK, Detail: "direct connection: the cancel key is the backend's pid and each connection keeps its backend (no transaction-mode pooler detected)"}
}
