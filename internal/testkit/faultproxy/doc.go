// Package faultproxy is a TCP proxy that sits between PostgreSQL clients and a
// server and breaks the network on command, for fault tests.
//
// A [Proxy] listens on 127.0.0.1 on a free port and forwards every connection
// to one target address (a test cluster's Addr). Tests point their clients at
// [Proxy.Addr] (or rewrite a URL with [Proxy.ConnString]) and then, at any
// moment:
//
//   - [Proxy.SetDelay]: delay every byte in one direction by a fixed latency
//     (throughput is not throttled; ordering is kept);
//   - [Proxy.SetBlackhole]: accept bytes in one direction but forward none, as
//     a network partition the peers do not notice (the server keeps the
//     session, its transaction and its row locks);
//   - [Proxy.SetRefuse]: reset new connections as soon as they arrive;
//   - [Proxy.CutAll]: close every open connection now;
//   - [Proxy.CutBefore]: close a connection when a client→server message
//     matches a predicate, before the message reaches the server (a lost
//     request);
//   - [Proxy.CutAfter]: forward a matching message, drop the server's reply and
//     close the connection once the server has finished (a lost reply: the
//     server commits, the client sees a broken connection);
//   - [Proxy.SetPoolerFatal]: make the cuts answer as PgBouncer does when
//     its server connection breaks (FATAL, SQLSTATE 08P01), whether or not
//     the request reached the server.
//
// The client→server stream is parsed as the PostgreSQL frontend protocol
// (startup packet, then 1-byte type + int32 length messages), so predicates see
// whole messages and the SQL they run: the text of a simple Query, or for the
// extended protocol the statement of the portal an Execute runs (the proxy
// follows Parse and Bind). SSL and GSS encryption requests are answered "no" by
// the proxy itself, so the stream stays readable; the server→client stream is
// copied as bytes.
//
// # Guarantees
//
//   - A message cut before forwarding never reaches the server: the server sees
//     the connection close without it.
//   - A message cut after forwarding reaches the server in full (for the
//     extended protocol: up to and including the next Sync), and no byte the
//     server sends after it reaches the client. The proxy keeps the server side
//     and the client side open until the server has finished the message,
//     that is until the ReadyForQuery that answers it (or [Config.CutGrace]
//     passes): a reply to an earlier message of the same pipeline does not
//     count. So the server has processed the message before the client sees
//     the connection break and when [Trigger.Done] is closed, and
//     [Trigger.Replied] says whether it finished in time.
//   - The client's network to a session cut after forwarding stays down: a
//     cancel request for that session (pgx sends one when a connection breaks
//     mid-query) is dropped, so it cannot abort what the server received
//     ([Stats.DroppedCancels] counts them).
//   - [Proxy.Close] closes the listener and every connection and returns after
//     every goroutine the proxy started has exited.
//
// # Failure handling
//
// Errors on one connection close that connection (both sides) and nothing
// else. A connection whose target cannot be dialed is closed at once, so the
// client sees the same broken connection as with a server that is down. After a
// blackhole is lifted the bytes it swallowed stay lost, so the protocol stream
// of a connection that lived through it is usually unusable: cut it.
package faultproxy
