package robustness

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/faultproxy"
	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// businessSchema is the protected business data of every scenario: one row
// per resource (the fenced register), an audit log written by a trigger in the
// same transaction as every accepted write (the ground truth of accepted
// writes, in commit order per resource), and a side-effect table with no
// unique constraint, so a duplicate execution would be visible. grant_log
// keeps every lease grant the same way: pgfence.lease_events is pruned to a
// key's newest events, so a long run could not be checked against it.
const businessSchema = `
CREATE TABLE stock (
    resource text   PRIMARY KEY,
    value    text   NOT NULL DEFAULT '',
    token    bigint NOT NULL DEFAULT 0
);
CREATE TABLE stock_log (
    seq      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource text   NOT NULL,
    token    bigint NOT NULL,
    value    text   NOT NULL
);
CREATE FUNCTION stock_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO stock_log (resource, token, value) VALUES (NEW.resource, NEW.token, NEW.value);
    RETURN NEW;
END $$;
CREATE TRIGGER stock_audit AFTER UPDATE ON stock FOR EACH ROW EXECUTE FUNCTION stock_audit();
CREATE TABLE grant_log (
    id     bigint PRIMARY KEY, -- pgfence.lease_events.id
    key    text   NOT NULL,
    event  text   NOT NULL,
    holder uuid   NOT NULL,
    token  bigint NOT NULL
);
CREATE FUNCTION grant_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.grant_log (id, key, event, holder, token) VALUES (NEW.id, NEW.key, NEW.event, NEW.holder, NEW.token);
    RETURN NULL;
END $$;
CREATE TRIGGER grant_audit AFTER INSERT ON pgfence.lease_events FOR EACH ROW
    WHEN (NEW.event IN ('acquired', 'taken_over')) EXECUTE FUNCTION public.grant_audit();
CREATE TABLE shipments (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    intent text   NOT NULL,
    result text   NOT NULL
);`

// scope is the idempotency scope of every intent in these tests.
const scope = "robustness"

// env is one scenario's database, optionally on a cluster of its own (for
// restarts), with the business schema installed.
type env struct {
	t       *testing.T
	cluster *pgfencetest.Cluster // nil on the shared test server
	db      *pgfencetest.Database
	target  string // host:port of the server, for proxies
	rec     *Recorder
	// promoted is a pool on the new primary after a failover.
	promoted *pgxpool.Pool
}

type envOptions struct {
	// dedicated starts a cluster of this test's own (restart, kill, unreachable).
	dedicated bool
	settings  map[string]string
	// resources are created in stock with token 0 and value "".
	resources []string
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	e := &env{t: t, rec: NewRecorder()}
	if o.dedicated {
		e.cluster = pgfencetest.NewCluster(t, &pgfencetest.ClusterOptions{Settings: o.settings})
		e.db = e.cluster.NewDatabase(t)
		e.target = e.cluster.Addr()
	} else {
		e.db = pgfencetest.NewDatabase(t)
		cfg, err := pgx.ParseConfig(e.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(cfg.Host, "/") {
			if os.Getenv("CI") == "true" {
				t.Fatal("the test server is on a Unix socket; the fault proxy needs TCP (under CI=true this fails: the scenarios must run)")
			}
			t.Skip("the test server is on a Unix socket; the fault proxy needs TCP")
		}
		e.target = net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	}
	ctx := context.Background()
	if _, err := e.db.Pool.Exec(ctx, businessSchema); err != nil {
		t.Fatalf("business schema: %v", err)
	}
	for _, r := range o.resources {
		if _, err := e.db.Pool.Exec(ctx, `INSERT INTO stock (resource) VALUES ($1)`, r); err != nil {
			t.Fatal(err)
		}
	}
	// Registered before any client of the test, so it runs after they are all
	// closed: a client that leaks a connection (pool, LISTEN) fails the test.
	t.Cleanup(func() { e.checkNoConnections() })
	// No unchecked door: from now on every write to stock must present a
	// current token for its resource in its own transaction.
	if err := pgfence.Protect(ctx, e.db.Pool, pgx.Identifier{"stock"}, "resource", ""); err != nil {
		t.Fatalf("protect stock: %v", err)
	}
	return e
}

// proxy starts a fault proxy in front of the server, closed when the test ends.
func (e *env) proxy() *faultproxy.Proxy {
	e.t.Helper()
	p, err := faultproxy.Start(e.target, &faultproxy.Config{CutGrace: 2 * time.Second})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = p.Close() })
	return p
}

// url returns the database URL, through p when p is not nil.
func (e *env) url(p *faultproxy.Proxy) string {
	e.t.Helper()
	if p == nil {
		return e.db.URL
	}
	u, err := p.ConnString(e.db.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

// admin returns the pool the test reads the truth with: the harness's pool on
// the database, or, after a failover, a pool on the promoted standby.
func (e *env) admin() *pgxpool.Pool {
	if e.promoted != nil {
		return e.promoted
	}
	return e.db.Pool
}

// waitQuiet waits until no backend of a client (application_name starting
// with appPrefix) is running a statement or holding a transaction open, so
// nothing a client sent can still commit. A transaction left open by a client
// that is gone (cut, blackholed, killed) is terminated: its COMMIT was never
// sent, so rolling it back is what would happen anyway.
func (e *env) waitQuiet(ctx context.Context, appPrefix string) error {
	const busy = `datname = current_database() AND application_name LIKE $1::text || '%' AND state <> 'idle'`
	for {
		var n int
		err := e.admin().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE `+busy, appPrefix).Scan(&n)
		if err == nil && n == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("backends of %q still busy (%d, %v): %w", appPrefix, n, err, ctx.Err())
		}
		_, _ = e.admin().Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE `+busy+` AND state LIKE 'idle in transaction%'`, appPrefix)
		time.Sleep(20 * time.Millisecond)
	}
}

// checkNoConnections fails the test if a connection of a scenario's clients
// (application_name pf-..., or a leases LISTEN connection) outlives them.
func (e *env) checkNoConnections() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	for {
		err := e.admin().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND (application_name LIKE 'pf-%' OR application_name = $1)`, leasetest.ListenerApplicationName).Scan(&n)
		if err != nil {
			return // the server is gone (a crashed primary): nothing can leak there
		}
		if n == 0 {
			return
		}
		if ctx.Err() != nil {
			e.t.Errorf("%d client connections still open after every client was closed", n)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// truth reads the ground truth back from the database.
func (e *env) truth(ctx context.Context) (Truth, error) {
	db := e.admin()
	tr := Truth{Final: map[string]Register{}, Effects: map[string][]string{}, Stored: map[string]string{}}
	rows, err := db.Query(ctx, `SELECT resource, token, value, seq FROM stock_log ORDER BY seq`)
	if err != nil {
		return tr, err
	}
	tr.Writes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (AcceptedWrite, error) {
		var w AcceptedWrite
		return w, r.Scan(&w.Key, &w.Token, &w.Value, &w.Seq)
	})
	if err != nil {
		return tr, err
	}
	rows, err = db.Query(ctx, `SELECT resource, token, value FROM stock`)
	if err != nil {
		return tr, err
	}
	var r Register
	var key string
	_, err = pgx.ForEachRow(rows, []any{&key, &r.Token, &r.Value}, func() error {
		tr.Final[key] = r
		return nil
	})
	if err != nil {
		return tr, err
	}
	rows, err = db.Query(ctx, `SELECT key, token, holder::text, id, event FROM grant_log ORDER BY id`)
	if err != nil {
		return tr, err
	}
	tr.Grants, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Grant, error) {
		var g Grant
		return g, r.Scan(&g.Key, &g.Token, &g.Holder, &g.Seq, &g.Event)
	})
	if err != nil {
		return tr, err
	}
	rows, err = db.Query(ctx, `SELECT intent, result FROM shipments ORDER BY id`)
	if err != nil {
		return tr, err
	}
	var intent, result string
	_, err = pgx.ForEachRow(rows, []any{&intent, &result}, func() error {
		tr.Effects[intent] = append(tr.Effects[intent], result)
		return nil
	})
	if err != nil {
		return tr, err
	}
	var hasIdem bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('pgfence.idempotency_keys') IS NOT NULL`).Scan(&hasIdem); err != nil || !hasIdem {
		return tr, err
	}
	rows, err = db.Query(ctx, `SELECT key, convert_from(result, 'UTF8') FROM pgfence.idempotency_keys
		WHERE scope = $1 AND status = 'succeeded'`, scope)
	if err != nil {
		return tr, err
	}
	_, err = pgx.ForEachRow(rows, []any{&intent, &result}, func() error {
		tr.Stored[intent] = result
		return nil
	})
	return tr, err
}

// reconcile reads the ground truth and checks the scenario's history against
// it: lock events, token order, business rows and side effects. A failing
// history is saved under testdata/.
func (e *env) reconcile(ctx context.Context) (Truth, Report) {
	e.t.Helper()
	if err := e.waitQuiet(ctx, "pf-"); err != nil {
		e.t.Fatal(err)
	}
	tr, err := e.truth(ctx)
	if err != nil {
		e.t.Fatalf("read ground truth: %v", err)
	}
	ops := e.rec.Ops()
	started := time.Now()
	rep := Check(ops, tr, 30*time.Second)
	e.t.Logf("reconciled %d operations (%d unknown) against %d accepted writes, %d grants, %d effects: porcupine %s in %v, %d violations",
		rep.Ops, rep.Unknown, len(tr.Writes), len(tr.Grants), len(tr.Effects), rep.Linearizable, time.Since(started).Round(time.Millisecond), len(rep.Violations))
	if !rep.OK() {
		name := "failed-" + strings.NewReplacer("/", "_", " ", "_").Replace(e.t.Name()) + ".json"
		path, err := Save("testdata", name, Record{Note: e.t.Name(), Ops: ops, Truth: tr, Violations: rep.Violations})
		e.t.Errorf("%d violations (history saved to %s, %v):\n  %s", len(rep.Violations), path, err, strings.Join(rep.Violations, "\n  "))
	}
	return tr, rep
}
