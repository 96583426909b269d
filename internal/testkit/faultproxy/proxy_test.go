package faultproxy_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

// env is one test's database, a proxy in front of it and a direct connection
// that sees the truth.
type env struct {
	proxy  *faultproxy.Proxy
	direct *pgx.Conn
	via    *pgx.ConnConfig // connects through the proxy
}

func setup(t *testing.T) *env {
	t.Helper()
	db := pgfencetest.NewDatabase(t) // may start the shared server: its goroutines are not ours
	// Registered before the proxy and the connections, so it runs after they
	// are closed.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(cfg.Host, "/") {
		if os.Getenv("CI") == "true" {
			t.Fatal("the test server is on a Unix socket; the proxy needs TCP (under CI=true this fails: the fault tests must run)")
		}
		t.Skip("the test server is on a Unix socket; the proxy needs TCP")
	}
	p, err := faultproxy.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("proxy close: %v", err)
		}
	})
	ctx := context.Background()
	direct, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close(context.Background()) })
	if _, err := direct.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY, note text)`); err != nil {
		t.Fatal(err)
	}
	via := cfg.Copy()
	host, port, _ := net.SplitHostPort(p.Addr())
	via.Host = host
	p16, _ := strconv.Atoi(port)
	via.Port = uint16(p16)
	via.ConnectTimeout = 5 * time.Second
	via.RuntimeParams["application_name"] = "via-proxy"
	return &env{proxy: p, direct: direct, via: via}
}

// connect opens a connection through the proxy, closed at cleanup.
func (e *env) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, e.via)
	if err != nil {
		t.Fatalf("connect through proxy: %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// rowExists reads the truth on the direct connection.
func (e *env) rowExists(t *testing.T, id int) bool {
	t.Helper()
	var ok bool
	if err := e.direct.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM t WHERE id = $1)`, id).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestForwardsBothProtocols(t *testing.T) {
	e := setup(t)
	c := e.connect(t)
	ctx := context.Background()
	if _, err := c.Exec(ctx, `INSERT INTO t VALUES (1, 'simple')`); err != nil { // simple protocol
		t.Fatal(err)
	}
	for i := 2; i < 5; i++ { // extended protocol, cached prepared statement
		if _, err := c.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, i, "extended"); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("count through proxy = %d, %v; want 4", n, err)
	}
	if s := e.proxy.Stats(); s.Accepted != 1 || s.Open != 1 {
		t.Fatalf("stats = %+v, want 1 accepted and open", s)
	}
}

func TestConnString(t *testing.T) {
	e := setup(t)
	u, err := e.proxy.ConnString("postgres://postgres@127.0.0.1:1/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	if want := "postgres://postgres@" + e.proxy.Addr() + "/db?sslmode=disable"; u != want {
		t.Fatalf("ConnString = %q, want %q", u, want)
	}
	if _, err := e.proxy.ConnString("host=x port=1"); err == nil {
		t.Fatal("ConnString accepted a keyword/value string")
	}
}

func TestSSLRequestIsDeclinedByTheProxy(t *testing.T) {
	e := setup(t)
	cfg := e.via.Copy()
	cfg.TLSConfig = nil
	connString, _ := e.proxy.ConnString("postgres://" + cfg.User + "@x/" + cfg.Database + "?sslmode=prefer")
	c, err := pgx.Connect(context.Background(), connString)
	if err != nil {
		t.Fatalf("sslmode=prefer through the proxy: %v", err)
	}
	defer c.Close(context.Background())
	if err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestDelay(t *testing.T) {
	e := setup(t)
	c := e.connect(t)
	ctx := context.Background()
	const delay = 150 * time.Millisecond
	for _, dir := range []faultproxy.Direction{faultproxy.ClientToServer, faultproxy.ServerToClient} {
		e.proxy.SetDelay(dir, delay)
		start := time.Now()
		if err := c.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		// A lower bound only: the round trip cannot beat the injected latency.
		if took := time.Since(start); took < delay {
			t.Fatalf("%v: round trip took %v with a %v delay", dir, took, delay)
		}
		e.proxy.SetDelay(dir, 0)
	}
}

// A held request reaches the server only when the hold is released, however
// long that takes, and then it is carried out.
func TestHoldRequest(t *testing.T) {
	e := setup(t)
	c := e.connect(t)
	e.proxy.SetHold(faultproxy.ClientToServer, true)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := c.Exec(ctx, `INSERT INTO t VALUES (1, 'held')`)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // time for the request to reach the proxy
	select {
	case err := <-done:
		t.Fatalf("the insert returned while its request was held: %v", err)
	default:
	}
	if e.rowExists(t, 1) {
		t.Fatal("a held request reached the server")
	}
	e.proxy.SetHold(faultproxy.ClientToServer, false)
	if err := <-done; err != nil {
		t.Fatalf("the released insert: %v", err)
	}
	if !e.rowExists(t, 1) {
		t.Fatal("the released request was not carried out")
	}
	// Heal releases a hold too.
	e.proxy.SetHold(faultproxy.ClientToServer, true)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := c.Exec(ctx, `INSERT INTO t VALUES (2, 'healed')`)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	e.proxy.Heal()
	if err := <-done; err != nil || !e.rowExists(t, 2) {
		t.Fatalf("the request held until Heal: %v", err)
	}
}

func TestBlackholeRequest(t *testing.T) {
	e := setup(t)
	c := e.connect(t)
	var pid uint32 = c.PgConn().PID()
	e.proxy.SetBlackhole(faultproxy.ClientToServer, true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, `INSERT INTO t VALUES (1, 'lost')`)
	if err == nil {
		t.Fatal("insert through a blackholed request path succeeded")
	}
	if e.rowExists(t, 1) {
		t.Fatal("a blackholed request reached the server")
	}
	// The server never noticed: the session is still there, idle.
	var state string
	if err := e.direct.QueryRow(context.Background(), `SELECT state FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state); err != nil {
		t.Fatalf("the server lost the session: %v", err)
	}
	if state != "idle" {
		t.Fatalf("session state = %q, want idle", state)
	}
}

func TestBlackholeReply(t *testing.T) {
	e := setup(t)
	c := e.connect(t)
	e.proxy.SetBlackhole(faultproxy.ServerToClient, true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := c.Exec(ctx, `INSERT INTO t VALUES (1, 'applied')`); err == nil {
		t.Fatal("the client got an answer through a blackholed reply path")
	}
	if !e.rowExists(t, 1) {
		t.Fatal("the request did not reach the server")
	}
}

func TestRefuse(t *testing.T) {
	e := setup(t)
	open := e.connect(t)
	e.proxy.SetRefuse(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := pgx.ConnectConfig(ctx, e.via); err == nil {
		c.Close(ctx)
		t.Fatal("connected through a refusing proxy")
	}
	if err := open.Ping(ctx); err != nil {
		t.Fatalf("refusing new connections broke an open one: %v", err)
	}
	e.proxy.SetRefuse(false)
	e.connect(t)
	if s := e.proxy.Stats(); s.Refused != 1 || s.Accepted != 2 {
		t.Fatalf("stats = %+v, want 1 refused, 2 accepted", s)
	}
}

func TestCutAll(t *testing.T) {
	e := setup(t)
	a, b := e.connect(t), e.connect(t)
	if n := e.proxy.CutAll(); n != 2 {
		t.Fatalf("CutAll closed %d connections, want 2", n)
	}
	ctx := context.Background()
	for _, c := range []*pgx.Conn{a, b} {
		if err := c.Ping(ctx); err == nil {
			t.Fatal("a cut connection still answers")
		}
	}
	waitOpen(t, e.proxy, 0)
	if err := e.connect(t).Ping(ctx); err != nil {
		t.Fatalf("new connection after CutAll: %v", err)
	}
}

func waitOpen(t *testing.T, p *faultproxy.Proxy, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().Open != want {
		if time.Now().After(deadline) {
			t.Fatalf("open connections = %d, want %d", p.Stats().Open, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// commitThroughProxy inserts row id in a transaction through the proxy and
// returns COMMIT's error.
func commitThroughProxy(t *testing.T, e *env, id int) error {
	t.Helper()
	c := e.connect(t)
	ctx := context.Background()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, 'tx')`, id); err != nil {
		t.Fatal(err)
	}
	return tx.Commit(ctx)
}

func TestCutBeforeCommitLosesTheRequest(t *testing.T) {
	e := setup(t)
	trig := e.proxy.CutBefore(faultproxy.IsCommit)
	if err := commitThroughProxy(t, e, 1); err == nil {
		t.Fatal("COMMIT succeeded although it was cut")
	}
	<-trig.Done()
	if !trig.Fired() || trig.Replied() || !faultproxy.IsCommit(trig.Message()) {
		t.Fatalf("trigger fired=%v replied=%v msg=%q", trig.Fired(), trig.Replied(), trig.Message().SQL)
	}
	waitNoBackend(t, e)
	if e.rowExists(t, 1) {
		t.Fatal("the transaction committed although COMMIT never reached the server")
	}
}

func TestCutAfterCommitLosesTheReply(t *testing.T) {
	e := setup(t)
	trig := e.proxy.CutAfter(faultproxy.IsCommit)
	err := commitThroughProxy(t, e, 1)
	if err == nil {
		t.Fatal("the client learned COMMIT's outcome although the reply was cut")
	}
	<-trig.Done()
	if !trig.Fired() || !trig.Replied() {
		t.Fatalf("trigger fired=%v replied=%v", trig.Fired(), trig.Replied())
	}
	if !e.rowExists(t, 1) {
		t.Fatal("COMMIT was forwarded but the row is missing")
	}
	// Only the first COMMIT is cut: the trigger is one-shot.
	if err := commitThroughProxy(t, e, 2); err != nil || !e.rowExists(t, 2) {
		t.Fatalf("second commit: %v", err)
	}
}

// With SetPoolerFatal the client hears what PgBouncer says when its server
// connection breaks, a FATAL 08P01, both for a COMMIT the server ran and for
// one it never received.
func TestPoolerFatal(t *testing.T) {
	e := setup(t)
	e.proxy.SetPoolerFatal(true)
	for _, c := range []struct {
		cut       func(func(faultproxy.Message) bool) *faultproxy.Trigger
		id        int
		committed bool
	}{{e.proxy.CutAfter, 1, true}, {e.proxy.CutBefore, 2, false}} {
		trig := c.cut(faultproxy.IsCommit)
		err := commitThroughProxy(t, e, c.id)
		<-trig.Done()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "08P01" || pgErr.Severity != "FATAL" {
			t.Fatalf("COMMIT of row %d: %v, want the pooler's FATAL 08P01", c.id, err)
		}
		waitNoBackend(t, e)
		if got := e.rowExists(t, c.id); got != c.committed {
			t.Fatalf("row %d exists = %v, want %v", c.id, got, c.committed)
		}
	}
}

func TestCutExtendedProtocolExecute(t *testing.T) {
	e := setup(t)
	c := e.connect(t)
	ctx := context.Background()
	const insert = `INSERT INTO t VALUES ($1, 'ext')`
	// Prepare and cache the statement, so the cut sees only Bind/Execute/Sync
	// for a named statement parsed earlier.
	if _, err := c.Exec(ctx, insert, 1); err != nil {
		t.Fatal(err)
	}
	before := e.proxy.CutBefore(faultproxy.SQLContains("insert into t"))
	if _, err := c.Exec(ctx, insert, 2); err == nil {
		t.Fatal("a cut-before Execute succeeded")
	}
	<-before.Done()
	if before.Message().Type != 'E' {
		t.Fatalf("fired on %q, want the Execute", before.Message().Type)
	}

	c2 := e.connect(t)
	if _, err := c2.Exec(ctx, insert, 3); err != nil {
		t.Fatal(err)
	}
	after := e.proxy.CutAfter(faultproxy.SQLContains("insert into t"))
	if _, err := c2.Exec(ctx, insert, 4); err == nil {
		t.Fatal("the client got the reply of a cut-after Execute")
	}
	<-after.Done()
	if !after.Replied() {
		t.Fatal("the server did not answer the forwarded Execute")
	}
	waitNoBackend(t, e)
	for id, want := range map[int]bool{1: true, 2: false, 3: true, 4: true} {
		if got := e.rowExists(t, id); got != want {
			t.Errorf("row %d exists = %v, want %v", id, got, want)
		}
	}
}

// A cut after a pipeline's Sync waits for the server to finish the whole
// pipeline (its ReadyForQuery), not just for the first reply: the rows of the
// first statement (too many to buffer) come back at once, long before the
// slow second statement commits; the client sees its connection break only
// after that. The client's cancel request (pgx sends one when the connection
// breaks mid-query) is dropped, or it would abort the statement.
func TestCutAfterPipelineWaitsForReadyForQuery(t *testing.T) {
	e := setup(t)
	c := e.connect(t)
	ctx := context.Background()
	trig := e.proxy.CutAfter(faultproxy.SQLContains("'slow'"))
	b := &pgx.Batch{}
	b.Queue(`SELECT repeat('x', 100000)`) // more than the server buffers: sent at once
	b.Queue(`INSERT INTO t SELECT 7, 'slow' FROM pg_sleep(0.3)`)
	if err := c.SendBatch(ctx, b).Close(); err == nil {
		t.Fatal("the client got the reply of a cut pipeline")
	}
	// The client sees the break only once the server has finished.
	if !e.rowExists(t, 7) {
		t.Fatal("the client saw the connection break before the server committed the pipeline")
	}
	<-trig.Done()
	if !trig.Replied() {
		t.Fatal("the server did not finish the forwarded pipeline within the grace period")
	}
	if !e.rowExists(t, 7) {
		t.Fatal("the trigger was done before the server committed the pipeline")
	}
}

func TestTriggerCancel(t *testing.T) {
	e := setup(t)
	trig := e.proxy.CutBefore(faultproxy.IsCommit)
	trig.Cancel()
	<-trig.Done()
	if err := commitThroughProxy(t, e, 1); err != nil {
		t.Fatalf("a cancelled trigger cut a COMMIT: %v", err)
	}
	if trig.Fired() {
		t.Fatal("cancelled trigger reports fired")
	}
}

func TestCloseReleasesEverything(t *testing.T) {
	e := setup(t)
	c := e.connect(t)
	e.proxy.SetDelay(faultproxy.ServerToClient, time.Hour) // a reply stuck in the queue
	trig := e.proxy.CutAfter(faultproxy.SQLContains("never sent"))
	errc := make(chan error, 1)
	go func() { errc <- c.Ping(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	if err := e.proxy.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err == nil {
		t.Fatal("ping through a closed proxy succeeded")
	}
	<-trig.Done() // an armed trigger is released by Close
	if _, err := net.DialTimeout("tcp", e.proxy.Addr(), time.Second); err == nil {
		t.Fatal("closed proxy still accepts")
	}
	// goleak (registered in setup) checks that no goroutine is left.
}

func TestConfigValidation(t *testing.T) {
	_, err := faultproxy.Start("127.0.0.1:1", &faultproxy.Config{CutGrace: -1})
	if err == nil || !strings.Contains(err.Error(), "CutGrace") {
		t.Fatalf("negative CutGrace: %v", err)
	}
	if _, err := faultproxy.Start("no-port", nil); err == nil {
		t.Fatal("a target without a port was accepted")
	}
}

func TestDialFailureLooksLikeADownServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	p, err := faultproxy.Start(dead, &faultproxy.Config{DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	connString, _ := p.ConnString("postgres://postgres@x/postgres?sslmode=disable")
	_, err = pgx.Connect(ctx, connString)
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("connect to a down server through the proxy: %v (want a prompt failure)", err)
	}
}

// waitNoBackend waits until the server has no backend left from the proxy's
// cut connections, so the outcome of their transactions is final.
func waitNoBackend(t *testing.T, e *env) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := e.direct.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'via-proxy'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		live := e.proxy.Stats().Open
		if n <= live {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends still running, %d proxied connections open", n, live)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
