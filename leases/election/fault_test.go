package election_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The election's history as the database saw it: a trigger copies every
// version of the election's lease row, so each term's grant time and its end
// (release, or the last expiry it was renewed to) are known by the database
// clock, whatever the replicas say.
const faultSchema = `
CREATE TABLE public.lease_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key text, token bigint, holder uuid, granted_at timestamptz, expires_at timestamptz, released_at timestamptz);
CREATE FUNCTION public.log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.lease_log (key, token, holder, granted_at, expires_at, released_at)
    VALUES (NEW.key, NEW.token, NEW.holder, NEW.granted_at, NEW.expires_at, NEW.released_at);
    RETURN NULL;
END $$;
CREATE TRIGGER lease_log AFTER INSERT OR UPDATE ON pgfence.leases FOR EACH ROW EXECUTE FUNCTION public.log_lease();
CREATE TABLE public.election_writes (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, replica text NOT NULL, term bigint NOT NULL, at timestamptz NOT NULL);`

// grantInterval is one term as the database saw it.
type grantInterval struct {
	Term       int64
	Holder     string
	Start, End time.Time
}

// terms reads every term of key from the log, in grant order.
func terms(t *testing.T, pool *pgxpool.Pool, key string) []grantInterval {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
SELECT DISTINCT ON (token) token, holder::text, granted_at,
       CASE WHEN released_at IS NOT NULL AND released_at < expires_at THEN released_at ELSE expires_at END
  FROM public.lease_log WHERE key = $1 ORDER BY token, id DESC`, key)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[grantInterval])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// faultEnv is a running election of replica processes on a cluster of the
// test's own, each replica behind a fault proxy of its own.
type faultEnv struct {
	t        *testing.T
	cluster  *pgfencetest.Cluster
	db       *pgfencetest.Database
	key      string
	ttl      time.Duration
	replicas []*remoteReplica
	reports  map[string]replicaReport // final reports, including the dead's last
}

type remoteReplica struct {
	name    string
	w       *workerproc.Worker
	proxy   *faultproxy.Proxy
	dead    bool // killed
	stopped bool // SIGSTOP: answers nothing
}

func (f *faultEnv) start(name string) *remoteReplica {
	f.t.Helper()
	p := newProxy(f.t, f.cluster.Addr())
	url, err := p.ConnString(f.db.URL)
	if err != nil {
		f.t.Fatal(err)
	}
	w := workerproc.Start(f.t, "replica", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Call(ctx, "open", replicaArgs{URL: url, Key: f.key, Name: name, TTL: f.ttl, Poll: 2 * time.Second}, nil); err != nil {
		f.t.Fatalf("open %s: %v\n%s", name, err, w.Stderr())
	}
	r := &remoteReplica{name: name, w: w, proxy: p}
	f.replicas = append(f.replicas, r)
	return r
}

func (f *faultEnv) report(r *remoteReplica) replicaReport {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rep replicaReport
	if err := r.w.Call(ctx, "report", nil, &rep); err != nil {
		f.t.Fatalf("report of %s: %v\n%s", r.name, err, r.w.Stderr())
	}
	f.reports[r.name] = rep
	return rep
}

// leader waits until a replica leads a term of at least min, by the
// database and by its own account, and has written with it; it returns the
// replica and the term.
func (f *faultEnv) leader(min int64) (*remoteReplica, int64) {
	f.t.Helper()
	var (
		leader *remoteReplica
		term   int64
	)
	eventually(f.t, 30*time.Second, fmt.Sprintf("a leader of term %d or later that wrote", min), func() bool {
		var written bool
		err := f.db.Pool.QueryRow(context.Background(), `
SELECT l.token, EXISTS (SELECT 1 FROM public.election_writes w WHERE w.term = l.token)
  FROM pgfence.lease_status l WHERE l.key = $1 AND l.live`, f.key).Scan(&term, &written)
		if err != nil || term < min || !written {
			return false
		}
		for _, r := range f.replicas {
			if !r.dead && !r.stopped {
				if rep := f.report(r); rep.Leading && rep.Term == term {
					leader = r
					return true
				}
			}
		}
		return false
	})
	f.t.Logf("%s leads term %d", leader.name, term)
	return leader, term
}

// wake expires the election's lease now, as if the time had passed, and
// wakes the followers (an expiry is not announced).
func (f *faultEnv) expire() { backdate(f.t, f.db.Pool, f.key, 0) }

// An election of four replica processes through a paused leader (SIGSTOP
// past the TTL), a killed one (SIGKILL), one cut off from the database (no
// reply, no reset) and a database restart. By the database clock at most
// one replica leads at any moment: every moment a replica vouched for
// leading lies inside its term's grant as the database recorded it, and
// the grants do not overlap. The paused leader's write with its old term
// is refused once it resumes. Every surviving replica observed every change
// of leadership, in order.
func TestElectionUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and worker processes")
	}
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	ctx := ctxTimeout(t, 5*time.Minute)
	if _, err := db.Pool.Exec(ctx, faultSchema); err != nil {
		t.Fatal(err)
	}
	f := &faultEnv{t: t, cluster: cluster, db: db, key: "cluster/leader", ttl: 1500 * time.Millisecond, reports: map[string]replicaReport{}}
	for _, name := range []string{"r1", "r2", "r3", "r4"} {
		f.start(name)
	}

	// 1. SIGSTOP the leader for longer than the TTL: a follower is elected
	// by the database clock, without backdating; when the old leader
	// resumes, its term is over and its write with that term is refused.
	paused, term := f.leader(0)
	if err := paused.w.Stop(); err != nil {
		t.Fatal(err)
	}
	paused.stopped = true
	time.Sleep(f.ttl + 200*time.Millisecond) // its trust window and its lease run out
	_, next := f.leader(term + 1)
	if err := paused.w.Cont(); err != nil {
		t.Fatal(err)
	}
	paused.stopped = false
	var refused map[string]int64
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err := paused.w.Call(wctx, "stale_write", nil, &refused)
	cancel()
	if err != nil {
		t.Fatalf("the resumed leader's write with term %d: %v, want it refused", term, err)
	}
	if refused["presented"] != term || refused["accepted"] < next {
		t.Fatalf("the resumed leader's write was refused with %v, want term %d refused after term %d", refused, term, next)
	}
	eventually(t, 10*time.Second, "the resumed leader no longer leads", func() bool {
		rep := f.report(paused)
		return !rep.Leading && strings.Contains(rep.Stopped[term], "pgfence: lease lost")
	})
	t.Logf("the resumed leader's term ended: %s", f.reports[paused.name].Stopped[term])

	// 2. SIGKILL the leader: it is replaced once its lease expires.
	killed, term := f.leader(next)
	f.report(killed) // its samples until now
	if err := killed.w.Kill(); err != nil {
		t.Fatal(err)
	}
	killed.dead = true
	f.expire()
	_, term = f.leader(term + 1)
	f.start("r5")

	// 3. Cut the leader off from the database: it stops leading on its
	// own (its trust window runs out), then a follower is elected.
	cut, term := f.leader(term)
	cut.proxy.SetBlackhole(faultproxy.ClientToServer, true)
	cut.proxy.SetBlackhole(faultproxy.ServerToClient, true)
	eventually(t, 10*time.Second, "the cut-off leader stops leading", func() bool { return !f.report(cut).Leading })
	f.expire()
	_, term = f.leader(term + 1)
	cut.proxy.Heal()
	cut.proxy.CutAll()

	// 4. Restart PostgreSQL: every connection breaks; a leader leads and
	// writes again afterwards.
	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	var restarted time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&restarted); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a write after the restart", func() bool {
		var n int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM public.election_writes WHERE at > $1`, restarted).Scan(&n)
		return err == nil && n > 0
	})
	last, term := f.leader(term)
	t.Logf("after the restart %s leads", last.name)

	// The followers catch up with the last change: at once when it was
	// announced, at their next read when their LISTEN connection was down
	// when it was.
	eventually(t, 10*time.Second, "every replica saw the last term", func() bool {
		for _, r := range f.replicas {
			if r.dead {
				continue
			}
			if obs := f.report(r).Observed; len(obs) == 0 || obs[len(obs)-1] != term {
				return false
			}
		}
		return true
	})
	checkHistory(t, f)
}

// checkHistory checks the invariants of the election's history.
func checkHistory(t *testing.T, f *faultEnv) {
	t.Helper()
	grants := terms(t, f.db.Pool, f.key)
	// The pause, the kill and the cut each end a term; the restart ends one
	// only when the leader's renewals could not get through within its TTL
	// (a leader that renews across a quick restart keeps its term).
	if len(grants) < 4 {
		t.Fatalf("only %d terms: %+v", len(grants), grants)
	}
	byTerm := map[int64]grantInterval{}
	var order []int64
	for i, g := range grants {
		byTerm[g.Term] = g
		order = append(order, g.Term)
		if i > 0 && g.Start.Before(grants[i-1].End) {
			t.Errorf("term %d granted at %v, before term %d ended at %v", g.Term, g.Start, grants[i-1].Term, grants[i-1].End)
		}
	}
	t.Logf("%d terms", len(grants))

	// Every moment a replica vouched for leading lies in its term's grant.
	names := make([]string, 0, len(f.reports))
	for name := range f.reports {
		names = append(names, name)
	}
	sort.Strings(names)
	samples := 0
	for _, name := range names {
		rep := f.reports[name]
		for _, s := range rep.Samples {
			samples++
			g, ok := byTerm[s.Term]
			switch {
			case !ok:
				t.Errorf("%s led term %d, which the database never granted", name, s.Term)
			case s.At.Before(g.Start) || s.At.After(g.End):
				t.Errorf("%s led term %d at %v, outside its grant [%v, %v]: two leaders at once", name, s.Term, s.At, g.Start, g.End)
			}
		}
		for _, term := range rep.Started {
			if _, ok := byTerm[term]; !ok {
				t.Errorf("%s started leading term %d, never granted", name, term)
			}
		}
	}
	if samples == 0 {
		t.Fatal("no samples of leadership")
	}
	t.Logf("%d samples of leadership, each inside its term", samples)

	// Accepted writes never go back to an earlier term.
	rows, err := f.db.Pool.Query(context.Background(), `SELECT term FROM public.election_writes ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	written, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.IsSorted(written) {
		t.Errorf("accepted writes went back to an earlier term: %v", slices.Compact(written))
	}

	// Every surviving replica observed every change from when it started,
	// in order, up to the last term.
	for _, r := range f.replicas {
		if r.dead {
			continue
		}
		var seen []int64
		for _, term := range f.reports[r.name].Observed {
			if term != 0 && (len(seen) == 0 || seen[len(seen)-1] != term) {
				seen = append(seen, term)
			}
		}
		i := slices.Index(order, seen[0])
		if i < 0 || !slices.Equal(seen, order[i:]) {
			t.Errorf("%s observed terms %v, the database granted %v", r.name, seen, order)
		}
	}
}
