package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// newRole creates a role named prefix_<random> with the given attributes
// (cluster-wide, so the name is random), dropped with everything it was
// granted in db when the test ends.
func newRole(t *testing.T, db *pgfencetest.Database, prefix, attributes string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := prefix + "_" + hex.EncodeToString(b[:])
	if _, err := db.Pool.Exec(context.Background(), `CREATE ROLE `+pgx.Identifier{name}.Sanitize()+` `+attributes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = db.Pool.Exec(ctx, `DROP OWNED BY `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
		if _, err := db.Pool.Exec(ctx, `DROP ROLE `+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Logf("drop role %s: %v", name, err)
		}
	})
	return name
}

// connectAs opens one connection to db as login (created with
// PASSWORD 'pgfence-test-password'): SET ROLE is the session's.
func connectAs(t *testing.T, db *pgfencetest.Database, login string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User = login
	cfg.Password = "pgfence-test-password"
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// A gateway logs in once and switches to the role of each request (SET ROLE,
// as PostgREST and role-switching poolers do). pgfence decides for the role
// in effect, as PostgreSQL's own privileges do: after SET ROLE tenant_b the
// gateway has tenant_b's grants only, so it can neither read nor release
// orders_service's lease although its login is a member of orders_service;
// SET LOCAL ROLE lasts for its transaction; after RESET ROLE it acts as
// itself, which for a NOINHERIT login is nothing of its member roles; and a
// SECURITY DEFINER function of the application acts as the session's role,
// not as its owner. Row-level security hides and shows rows the same way.
func TestPrefixGrantsFollowTheRoleInEffect(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	orders := newRole(t, db, "orders_service", "NOLOGIN IN ROLE pgfence_app")
	tenantB := newRole(t, db, "tenant_b", "NOLOGIN IN ROLE pgfence_app")
	const loginAttrs = "LOGIN PASSWORD 'pgfence-test-password' "
	gateway := newRole(t, db, "gateway", loginAttrs+"NOINHERIT IN ROLE "+pgx.Identifier{orders}.Sanitize()+", "+pgx.Identifier{tenantB}.Sanitize())
	// An INHERIT login has its member roles' privileges, and SET ROLE narrows
	// them to one role's.
	both := newRole(t, db, "both", loginAttrs+"INHERIT IN ROLE "+pgx.Identifier{orders}.Sanitize()+", "+pgx.Identifier{tenantB}.Sanitize())
	exec(`SELECT pgfence.grant_prefix($1::regrole, 'orders/')`, orders)
	exec(`SELECT pgfence.grant_prefix($1::regrole, 'tb/')`, tenantB)

	// orders_service's lease, granted through the gateway as it.
	gw := connectAs(t, db, gateway)
	mustExec := func(conn *pgx.Conn, sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	mustExec(gw, `SET ROLE `+pgx.Identifier{orders}.Sanitize())
	var holder string
	var token int64
	if err := gw.QueryRow(ctx, `SELECT holder, token FROM pgfence.try_acquire('orders/1', interval '1 hour')`).Scan(&holder, &token); err != nil {
		t.Fatalf("the gateway as orders_service grants orders/1: %v", err)
	}

	refusedWith := func(want string) func(conn *pgx.Conn, as, what, sql string, args ...any) {
		return func(conn *pgx.Conn, as, what, sql string, args ...any) {
			t.Helper()
			if _, err := conn.Exec(ctx, sql, args...); pgerr.Code(err) != want {
				t.Errorf("%s: %s: %v, want %s", as, what, err, want)
			}
		}
	}
	// PF014: the role may execute pgfence's functions, not for this name;
	// 42501: the role may not execute them at all.
	refused, denied := refusedWith(pgerr.CodeNotGranted), refusedWith(codeInsufficientPrivilege)
	allowed := func(conn *pgx.Conn, as, what, sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Errorf("%s: %s: %v", as, what, err)
		}
	}
	ordersRows := func(conn *pgx.Conn) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE key = 'orders/1'`).Scan(&n); err != nil {
			if pgerr.Code(err) == codeInsufficientPrivilege {
				return 0
			}
			t.Fatal(err)
		}
		return n
	}

	for _, login := range []string{gateway, both} {
		conn := gw
		if login == both {
			conn = connectAs(t, db, both)
		}
		as := login + " SET ROLE tenant_b"
		mustExec(conn, `SET ROLE `+pgx.Identifier{tenantB}.Sanitize())
		refused(conn, as, "release orders/1", `SELECT * FROM pgfence.release('orders/1', $1, $2)`, holder, token)
		refused(conn, as, "renew orders/1", `SELECT * FROM pgfence.renew('orders/1', $1, $2, interval '1 hour')`, holder, token)
		refused(conn, as, "check_lease orders/1", `SELECT pgfence.check_lease('orders/1', $1, $2)`, holder, token)
		refused(conn, as, "fence orders/1", `SELECT pgfence.fence('orders/1', $1)`, token)
		refused(conn, as, "grant orders/2", `SELECT * FROM pgfence.try_acquire('orders/2', interval '1 minute')`)
		refused(conn, as, "claim scope orders/api", `SELECT * FROM pgfence.idempotency_claim('orders/api', 'k', '\x00112233445566778899aabbccddeeff', interval '1 minute', interval '1 day')`)
		if n := ordersRows(conn); n != 0 {
			t.Errorf("%s reads %d rows of orders/1, want none", as, n)
		}
		allowed(conn, as, "grant tb/"+login, `SELECT * FROM pgfence.try_acquire($1, interval '1 minute')`, "tb/"+login)
		var mine int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_status WHERE key = $1`, "tb/"+login).Scan(&mine); err != nil || mine != 1 {
			t.Errorf("%s reads %d rows of its own lease (%v), want 1", as, mine, err)
		}

		// SET LOCAL ROLE: orders_service's for the transaction only.
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+pgx.Identifier{orders}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE key = 'orders/1'`).Scan(&n); err != nil || n != 1 {
			t.Errorf("%s SET LOCAL ROLE orders_service reads %d rows of orders/1 (%v), want 1", login, n, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		refused(conn, as+" after a SET LOCAL ROLE", "release orders/1", `SELECT * FROM pgfence.release('orders/1', $1, $2)`, holder, token)

		// Itself: a NOINHERIT login has none of its member roles'
		// privileges; an INHERIT one has both.
		mustExec(conn, `RESET ROLE`)
		as = login + " after RESET ROLE"
		if login == gateway {
			denied(conn, as, "grant orders/3", `SELECT * FROM pgfence.try_acquire('orders/3', interval '1 minute')`)
			denied(conn, as, "grant tb/3", `SELECT * FROM pgfence.try_acquire('tb/3', interval '1 minute')`)
			if n := ordersRows(conn); n != 0 {
				t.Errorf("%s reads %d rows of orders/1, want none", as, n)
			}
		} else {
			allowed(conn, as, "grant orders/3", `SELECT * FROM pgfence.try_acquire('orders/3', interval '1 minute')`)
			allowed(conn, as, "grant tb/3", `SELECT * FROM pgfence.try_acquire('tb/3', interval '1 minute')`)
			if n := ordersRows(conn); n != 1 {
				t.Errorf("%s reads %d rows of orders/1, want 1", as, n)
			}
		}
	}

	// A SECURITY DEFINER function owned by orders_service, called by the
	// gateway as tenant_b: pgfence sees tenant_b, the role in effect.
	schema := pgx.Identifier{orders + "_fns"}.Sanitize()
	exec(`CREATE SCHEMA ` + schema + ` AUTHORIZATION ` + pgx.Identifier{orders}.Sanitize())
	exec(`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + pgx.Identifier{tenantB}.Sanitize())
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`SET LOCAL ROLE ` + pgx.Identifier{orders}.Sanitize(),
		`CREATE FUNCTION ` + schema + `.release_orders(h uuid, tok bigint) RETURNS text LANGUAGE sql SECURITY DEFINER
		    SET search_path = pg_catalog AS $$ SELECT status FROM pgfence.release('orders/1', h, tok) $$`,
	} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(gw, `SET ROLE `+pgx.Identifier{tenantB}.Sanitize())
	refused(gw, "gateway SET ROLE tenant_b through orders_service's SECURITY DEFINER function", "release orders/1",
		`SELECT `+schema+`.release_orders($1, $2)`, holder, token)

	// Through all of it orders/1 stayed orders_service's.
	mustExec(gw, `SET ROLE `+pgx.Identifier{orders}.Sanitize())
	var status string
	if err := gw.QueryRow(ctx, `SELECT status FROM pgfence.release('orders/1', $1, $2)`, holder, token).Scan(&status); err != nil || status != "released" {
		t.Fatalf("the gateway as orders_service releases orders/1: %q %v, want released", status, err)
	}
}

// serviceRole is a pgfence_app login granted prefix only.
func serviceRole(t *testing.T, db *pgfencetest.Database, prefix string) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	name, pool := loginRole(t, db, "pgfence_app")
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.revoke_prefix($1::regrole, '')`, name); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, $2)`, name, prefix); err != nil {
		t.Fatal(err)
	}
	return name, pool
}

// A tenant that learned the holder id of another service's grant, or the
// operation id of its fenced write (from a log, say), abandons it naming a
// key of its own, as abandon_grant and abandon_fence require: the
// abandonment binds the id to that key, so the other service's grant and
// write go through, and its own abandonment of the same id still counts.
func TestAbandonIsBoundToItsName(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, orders := serviceRole(t, db, "orders/")
	_, tenantB := serviceRole(t, db, "tb/")
	grantID, writeID, lateID := uuid(t, db), uuid(t, db), uuid(t, db)

	// The attack, as tenant_b: each id abandoned under a key of its own.
	for _, a := range []struct{ sql, id string }{
		{`SELECT pgfence.abandon_grant('tb/x', $1)`, grantID},
		{`SELECT pgfence.abandon_fence('tb/x', $1)`, writeID},
		{`SELECT pgfence.abandon_grant('tb/y', $1)`, lateID},
	} {
		var abandoned bool
		if err := tenantB.QueryRow(ctx, a.sql, a.id).Scan(&abandoned); err != nil || !abandoned {
			t.Fatalf("tenant_b: %s: %v %v", a.sql, abandoned, err)
		}
	}

	// orders' requests with those ids go through.
	var token int64
	if err := orders.QueryRow(ctx, `SELECT token FROM pgfence.try_acquire('orders/1', interval '1 minute', '', $1) WHERE acquired`, grantID).Scan(&token); err != nil {
		t.Fatalf("orders' grant whose holder id tenant_b abandoned under tb/x: %v, want granted", err)
	}
	if _, err := orders.Exec(ctx, `SELECT pgfence.fence('orders/1', $1, $2)`, token, writeID); err != nil {
		t.Fatalf("orders' write whose operation id tenant_b abandoned under tb/x: %v, want accepted", err)
	}
	// orders abandons its own lost grant: recorded (not "abandoned
	// before"), and the late grant is refused.
	var abandoned bool
	if err := orders.QueryRow(ctx, `SELECT pgfence.abandon_grant('orders/2', $1)`, lateID).Scan(&abandoned); err != nil || !abandoned {
		t.Fatalf("orders abandons its own grant attempt: %v %v, want true", abandoned, err)
	}
	if _, err := orders.Exec(ctx, `SELECT * FROM pgfence.try_acquire('orders/2', interval '1 minute', '', $1)`, lateID); pgerr.Code(err) != pgerr.CodeAbandoned {
		t.Fatalf("orders' late grant after its own abandonment: %v, want PF013", err)
	}
	// What tenant_b abandoned is refused for its own key only.
	if _, err := tenantB.Exec(ctx, `SELECT * FROM pgfence.try_acquire('tb/x', interval '1 minute', '', $1)`, grantID); pgerr.Code(err) != pgerr.CodeAbandoned {
		t.Fatalf("tenant_b's grant of tb/x with the id it abandoned there: %v, want PF013", err)
	}
}

func uuid(t *testing.T, db *pgfencetest.Database) string {
	t.Helper()
	var id string
	if err := db.Pool.QueryRow(context.Background(), `SELECT gen_random_uuid()::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// A tenant reads the kill switches and the protected tables that concern it,
// not other services' prefixes, pause reasons and tables; operators read
// them all.
func TestTenantMetadataIsFiltered(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ordersName, orders := serviceRole(t, db, "orders/")
	tenantBName, tenantB := serviceRole(t, db, "tb/")
	_, operator := loginRole(t, db, "pgfence_operator")
	for _, q := range []string{
		`SELECT pgfence.pause_grants('orders/', 'orders incident 7')`,
		`SELECT pgfence.pause_grants('orders/eu/', 'orders eu migration')`,
		`SELECT pgfence.pause_grants('tb/', 'tb maintenance')`,
		`SELECT pgfence.pause_grants('', 'restore drill')`,
		`SELECT pgfence.resume_grants('', 'drill over')`,
		`CREATE TABLE public.orders_rows (id text PRIMARY KEY)`,
		`CREATE TABLE public.tb_rows (id text PRIMARY KEY)`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON public.orders_rows TO ` + pgx.Identifier{ordersName}.Sanitize(),
		`GRANT SELECT, INSERT, UPDATE, DELETE ON public.tb_rows TO ` + pgx.Identifier{tenantBName}.Sanitize(),
		`SELECT pgfence.protect('public.orders_rows', 'id', 'orders/')`,
		`SELECT pgfence.protect('public.tb_rows', 'id', 'tb/')`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	list := func(pool *pgxpool.Pool, sql string) string {
		t.Helper()
		var s string
		if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(x, ',' ORDER BY x), '') FROM (`+sql+`) q(x)`).Scan(&s); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return s
	}
	for _, c := range []struct {
		who                        string
		pool                       *pgxpool.Pool
		pauses, events, protecteds string
	}{
		{"tenant_b", tenantB, "tb/", ",,tb/", "tb_rows"},
		{"orders", orders, "orders/,orders/eu/", ",,orders/,orders/eu/", "orders_rows"},
		{"an operator", operator, "orders/,orders/eu/,tb/", ",,orders/,orders/eu/,tb/", "orders_rows,tb_rows"},
	} {
		if got := list(c.pool, `SELECT prefix || ':' || reason FROM pgfence.grant_pauses`); got != pausesWithReasons(c.pauses) {
			t.Errorf("%s reads the pauses %q, want %q", c.who, got, pausesWithReasons(c.pauses))
		}
		if got := list(c.pool, `SELECT prefix FROM pgfence.grant_pause_events`); got != c.events {
			t.Errorf("%s reads the pause events of %q, want %q", c.who, got, c.events)
		}
		if got := list(c.pool, `SELECT relation::text FROM pgfence.protected_tables()`); got != c.protecteds {
			t.Errorf("%s reads the protected tables %q, want %q", c.who, got, c.protecteds)
		}
	}
}

// pausesWithReasons maps the prefixes of TestTenantMetadataIsFiltered to
// "prefix:reason".
func pausesWithReasons(prefixes string) string {
	reasons := map[string]string{"orders/": "orders incident 7", "orders/eu/": "orders eu migration", "tb/": "tb maintenance"}
	var out []string
	for _, p := range strings.Split(prefixes, ",") {
		out = append(out, p+":"+reasons[p])
	}
	return strings.Join(out, ",")
}

// An operator who grants a prefix that overlaps another role's ('stock'
// over 'stock:', which would let its role use every 'stock:' name) is told,
// naming the other grant; a prefix that overlaps none is granted quietly.
func TestGrantPrefixWarnsOfOverlaps(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ordersName, _ := serviceRole(t, db, "stock:")
	tenantBName, tenantB := serviceRole(t, db, "tb/")
	operatorName, _ := loginRole(t, db, "pgfence_operator")

	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = operatorName, "pgfence-test-password"
	var notices []*pgconn.Notice
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n) }
	operator, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer operator.Close(context.Background())

	if _, err := operator.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, 'tb2/')`, tenantBName); err != nil || len(notices) != 0 {
		t.Fatalf("a prefix that overlaps none: %v, notices %v", err, notices)
	}
	if _, err := operator.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, 'stock')`, tenantBName); err != nil {
		t.Fatal(err)
	}
	if len(notices) != 1 || notices[0].Severity != "WARNING" ||
		!strings.Contains(notices[0].Message, "'stock:' of role "+ordersName) || !strings.Contains(notices[0].Message, "names that start with 'stock:'") {
		t.Fatalf("granting 'stock' over %s's 'stock:': notices %+v, want one WARNING naming that grant", ordersName, notices)
	}
	// What it warned of: tenant_b may now use orders' names.
	if _, err := tenantB.Exec(ctx, `SELECT * FROM pgfence.try_acquire('stock:apple', interval '1 minute')`); err != nil {
		t.Fatalf("tenant_b under the overlapping grant: %v", err)
	}
}
