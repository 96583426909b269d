package robustness

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// A stale write through an unchecked path: the protected table refuses every
// write that did not present a current token in its own transaction, whether
// it comes from psql, an old binary with no pgfence at all, or an old binary
// that presents its stale token or another resource's token.
func TestScenarioStaleWriteThroughUncheckedPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{resources: []string{sku, "sku-2"}})
	ctx := bounded(t, time.Minute)
	a, b := e.local(0, nil), e.local(1, nil)
	acq := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)
	want(t, e.recorded(0, func() Op { return a.write(ctx, sku, acq.Token, "a1") }), OK)
	e.backdate(sku)
	bAcq := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)
	want(t, e.recorded(1, func() Op { return b.write(ctx, sku, bAcq.Token, "b1") }), OK)
	other := want(t, e.recorded(0, func() Op { return a.acquire(ctx, "sku-2", time.Minute, 0) }), OK)

	raw, err := pgx.Connect(ctx, e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(context.Background())
	attempts := []struct {
		name, code string
		token      int64
		run        func(tx pgx.Tx, value string) error
	}{
		{"no token (psql, an old binary)", pgerr.CodeUnfencedWrite, 0, func(tx pgx.Tx, v string) error {
			_, err := tx.Exec(ctx, writeSQL, sku, v, bAcq.Token+1) // even claiming a higher token in the row
			return err
		}},
		{"stale token presented", pgerr.CodeStaleToken, acq.Token, func(tx pgx.Tx, v string) error {
			if _, err := tx.Exec(ctx, `SELECT pgfence.fence($1, $2)`, sku, acq.Token); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, writeSQL, sku, v, acq.Token)
			return err
		}},
		{"another resource's token", pgerr.CodeUnfencedWrite, other.Token, func(tx pgx.Tx, v string) error {
			if _, err := tx.Exec(ctx, `SELECT pgfence.fence($1, $2)`, "sku-2", other.Token); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, writeSQL, sku, v, other.Token)
			return err
		}},
		{"delete", pgerr.CodeUnfencedWrite, 0, func(tx pgx.Tx, _ string) error {
			_, err := tx.Exec(ctx, `DELETE FROM stock WHERE resource = $1`, sku)
			return err
		}},
	}
	for i, at := range attempts {
		value := fmt.Sprint("rogue-", i)
		call := e.rec.Now()
		err := pgx.BeginFunc(ctx, raw, func(tx pgx.Tx) error { return at.run(tx, value) })
		e.rec.Add(Op{Client: 9, Kind: Write, Key: sku, Token: at.token, Value: value, Outcome: classify(err), Call: call, Return: e.rec.Now()})
		if got := pgerr.Code(err); got != at.code {
			t.Errorf("%s: SQLSTATE %q (%v), want %s", at.name, got, err, at.code)
		}
	}
	tr, _ := e.reconcile(ctx)
	if f := tr.Final[sku]; f.Value != "b1" || f.Token != bAcq.Token {
		t.Fatalf("final %+v, want B's write", f)
	}
}

// Database restart, fast and after a crash, on a server whose default is
// synchronous_commit = off: every grant, fenced write and effect acknowledged
// before the restart survives it (pgfence forces durable commits where it
// matters), the holder keeps its lease through the restart, tokens are not
// reissued, and the old token is rejected once a new holder took over.
func TestScenarioDatabaseRestart(t *testing.T) {
	for _, mode := range []string{"fast", "crash"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, envOptions{dedicated: true, resources: []string{sku},
				settings: map[string]string{"synchronous_commit": "off", "wal_writer_delay": "10s"}})
			ctx := bounded(t, 2*time.Minute)
			a := e.local(0, nil)
			acq := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)
			want(t, e.recorded(0, func() Op { return a.write(ctx, sku, acq.Token, "a1") }), OK)
			want(t, e.recorded(0, func() Op { return a.effect(ctx, "order-1", "a") }), OK)
			granted := map[string]int64{}
			for i := range 20 {
				key := fmt.Sprint("burst-", i)
				granted[key] = want(t, e.recorded(0, func() Op { return a.acquire(ctx, key, time.Minute, 0) }), OK).Token
			}

			// Acknowledged idempotent results with nothing durable after them,
			// in a scope of their own (see the end of the test).
			const lateIntents = 10
			for i := range lateIntents {
				_, err := a.store.Do(ctx, a.pool, idempotency.Request{Scope: "late", Key: fmt.Sprint("late-order-", i)},
					func(context.Context, pgx.Tx) ([]byte, error) { return []byte("a"), nil })
				if err != nil {
					t.Fatalf("late intent %d: %v", i, err)
				}
			}

			if err := restart(ctx, e.cluster, mode == "crash"); err != nil {
				t.Fatalf("restart: %v", err)
			}
			e.admin().Reset()
			for key, tok := range granted {
				if row := e.leaseRow(key); row.Token != tok || !row.Live {
					t.Errorf("after a %s restart lease %s is %+v, want token %d live", mode, key, row, tok)
				}
			}

			// The holder's next write goes through once its pool has reconnected.
			b := e.local(1, nil)
			want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), Rejected)
			var w Op
			for i := 0; i < 5; i++ {
				w = e.recorded(0, func() Op { return a.write(ctx, sku, acq.Token, fmt.Sprint("a2-", i)) })
				if w.Outcome == OK {
					break
				}
			}
			want(t, w, OK)
			e.backdate(sku)
			bAcq := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)
			if bAcq.Token <= acq.Token {
				t.Fatalf("token after restart %d is not above %d", bAcq.Token, acq.Token)
			}
			want(t, e.recorded(1, func() Op { return b.write(ctx, sku, bAcq.Token, "b1") }), OK)
			want(t, e.recorded(0, func() Op { return a.write(ctx, sku, acq.Token, "a3") }), Stale)
			want(t, e.recorded(1, func() Op { return b.effect(ctx, "order-1", "b") }), OK)
			tr, _ := e.reconcile(ctx)
			if tr.Stored["order-1"] != "a" {
				t.Fatalf("stored result of order-1 = %q after restart, want a", tr.Stored["order-1"])
			}
			if lost := lateIntents - e.count(`SELECT count(*) FROM pgfence.idempotency_keys WHERE scope = 'late'`); lost > 0 {
				t.Fatalf("%d of %d acknowledged atomic intents were forgotten by a %s restart of a server "+
					"with synchronous_commit=off: idempotency claims must force synchronous_commit=on, as leases and fences do",
					lost, lateIntents, mode)
			}
		})
	}
}

// Database unreachable: connections refused, a network partition (every byte
// blackholed, no error ever comes back), and the server stopped. Every call
// returns by its deadline with an error the caller can act on; a holder's
// lease context ends by its trust window when it cannot renew; after the
// fault heals, the same clients work again.
func TestScenarioDatabaseUnreachable(t *testing.T) {
	e := newEnv(t, envOptions{dedicated: true, resources: []string{sku}})
	noLeakedGoroutines(t)
	ctx := bounded(t, 3*time.Minute)
	p := e.proxy()
	a := e.local(0, p)
	acq := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)

	const deadline = 1500 * time.Millisecond
	const slack = time.Second // scheduling on a loaded 2-core machine, -race
	// A grant attempt whose reply is lost is read back in the background; the
	// caller still gets its answer by its deadline.
	calls := []struct {
		name    string
		overrun time.Duration
		run     func(ctx context.Context) Op
	}{
		{"TryAcquire", 0, func(ctx context.Context) Op { return a.acquire(ctx, "other", time.Minute, 0) }},
		{"Acquire(MaxWait 10s)", 0, func(ctx context.Context) Op { return a.acquire(ctx, "other", time.Minute, 10*time.Second) }},
		{"Renew", 0, func(ctx context.Context) Op { return a.renewOp(ctx, sku) }},
		{"fenced Write", 0, func(ctx context.Context) Op { return a.write(ctx, sku, acq.Token, "during-outage") }},
		{"idempotent Do", 0, func(ctx context.Context) Op { return a.effect(ctx, "order-1", "during-outage") }},
	}
	conditions := []struct {
		name         string
		inject, heal func()
	}{
		{"connections refused",
			func() { p.SetRefuse(true); p.CutAll() },
			func() { p.SetRefuse(false) }},
		{"network partition",
			func() {
				p.SetBlackhole(faultproxy.ClientToServer, true)
				p.SetBlackhole(faultproxy.ServerToClient, true)
			},
			func() { p.Heal(); p.CutAll() }},
		{"server stopped",
			func() {
				if err := e.cluster.Stop(); err != nil {
					t.Fatal(err)
				}
			},
			func() {
				if err := e.cluster.Start(ctx); err != nil {
					t.Fatal(err)
				}
				e.admin().Reset()
			}},
	}
	n := 0
	for _, cond := range conditions {
		cond.inject()
		for _, c := range calls {
			n++
			cctx, cancel := context.WithTimeout(ctx, deadline)
			start := time.Now()
			op := e.recorded(0, func() Op { return c.run(cctx) })
			took := time.Since(start)
			cancel()
			t.Logf("%-20s %-22s returned after %5v: %-8s %s", cond.name, c.name, took.Round(time.Millisecond), op.Outcome, op.Err)
			if op.Outcome == OK {
				t.Errorf("%s: %s succeeded while the database was unreachable", cond.name, c.name)
			}
			if took > deadline+c.overrun+slack {
				t.Errorf("%s: %s returned after %v, past its %v deadline (+%v)", cond.name, c.name, took, deadline, c.overrun)
			}
		}
		cond.heal()
		// Recovery: the same client works again, within a bounded number of tries.
		var op Op
		for i := 0; i < 10 && op.Outcome != OK; i++ {
			op = e.recorded(0, func() Op { return a.write(ctx, sku, acq.Token, fmt.Sprint("after-", n, "-", i)) })
		}
		if op.Outcome != OK {
			t.Fatalf("after %s healed, writes still fail: %s", cond.name, op.Err)
		}
	}

	// A holder that cannot reach the database stops trusting its lease by
	// its local trust window, before the database would let anyone else in.
	l := want(t, e.recorded(0, func() Op { return a.acquireKept(ctx, "kept", 1500*time.Millisecond) }), OK)
	lease := a.lease("kept")
	p.SetBlackhole(faultproxy.ClientToServer, true)
	p.SetBlackhole(faultproxy.ServerToClient, true)
	select {
	case <-lease.Context().Done():
		if !errors.Is(lease.Err(), pgfence.ErrLeaseLost) {
			t.Fatalf("lease ended with %v, want ErrLeaseLost", lease.Err())
		}
		t.Logf("partitioned holder of token %d stopped trusting its lease: %v", l.Token, lease.Err())
	case <-time.After(1500*time.Millisecond + slack):
		t.Fatal("a partitioned holder still trusts its lease after its TTL")
	}
	p.Heal()
	p.CutAll()
	e.reconcile(ctx)
}

// Hot-key contention: 500 goroutines in 5 processes' worth of clients (pools
// of 4 connections each) fight for one key, each doing acquire → fenced write
// → release. Everyone gets the lease (nobody starves past MaxWait), the number
// of server connections stays at the pools' size, and the number of
// transactions the database runs per granted lease stays bounded (no
// thundering herd).
func TestScenarioHotKeyContention(t *testing.T) {
	if testing.Short() {
		t.Skip("500 contenders; skipped with -short")
	}
	e := newEnv(t, envOptions{resources: []string{sku}})
	noLeakedGoroutines(t)
	ctx := bounded(t, 5*time.Minute)
	const clients, perClient, poolSize = 5, 100, 4
	const maxWait = 3 * time.Minute
	actors := make([]*actor, clients)
	for i := range actors {
		a, err := newActor(ctx, actorConfig{URL: e.url(nil), App: fmt.Sprint("pf-hot-", i), MaxConns: poolSize, Wakeups: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.close)
		actors[i] = a
	}
	xacts := func() int64 {
		var n int64
		if err := e.admin().QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// pg_stat_database is updated when backends report; force ours out.
	flush := func() { _, _ = e.admin().Exec(ctx, `SELECT pg_stat_force_next_flush()`) }

	var maxBackends atomic.Int64
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampling.Err() == nil {
			var n int64
			if e.admin().QueryRow(sampling, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pf-hot-%'`).Scan(&n) == nil && n > maxBackends.Load() {
				maxBackends.Store(n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	flush()
	before := xacts()
	waits := make([]time.Duration, 0, clients*perClient)
	tokens := map[int64]string{} // lease_events is pruned; check every grant here
	var mu sync.Mutex
	var failures atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i, a := range actors {
		for j := range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Each goroutine is its own holder; a lease per goroutine.
				t0 := time.Now()
				// Not kept alive: the transactions counted are the grant's, the
				// write's and the release's.
				l, err := a.leases.Acquire(ctx, sku, 10*time.Second, &leases.AcquireOptions{MaxWait: maxWait, NoKeepAlive: true})
				waited := time.Since(t0)
				if err != nil {
					failures.Add(1)
					t.Errorf("contender %d/%d: %v after %v", i, j, err, waited)
					return
				}
				mu.Lock()
				waits = append(waits, waited)
				if prev, dup := tokens[l.Token()]; dup {
					t.Errorf("token %d granted to %s and to contender %d/%d", l.Token(), prev, i, j)
				}
				tokens[l.Token()] = fmt.Sprintf("contender %d/%d", i, j)
				mu.Unlock()
				value := fmt.Sprintf("c%d-%d", i, j)
				// The grants are checked from pgfence.lease_events (strictly
				// increasing, never repeated); recording 500 acquires that
				// all overlap would only make porcupine search.
				op := e.recorded(i*perClient+j, func() Op { return a.write(ctx, sku, l.Token(), value) })
				if op.Outcome != OK {
					t.Errorf("holder %s: write %s (%s)", value, op.Outcome, op.Err)
				}
				if err := l.Release(ctx); err != nil {
					t.Errorf("holder %s: release: %v", value, err)
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopSampling()
	<-sampled
	flush()
	time.Sleep(50 * time.Millisecond) // let the backends' own stats reach pg_stat_database
	flush()
	total := xacts() - before
	granted := int64(len(waits))
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	if granted == 0 {
		t.Fatal("no contender got the lease")
	}
	p99 := waits[len(waits)*99/100]
	perGrant := float64(total) / float64(granted)
	t.Logf("%d contenders, %d granted in %v: wait p50 %v p99 %v max %v; %d transactions (%.1f per grant); max %d backends",
		clients*perClient, granted, elapsed.Round(time.Millisecond), waits[len(waits)/2].Round(time.Millisecond),
		p99.Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond), total, perGrant, maxBackends.Load())
	if failures.Load() > 0 {
		t.Fatalf("%d contenders starved past MaxWait %v", failures.Load(), maxWait)
	}
	// Acquire + write + release is 3 transactions; every failed attempt is a
	// cheap read. A thundering herd would cost hundreds per grant.
	const maxPerGrant = 40
	if perGrant > maxPerGrant {
		t.Errorf("%.1f transactions per granted lease, want at most %d: contention is not bounded", perGrant, maxPerGrant)
	}
	// The pools' connections plus each client's LISTEN connection.
	if mb := maxBackends.Load(); mb > clients*(poolSize+1) {
		t.Errorf("%d backends at once, want at most %d", mb, clients*(poolSize+1))
	}
	e.reconcile(ctx)
}
