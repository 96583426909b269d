package robustness

// The acceptance scenarios of a lock service with fencing. Each one ends with
// e.reconcile: lock events, token order, business rows and side effects are
// read back from the database and checked against everything the clients
// were told (see Check).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/pgfence"
)

const sku = "sku-1"

// Simultaneous acquire: of many clients racing for one key, exactly one gets
// the lease; only it writes.
func TestScenarioSimultaneousAcquire(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{resources: []string{sku}})
	const n = 12
	actors := make([]*actor, n)
	for i := range actors {
		actors[i] = e.local(i, nil)
	}
	ctx := bounded(t, time.Minute)
	start := make(chan struct{})
	results := make([]Op, n)
	var wg sync.WaitGroup
	for i, a := range actors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = e.recorded(i, func() Op { return a.acquire(ctx, sku, time.Minute, 0) })
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, op := range results {
		switch op.Outcome {
		case OK:
			if winner >= 0 {
				t.Fatalf("clients %d and %d both acquired %s", winner, i, sku)
			}
			winner = i
		case Rejected:
		default:
			t.Fatalf("client %d: %s (%s)", i, op.Outcome, op.Err)
		}
	}
	if winner < 0 {
		t.Fatal("nobody acquired the lease")
	}
	tok := results[winner].Token
	want(t, e.recorded(winner, func() Op { return actors[winner].write(ctx, sku, tok, "winner") }), OK)
	e.reconcile(ctx)
	if ev := e.events(sku); len(ev) != 1 || ev[0] != fmt.Sprintf("acquired:%d", tok) {
		t.Fatalf("lease events %v, want exactly one grant with token %d", ev, tok)
	}
}

// Holder crash: a holder process dies (SIGKILL) holding the lease. Nobody can
// take the key until the lease expires by the database clock; then a new
// holder gets a higher token and its writes stand.
func TestScenarioHolderCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{resources: []string{sku}})
	ctx := bounded(t, time.Minute)
	a := e.startRemote(0, e.url(nil))
	acq := want(t, a.do("acquire", opArgs{Key: sku, TTL: time.Minute, Timeout: 10 * time.Second}, 20*time.Second), OK)
	want(t, a.do("write", opArgs{Key: sku, Token: acq.Token, Value: "a1", Timeout: 10 * time.Second}, 20*time.Second), OK)
	if err := a.w.Kill(); err != nil {
		t.Fatal(err)
	}

	b := e.local(1, nil)
	want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), Rejected) // a crash releases nothing
	e.backdate(sku)
	bAcq := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)
	if bAcq.Token <= acq.Token {
		t.Fatalf("new holder's token %d is not above the crashed holder's %d", bAcq.Token, acq.Token)
	}
	want(t, e.recorded(1, func() Op { return b.write(ctx, sku, bAcq.Token, "b1") }), OK)
	tr, _ := e.reconcile(ctx)
	if f := tr.Final[sku]; f.Value != "b1" || f.Token != bAcq.Token {
		t.Fatalf("final %+v, want b1 with token %d", f, bAcq.Token)
	}
}

// Pause beyond the lease, the key experiment: A holds the lease and is
// frozen (SIGSTOP) with a write in hand; its lease expires; B takes over with
// a higher token and writes; A resumes and sends its write. The database must
// reject A (A does not notice by itself), A's late release must not free B's
// lease, and the final data is B's.
func TestScenarioPauseBeyondLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{resources: []string{sku}})
	ctx := bounded(t, time.Minute)
	a := e.startRemote(0, e.url(nil))
	acq := want(t, a.do("acquire", opArgs{Key: sku, TTL: 2 * time.Second, Timeout: 10 * time.Second}, 20*time.Second), OK)
	want(t, a.do("write", opArgs{Key: sku, Token: acq.Token, Value: "a1", Timeout: 10 * time.Second}, 20*time.Second), OK)

	if err := a.w.Stop(); err != nil {
		t.Fatal(err)
	}
	// What A is about to do when it wakes up: no local check of the lease,
	// only the database judges.
	lateWrite := a.send("write", opArgs{Key: sku, Token: acq.Token, Value: "a-late"})
	lateLeased := a.send("write_leased", opArgs{Key: sku, Value: "a-late-leased"})
	lateRelease := a.send("release", opArgs{Key: sku})

	e.backdate(sku)
	b := e.local(1, nil)
	bAcq := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)
	if bAcq.Token <= acq.Token {
		t.Fatalf("B's token %d is not above A's %d", bAcq.Token, acq.Token)
	}
	want(t, e.recorded(1, func() Op { return b.write(ctx, sku, bAcq.Token, "b1") }), OK)

	if err := a.w.Cont(); err != nil {
		t.Fatal(err)
	}
	late := lateWrite.wait(20 * time.Second)
	if late.Outcome != Stale {
		t.Fatalf("A's late fenced write: %s (%s), want rejected as stale", late.Outcome, late.Err)
	}
	if op := lateLeased.wait(20 * time.Second); op.Outcome != Rejected {
		t.Fatalf("A's late lease-checked write: %s (%s), want rejected (lease not held)", op.Outcome, op.Err)
	}
	if op := lateRelease.wait(20 * time.Second); op.Outcome == OK {
		t.Fatalf("A's late release succeeded although B holds the lease")
	}
	if row := e.leaseRow(sku); !row.Live || row.Token != bAcq.Token {
		t.Fatalf("after A's late release the lease is %+v, want B's (token %d) live", row, bAcq.Token)
	}
	tr, _ := e.reconcile(ctx)
	if f := tr.Final[sku]; f.Value != "b1" {
		t.Fatalf("final %+v, want B's write", f)
	}
}

// Lost renewal: the renewal request is lost (the lease is not extended), or
// its reply is lost (the database extended it, the client does not know).
// Either way the caller gets an error within its deadline, its local view of
// the lease is not extended, and once the lease expires by the database clock
// a new holder's token wins.
func TestScenarioLostRenewal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		arm     func(p *faultproxy.Proxy, match func(faultproxy.Message) bool) *faultproxy.Trigger
		applied bool
	}{
		{"request lost", (*faultproxy.Proxy).CutBefore, false},
		{"reply lost", (*faultproxy.Proxy).CutAfter, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOptions{resources: []string{sku}})
			ctx := bounded(t, time.Minute)
			p := e.proxy()
			a := e.local(0, p)
			acq := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)
			before := e.leaseRow(sku)
			localBefore := a.lease(sku).ExpiresAt()

			trig := tc.arm(p, faultproxy.SQLContains("pgfence.renew("))
			start := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			err := a.renew(rctx, sku)
			cancel()
			if err == nil {
				t.Fatal("renewal succeeded although its request or reply was cut")
			}
			if !errors.Is(err, pgerr.ErrOutcomeUnknown) && !errors.Is(err, pgerr.ErrUnavailable) {
				t.Fatalf("renewal error %v, want outcome unknown or unavailable", err)
			}
			if errors.Is(err, pgfence.ErrLeaseLost) {
				t.Fatalf("a lost renewal message ended the lease: %v", err)
			}
			t.Logf("caller saw after %v: %v", time.Since(start).Round(time.Millisecond), err)
			<-trig.Done()
			after := e.leaseRow(sku)
			// A cut after forwarding is done once the server has finished
			// the renewal (its ReadyForQuery), so the row shows it now.
			if tc.applied && !trig.Replied() {
				t.Fatal("the proxy forwarded the renewal but the server did not finish it")
			}
			if got := after.ExpiresAt.After(before.ExpiresAt); got != tc.applied {
				t.Fatalf("database extended the lease = %v, want %v (before %v, after %v)", got, tc.applied, before.ExpiresAt, after.ExpiresAt)
			}
			if !a.lease(sku).ExpiresAt().Equal(localBefore) {
				t.Fatal("the client extended its view of the lease without a confirmed renewal")
			}

			e.backdate(sku)
			b := e.local(1, nil)
			bAcq := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)
			want(t, e.recorded(1, func() Op { return b.write(ctx, sku, bAcq.Token, "b1") }), OK)
			want(t, e.recorded(0, func() Op { return a.write(ctx, sku, acq.Token, "a-after-lost-renewal") }), Stale)
			e.reconcile(ctx)
		})
	}
}

// Takeover by a new holder: after the lease expires, the new holder's grant
// is recorded as a takeover with a higher token; the old holder's renewal,
// release and writes all fail without touching the new grant.
func TestScenarioTakeover(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{resources: []string{sku}})
	ctx := bounded(t, time.Minute)
	a, b := e.local(0, nil), e.local(1, nil)
	acq := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)
	want(t, e.recorded(0, func() Op { return a.write(ctx, sku, acq.Token, "a1") }), OK)
	want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), Rejected)
	e.backdate(sku)
	bAcq := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)

	if err := a.renew(ctx, sku); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("old holder's renewal after takeover: %v, want ErrLeaseLost", err)
	}
	want(t, e.recorded(0, func() Op { return a.release(ctx, sku) }), Rejected)
	// Until B writes, the fence has only seen A's token; the lease-checked
	// write refuses A at once, the fenced write once B's token was accepted.
	want(t, e.recorded(0, func() Op { return a.writeLeased(ctx, sku, 0, "a2-leased") }), Rejected)
	want(t, e.recorded(1, func() Op { return b.write(ctx, sku, bAcq.Token, "b1") }), OK)
	want(t, e.recorded(0, func() Op { return a.write(ctx, sku, acq.Token, "a2") }), Stale)
	if row := e.leaseRow(sku); !row.Live || row.Token != bAcq.Token {
		t.Fatalf("lease %+v, want B's grant live", row)
	}
	ev := e.events(sku)
	if len(ev) != 2 || ev[0] != fmt.Sprintf("acquired:%d", acq.Token) || ev[1] != fmt.Sprintf("taken_over:%d", bAcq.Token) {
		t.Fatalf("lease events %v, want A's grant then B's takeover", ev)
	}
	e.reconcile(ctx)
}

// An old request arriving late: A's write is held in the network (the proxy
// forwards none of its bytes) while B takes over and writes; when A's
// request finally arrives the database rejects it. The hold is released only
// after B's write returned, so the late request is late on any machine.
func TestScenarioOldRequestArrivesLate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{resources: []string{sku}})
	ctx := bounded(t, time.Minute)
	p := e.proxy()
	a := e.local(0, p)
	acq := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)

	p.SetHold(faultproxy.ClientToServer, true)
	late := make(chan Op, 1)
	go func() { late <- e.recorded(0, func() Op { return a.write(ctx, sku, acq.Token, "a-late") }) }()

	e.backdate(sku)
	b := e.local(1, nil)
	bAcq := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)
	want(t, e.recorded(1, func() Op { return b.write(ctx, sku, bAcq.Token, "b1") }), OK)
	p.SetHold(faultproxy.ClientToServer, false)
	if op := <-late; op.Outcome != Stale {
		t.Fatalf("A's late request: %s (%s), want rejected as stale", op.Outcome, op.Err)
	}
	tr, _ := e.reconcile(ctx)
	if tr.Final[sku].Value != "b1" {
		t.Fatalf("final %+v, want B's write", tr.Final[sku])
	}
}

// Double release: releasing twice is harmless, a release retried after its
// reply was lost succeeds once, and a late release of an old grant never frees
// the current holder's lease.
func TestScenarioDoubleRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{resources: []string{sku}})
	ctx := bounded(t, time.Minute)
	p := e.proxy()
	a, b := e.local(0, p), e.local(1, nil)
	acq := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)

	// The first release's reply is lost; the client retries by itself.
	trig := p.CutAfter(faultproxy.SQLContains("pgfence.release("))
	want(t, e.recorded(0, func() Op { return a.release(ctx, sku) }), OK)
	<-trig.Done()
	if !trig.Fired() {
		t.Fatal("the release's reply was not cut")
	}
	want(t, e.recorded(0, func() Op { return a.release(ctx, sku) }), OK) // twice: still fine

	bAcq := want(t, e.recorded(1, func() Op { return b.acquire(ctx, sku, time.Minute, 0) }), OK)
	// A replays its release with its old grant, as a late duplicate would.
	var released bool
	var status string
	if err := e.admin().QueryRow(ctx, `SELECT released, status FROM pgfence.release($1, $2::uuid, $3, true)`,
		sku, a.lease(sku).Holder(), acq.Token).Scan(&released, &status); err != nil {
		t.Fatal(err)
	}
	if released {
		t.Fatalf("a late release of token %d freed the lease (status %s)", acq.Token, status)
	}
	if row := e.leaseRow(sku); !row.Live || row.Token != bAcq.Token {
		t.Fatalf("lease %+v, want B's grant (token %d) live", row, bAcq.Token)
	}
	if n := e.count(`SELECT count(*) FROM pgfence.lease_events WHERE key = $1 AND event = 'released'`, sku); n != 1 {
		t.Fatalf("%d release events, want 1", n)
	}
	e.reconcile(ctx)
}

// Duplicate business request: the same intent sent many times, concurrently
// and after a lost commit reply, has exactly one effect; every caller gets the
// same result.
func TestScenarioDuplicateBusinessRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := bounded(t, time.Minute)
	p := e.proxy()
	a := e.local(0, p)

	// The first attempt commits but its reply is lost.
	trig := p.CutAfter(faultproxy.IsCommit)
	first := e.recorded(0, func() Op { return a.effect(ctx, "order-1", "r0") })
	<-trig.Done()
	if first.Outcome != Unknown || !trig.Replied() {
		t.Fatalf("first attempt: %s (%s), replied=%v; want unknown with the commit applied", first.Outcome, first.Err, trig.Replied())
	}
	// Retries from many clients at once: all get one and the same result. It
	// is r0 when the first COMMIT took effect; the proxy's cut can also land
	// before the server read the COMMIT (the reply it saw was an earlier
	// message's), and then exactly one retry runs the intent instead.
	const n = 10
	results := make([]string, n+1)
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		c := e.local(i, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			op := e.recorded(i, func() Op { return c.effect(ctx, "order-1", fmt.Sprint("r", i)) })
			if op.Outcome != OK {
				t.Errorf("duplicate %d: %s (%s), want the stored result", i, op.Outcome, op.Err)
			}
			results[i] = op.Result
		}()
	}
	wg.Wait()
	var stored []byte
	if err := e.admin().QueryRow(ctx, `SELECT result FROM pgfence.idempotency_keys WHERE key = 'order-1'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		if results[i] != string(stored) {
			t.Errorf("duplicate %d got %q, but the stored result is %q", i, results[i], stored)
		}
	}
	if got := e.count(`SELECT count(*) FROM shipments WHERE intent = 'order-1'`); got != 1 {
		t.Fatalf("%d shipments for one intent, want 1", got)
	}
	e.reconcile(ctx)
}

// Business write with unknown outcome: the COMMIT of a fenced write is cut
// (after it reached the server, or before); the caller is told the outcome is
// unknown and resolves it by reading back.
func TestScenarioUnknownCommitOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		arm  func(p *faultproxy.Proxy, match func(faultproxy.Message) bool) *faultproxy.Trigger
		want pgfence.Outcome
	}{
		{"commit applied", (*faultproxy.Proxy).CutAfter, pgfence.Applied},
		{"commit lost", (*faultproxy.Proxy).CutBefore, pgfence.NotApplied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOptions{resources: []string{sku}})
			ctx := bounded(t, time.Minute)
			p := e.proxy()
			a := e.local(0, p)
			acq := want(t, e.recorded(0, func() Op { return a.acquire(ctx, sku, time.Minute, 0) }), OK)
			trig := tc.arm(p, faultproxy.IsCommit)
			call := e.rec.Now()
			_, err := pgfence.Write(ctx, a.pool, pgfence.LeaseOf(sku, "", acq.Token), func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, writeSQL, sku, "v1", acq.Token)
				return err
			})
			e.rec.Add(Op{Client: 0, Kind: Write, Key: sku, Token: acq.Token, Value: "v1", Outcome: classify(err), Call: call, Return: e.rec.Now()})
			<-trig.Done()
			var unknown *pgfence.OutcomeUnknownError
			if !errors.As(err, &unknown) {
				t.Fatalf("cut COMMIT returned %v, want an OutcomeUnknownError", err)
			}
			got, err := pgfence.Resolve(ctx, e.admin(), unknown)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("Resolve = %v, want %v", got, tc.want)
			}
			tr, _ := e.reconcile(ctx)
			if applied := tr.Final[sku].Value == "v1"; applied != (tc.want == pgfence.Applied) {
				t.Fatalf("business row %+v disagrees with Resolve = %v", tr.Final[sku], got)
			}
		})
	}
}
