package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const codeInsufficientPrivilege = "42501"

// loginRole creates a LOGIN role that is a member of group (cluster-wide, so
// its name is random) and returns a pool on db connected as it. The role and
// everything it was granted in db are dropped when the test ends.
func loginRole(t *testing.T, db *pgfencetest.Database, group string) (name string, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name = "pgfence_t_" + strings.TrimPrefix(group, "pgfence_") + "_" + hex.EncodeToString(b[:])
	const password = "pgfence-test-password"
	create := `CREATE ROLE ` + pgx.Identifier{name}.Sanitize() + ` LOGIN PASSWORD '` + password + `'`
	if group != "" {
		create += ` IN ROLE ` + pgx.Identifier{group}.Sanitize()
	}
	if _, err := db.Pool.Exec(ctx, create); err != nil {
		t.Fatal(err)
	}
	if group == "pgfence_app" && installed(t, db) {
		// Every name: these tests are about privileges, not about prefixes
		// (prefix_test.go).
		if _, err := db.Pool.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, '')`, name); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = name
	cfg.ConnConfig.Password = password
	cfg.MaxConns = 4
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		// DROP OWNED revokes what the role was granted in this database; the
		// role itself is cluster-wide.
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
		if _, err := db.Pool.Exec(context.Background(), `DROP ROLE `+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Logf("drop role %s: %v", name, err)
		}
	})
	return name, pool
}

// installed reports whether the pgfence schema is installed in db (a blank
// database has no pgfence.grant_prefix to call).
func installed(t *testing.T, db *pgfencetest.Database) bool {
	t.Helper()
	var ok bool
	if err := db.Pool.QueryRow(context.Background(), `SELECT pg_catalog.to_regprocedure('pgfence.grant_prefix(regrole,text)') IS NOT NULL`).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// The guard of a protected table runs with the rights of the role that
// writes, never the pgfence owner's: it turns the row into jsonb, which calls
// any cast to json of a column's type, and the owner of a table can create
// such a type and cast. As SECURITY DEFINER the cast of an operator's own
// table would run as the pgfence owner, a superuser, on every write. A writer that belongs to no pgfence role is refused with PF006
// like any unfenced write, not with a permission error.
func TestGuardRunsAsTheWriter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	owner := db.Pool
	opName, op := loginRole(t, db, "pgfence_operator")
	mustExecPool(t, owner, `GRANT CREATE ON SCHEMA public TO `+pgx.Identifier{opName}.Sanitize())
	for _, q := range []string{
		`CREATE TYPE mood AS ENUM ('x')`,
		`CREATE TABLE cast_ran_as (who text)`,
		`CREATE FUNCTION mood_json(v mood) RETURNS json LANGUAGE sql VOLATILE AS
		    'INSERT INTO public.cast_ran_as VALUES (current_user); SELECT ''"x"''::json'`,
		`CREATE CAST (mood AS json) WITH FUNCTION mood_json(mood)`,
		`CREATE TABLE moods (r text PRIMARY KEY, v mood)`,
	} {
		mustExecPool(t, op, q)
	}
	if err := pgfence.Protect(ctx, op, pgx.Identifier{"moods"}, "r", "mood:"); err != nil {
		t.Fatal(err)
	}
	// The operator writes under its own prefix.
	if _, err := owner.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, 'mood:')`, opName); err != nil {
		t.Fatal(err)
	}
	pgfencetest.IssueToken(t, owner, "mood:1", 1)
	if _, err := pgfence.Exec(ctx, op, pgfence.LeaseOf("mood:1", "", 1), `INSERT INTO moods VALUES ('1', 'x')`); err != nil {
		t.Fatalf("operator: fenced insert into its own protected table: %v", err)
	}
	rows, err := owner.Query(ctx, `SELECT DISTINCT who FROM cast_ran_as`)
	if err != nil {
		t.Fatal(err)
	}
	who, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(who) != 1 || who[0] != opName {
		t.Fatalf("the table's cast to json ran as %q inside the guard, want only the writer %q", who, opName)
	}

	// A writer outside the pgfence roles, with DML on a protected table.
	outsiderName, outsider := loginRole(t, db, "")
	mustExecPool(t, owner, `CREATE TABLE ledger (id int PRIMARY KEY)`)
	if err := pgfence.Protect(ctx, owner, pgx.Identifier{"ledger"}, "id", "ledger:"); err != nil {
		t.Fatal(err)
	}
	mustExecPool(t, owner, `GRANT SELECT, INSERT, UPDATE, DELETE ON ledger TO `+pgx.Identifier{outsiderName}.Sanitize())
	if _, err := outsider.Exec(ctx, `INSERT INTO ledger VALUES (1)`); pgerr.Code(err) != "PF006" {
		t.Fatalf("outsider: unfenced insert: %v, want PF006", err)
	}
}

// denied fails unless err is SQLSTATE 42501 (insufficient_privilege).
func denied(t *testing.T, what string, err error) {
	t.Helper()
	if code := pgerr.Code(err); code != codeInsufficientPrivilege {
		t.Errorf("%s: want 42501 insufficient_privilege, got %v", what, err)
	}
}

// TestLeastPrivilege connects as members of pgfence_app and pgfence_operator
// and proves that the application role takes part in the protocol through
// the functions only: it cannot write lease, token, floor or fence rows,
// lower a token, or remove the guard of a table it does not own; the operator
// role can run the operations the application role cannot.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	owner := db.Pool // the role that ran the migrations and owns the business table

	// The recommended setup: the business table belongs to the owner role,
	// the application's login role gets DML on it only.
	mustExecPool(t, owner, `CREATE TABLE acct (id int PRIMARY KEY, balance int NOT NULL)`)
	mustExecPool(t, owner, `INSERT INTO acct VALUES (1, 10), (2, 20)`)
	if err := pgfence.Protect(ctx, owner, pgx.Identifier{"acct"}, "id", "acct:"); err != nil {
		t.Fatal(err)
	}
	appName, app := loginRole(t, db, "pgfence_app")
	opName, op := loginRole(t, db, "pgfence_operator")
	mustExecPool(t, owner, `GRANT SELECT, INSERT, UPDATE, DELETE ON acct TO `+pgx.Identifier{appName}.Sanitize())

	// The protocol works through the functions, via the Go packages.
	lc, err := leases.New(app, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	l, err := lc.TryAcquire(ctx, "acct:1", time.Minute, nil)
	if err != nil {
		t.Fatalf("app: TryAcquire: %v", err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("app: Renew: %v", err)
	}
	if _, err := lc.Acquire(ctx, "fair:1", time.Minute, &leases.AcquireOptions{Fair: true, MaxWait: 10 * time.Second}); err != nil {
		t.Fatalf("app: fair Acquire: %v", err)
	}
	if _, err := lc.Get(ctx, "acct:1"); err != nil {
		t.Fatalf("app: Get (lease_status): %v", err)
	}
	if _, err := lc.History(ctx, "acct:1", 10); err != nil {
		t.Fatalf("app: History: %v", err)
	}
	rcpt, err := pgfence.Write(ctx, app, pgfence.LeaseOf("acct:1", "", l.Token()), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE acct SET balance = 11 WHERE id = 1`)
		return err
	})
	if err != nil {
		t.Fatalf("app: fenced write: %v", err)
	}
	if got, err := pgfence.Resolve(ctx, app, &pgfence.OutcomeUnknownError{Resource: rcpt.Resource, Token: rcpt.Token, Op: rcpt.Op}); err != nil || got != pgfence.Applied {
		t.Fatalf("app: Resolve = %v, %v; want applied", got, err)
	}
	if got, err := pgfence.Resolve(ctx, app, &pgfence.OutcomeUnknownError{Resource: "acct:never", Token: 1, Op: pgfence.OpID{1}}); err != nil || got != pgfence.NotApplied {
		t.Fatalf("app: Resolve of an unwritten resource = %v, %v; want not applied", got, err)
	}
	if _, err := pgfence.LookupFence(ctx, owner, "acct:never"); !errors.Is(err, pgfence.ErrNotFound) {
		t.Fatalf("Resolve left a fence row behind: %v", err)
	}
	if _, err := pgfence.Write(ctx, app, pgfence.Checked(l), func(ctx context.Context, tx pgx.Tx) error {
		return nil
	}); err != nil {
		t.Fatalf("app: lease-checked write: %v", err)
	}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := store.Do(ctx, app, idempotency.Request{Scope: "s", Key: "k1"}, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return []byte("ok"), nil
	})
	if err != nil || out.Replayed {
		t.Fatalf("app: atomic idempotency = %+v, %v", out, err)
	}
	out, err = store.Claim(ctx, app, idempotency.Request{Scope: "s", Key: "k2"})
	if err != nil || out.Replayed {
		t.Fatalf("app: leased claim = %+v, %v", out, err)
	}
	if _, err := out.Attempt.Complete(ctx, []byte("done")); err != nil {
		t.Fatalf("app: complete: %v", err)
	}
	// A stale write is refused, and the application records the rejection
	// (pgfence.record_fence_rejection) without any write privilege on
	// pgfence.fence_rejections.
	if _, err := pgfence.Exec(ctx, app, pgfence.LeaseOf("acct:1", "", l.Token()-1), `SELECT 1`); !errors.Is(err, pgfence.ErrStaleToken) {
		t.Fatalf("app: stale write: want ErrStaleToken, got %v", err)
	}
	var rejections int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM pgfence.fence_rejections WHERE resource = 'acct:1' AND presented_token = $1`, l.Token()-1).Scan(&rejections); err != nil || rejections != 1 {
		t.Fatalf("app: recorded rejections = %d, %v; want 1", rejections, err)
	}
	// A write outside the protocol is still refused by the guard.
	if _, err := app.Exec(ctx, `UPDATE acct SET balance = 0 WHERE id = 2`); !errors.Is(pgfence.MapError(err), pgfence.ErrUnfencedWrite) {
		t.Errorf("app: unfenced write: want PF006, got %v", err)
	}

	// No direct write on any pgfence table: no token, fence or floor can be
	// minted, moved or lowered, no lease or history row forged or erased.
	for _, q := range []string{
		`INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at) VALUES ('x', gen_random_uuid(), 1, now(), now() + interval '1 h')`,
		`UPDATE pgfence.leases SET expires_at = clock_timestamp() + interval '1 day'`,
		`UPDATE pgfence.leases SET token = token + 1000`,
		`DELETE FROM pgfence.leases`,
		`INSERT INTO pgfence.fences (resource, token) VALUES ('acct:2', 9223372036854775807)`,
		`UPDATE pgfence.fences SET token = 1`,
		`UPDATE pgfence.fences SET fenced_xid = pg_current_xact_id()`,
		`DELETE FROM pgfence.fences`,
		`TRUNCATE pgfence.fences`,
		`UPDATE pgfence.token_floor SET floor = 0`,
		`DELETE FROM pgfence.token_floor`,
		`INSERT INTO pgfence.lease_events (key, event, holder, token) VALUES ('x', 'acquired', gen_random_uuid(), 1)`,
		`DELETE FROM pgfence.lease_events`,
		`DELETE FROM pgfence.idempotency_keys`,
		`UPDATE pgfence.idempotency_keys SET status = 'in_progress'`,
		`DELETE FROM pgfence.lease_waiters`,
		`INSERT INTO pgfence.grant_pauses (prefix, reason) VALUES ('', 'x')`,
		`DELETE FROM pgfence.grant_pauses`,
		`DELETE FROM pgfence.fence_rejections`,
		`SELECT pgfence.prune_fence_rejections(interval '0')`,
		// Operator functions.
		`SELECT pgfence.raise_token_floor(0, 'lower it')`,
		`SELECT pgfence.raise_token_floor(9000000000000000000, 'exhaust it')`,
		`SELECT * FROM pgfence.force_release('acct:1', 'steal it')`,
		`SELECT pgfence.pause_grants('', 'stop everyone')`,
		`SELECT pgfence.resume_grants('')`,
		`SELECT pgfence.prune_lease_events(NULL, 0)`,
		`SELECT pgfence.idempotency_gc(10)`,
		`SELECT pgfence.next_token(NULL)`,
		// The guard of a table the application does not own.
		`SELECT pgfence.unprotect('acct')`,
		`SELECT pgfence.protect('acct', 'id', 'other:')`,
		`DROP TRIGGER pgfence_guard ON acct`,
		`ALTER TABLE acct DISABLE TRIGGER pgfence_guard`,
		`ALTER TABLE acct DISABLE TRIGGER ALL`,
		`SET session_replication_role = replica`,
		`TRUNCATE acct`,
	} {
		_, err := app.Exec(ctx, q)
		denied(t, "app: "+q, err)
	}
	if _, err := lc.ForceRelease(ctx, "acct:1", "steal it"); pgerr.Code(err) != codeInsufficientPrivilege {
		t.Errorf("app: ForceRelease: want 42501, got %v", err)
	}
	if _, err := lc.PauseGrants(ctx, "acct:", "stop"); pgerr.Code(err) != codeInsufficientPrivilege {
		t.Errorf("app: PauseGrants: want 42501, got %v", err)
	}
	if _, err := gcStore.GC(ctx, app, nil); pgerr.Code(err) != codeInsufficientPrivilege {
		t.Errorf("app: idempotency GC: want 42501, got %v", err)
	}

	// A hostile search_path changes nothing inside the functions.
	mustExecPool(t, owner, `CREATE SCHEMA evil AUTHORIZATION `+pgx.Identifier{appName}.Sanitize())
	mustExecPool(t, app, `CREATE FUNCTION evil.gen_random_uuid() RETURNS uuid LANGUAGE sql AS $$ SELECT '00000000-0000-4000-8000-000000000001'::uuid $$`)
	mustExecPool(t, app, `CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT timestamptz '2000-01-01' $$`)
	mustExecPool(t, app, `CREATE TABLE evil.leases (LIKE pgfence.leases)`)
	conn, err := app.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET search_path = evil, pg_catalog, pgfence`); err != nil {
		t.Fatal(err)
	}
	var holder string
	var expires time.Time
	if err := conn.QueryRow(ctx, `SELECT holder::text, expires_at FROM pgfence.try_acquire('hostile', interval '1 minute')`).Scan(&holder, &expires); err != nil {
		t.Fatalf("app: try_acquire under a hostile search_path: %v", err)
	}
	conn.Release()
	if holder == "00000000-0000-4000-8000-000000000001" || expires.Year() < 2020 {
		t.Errorf("try_acquire used the caller's functions: holder %s, expires %s", holder, expires)
	}

	// The operator role runs the operations, and reads the schema version
	// (pgfence doctor, migrate status) without the CREATE privilege.
	m, err := migrations.New(op, nil)
	if err != nil {
		t.Fatal(err)
	}
	if current, latest, err := m.Version(ctx); err != nil || current != latest {
		t.Fatalf("operator: schema version = %d of %d, %v", current, latest, err)
	}
	_ = m.Close()
	oc, err := leases.New(op, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	if fr, err := oc.ForceRelease(ctx, "acct:1", "incident 42"); err != nil || !fr.Released {
		t.Fatalf("operator: ForceRelease = %+v, %v", fr, err)
	}
	if _, err := op.Exec(ctx, `SELECT pgfence.raise_token_floor(pgfence.max_stored_token() + 10, 'restore drill')`); err != nil {
		t.Fatalf("operator: raise_token_floor: %v", err)
	}
	if _, err := op.Exec(ctx, `SELECT pgfence.raise_token_floor(0, 'lower it')`); !errors.Is(pgfence.MapError(err), pgfence.ErrFloorLowered) {
		t.Errorf("operator: lowering the floor: want PF009, got %v", err)
	}
	if _, err := oc.PauseGrants(ctx, "acct:", "rollout"); err != nil {
		t.Fatalf("operator: PauseGrants: %v", err)
	}
	if _, err := oc.ResumeGrants(ctx, "acct:", ""); err != nil {
		t.Fatalf("operator: ResumeGrants: %v", err)
	}
	if _, err := gcStore.GC(ctx, op, nil); err != nil {
		t.Fatalf("operator: idempotency GC: %v", err)
	}
	// protect checks the caller's own rights on the table: an operator
	// protects the tables it owns, not the owner's.
	mustExecPool(t, owner, `CREATE SCHEMA `+pgx.Identifier{opName}.Sanitize()+` AUTHORIZATION `+pgx.Identifier{opName}.Sanitize())
	mustExecPool(t, op, `CREATE TABLE `+pgx.Identifier{opName}.Sanitize()+`.jobs (id int PRIMARY KEY)`)
	if err := pgfence.Protect(ctx, op, pgx.Identifier{opName, "jobs"}, "id", "job:"); err != nil {
		t.Fatalf("operator: protect its own table: %v", err)
	}
	if _, err := op.Exec(ctx, `SELECT pgfence.unprotect('acct')`); pgerr.Code(err) != codeInsufficientPrivilege {
		t.Errorf("operator: unprotect a table it does not own: want 42501, got %v", err)
	}
	// Fence rows stay monotone for the operator too: no direct writes.
	_, err = op.Exec(ctx, `UPDATE pgfence.fences SET token = 1`)
	denied(t, "operator: lower a fence", err)
}

// TestPrivilegeCatalog checks the grants in the catalog, so that a function
// or table added by a later migration cannot silently widen them.
func TestPrivilegeCatalog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgfencetest.NewPool(t)

	rows, err := pool.Query(ctx, `
		SELECT p.oid::regprocedure::text
		  FROM pg_proc p
		 WHERE p.pronamespace = 'pgfence'::regnamespace
		   AND has_function_privilege('public', p.oid, 'EXECUTE')
		 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	public, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(public) > 0 {
		t.Errorf("functions executable by PUBLIC: %v", public)
	}

	// Every SECURITY DEFINER function pins its search_path.
	rows, err = pool.Query(ctx, `
		SELECT p.oid::regprocedure::text
		  FROM pg_proc p
		 WHERE p.pronamespace = 'pgfence'::regnamespace AND p.prosecdef
		   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
		 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	unpinned, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(unpinned) > 0 {
		t.Errorf("SECURITY DEFINER functions without search_path = pg_catalog, pg_temp: %v", unpinned)
	}

	// Neither role may write any pgfence table directly.
	for _, role := range []string{"pgfence_app", "pgfence_operator"} {
		rows, err = pool.Query(ctx, `
			SELECT c.relname || ' ' || priv
			  FROM pg_class c
			 CROSS JOIN unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS priv
			 WHERE c.relnamespace = 'pgfence'::regnamespace AND c.relkind IN ('r', 'v', 'p')
			   AND has_table_privilege($1, c.oid, priv)
			 ORDER BY 1`, role)
		if err != nil {
			t.Fatal(err)
		}
		writable, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(writable) > 0 {
			t.Errorf("%s may write pgfence tables directly: %v", role, writable)
		}
	}

	// The secret renewal announcements are signed with is nobody's to read:
	// whoever reads it can sign any key's announcements.
	for _, role := range []string{"pgfence_app", "pgfence_operator"} {
		var readable bool
		if err := pool.QueryRow(ctx, `SELECT has_table_privilege($1, 'pgfence.announce_secret', 'SELECT')`, role).Scan(&readable); err != nil {
			t.Fatal(err)
		}
		if readable {
			t.Errorf("%s may read pgfence.announce_secret", role)
		}
	}

	// The application role has exactly the protocol, not the operations.
	for _, fn := range []string{
		"pgfence.force_release(text,text)", "pgfence.raise_token_floor(bigint,text)",
		"pgfence.protect(regclass,text,text)", "pgfence.unprotect(regclass)",
		"pgfence.pause_grants(text,text)", "pgfence.resume_grants(text,text)",
		"pgfence.idempotency_gc(integer)", "pgfence.prune_lease_events(text,integer)",
		"pgfence.prune_fence_rejections(interval)",
	} {
		var app, op bool
		if err := pool.QueryRow(ctx, `SELECT has_function_privilege('pgfence_app', $1, 'EXECUTE'), has_function_privilege('pgfence_operator', $1, 'EXECUTE')`, fn).Scan(&app, &op); err != nil {
			t.Fatal(err)
		}
		if app || !op {
			t.Errorf("%s: pgfence_app may execute: %v (want false), pgfence_operator: %v (want true)", fn, app, op)
		}
	}

	// Each role executes exactly its list, nothing more: a function a
	// migration grants, or forgets to revoke from a role, shows here.
	protocol := []string{
		"pgfence.abandon_fence(text,uuid)",
		"pgfence.abandon_grant(text,uuid)",
		"pgfence.acquire(text,interval,text,uuid,text)",
		"pgfence.announce_key(text)",
		"pgfence.announce_renewal(text,uuid,bigint)",
		"pgfence.check_lease(text,uuid,bigint)",
		"pgfence.current_trace_id()",
		"pgfence.fence(text,bigint,uuid)",
		"pgfence.fence_probe(text)",
		"pgfence.grant_probe(text,uuid)",
		"pgfence.idempotency_advance(text,text,uuid,text,bytea,interval)",
		"pgfence.idempotency_claim(text,text,bytea,interval,interval,interval)",
		"pgfence.idempotency_claim_atomic(text,text,bytea,interval,interval)",
		"pgfence.idempotency_claim_atomic_new(text,text,bytea,interval,interval)",
		"pgfence.idempotency_complete(text,text,uuid,bytea,text,text)",
		"pgfence.idempotency_complete_atomic(text,text,bytea,text,text)",
		"pgfence.idempotency_heartbeat(text,text,uuid,interval)",
		"pgfence.idempotency_release(text,text,uuid)",
		"pgfence.job_slot_begin(text,uuid,bigint,text,boolean)",
		"pgfence.job_slot_complete(text,uuid,bigint,text)",
		"pgfence.job_slot_missed(text,uuid,bigint,timestamp with time zone,interval)",
		"pgfence.job_slot_save(text,uuid,bigint,text,text)",
		"pgfence.lease_max_ttl()",
		"pgfence.lease_queue_leave(text,uuid)",
		"pgfence.lease_queue_turn(text,uuid,interval)",
		"pgfence.max_token()",
		"pgfence.may_use(text)",
		"pgfence.may_use_under(text)",
		"pgfence.protected_tables()",
		"pgfence.record_fence_rejection(text,bigint,bigint,text,text,text,uuid,text)",
		"pgfence.release(text,uuid,bigint,boolean)",
		"pgfence.renew(text,uuid,bigint,interval)",
		"pgfence.set_holder_info(text,uuid,bigint,text)",
		"pgfence.task_claim(text,uuid,bigint,integer,integer,boolean)",
		"pgfence.task_complete(text,uuid,bigint,bigint[],jsonb[])",
		"pgfence.task_enqueue(text,jsonb,text,integer)",
		"pgfence.task_fail(text,uuid,bigint,bigint,text,interval)",
		"pgfence.task_lease_key(text)",
		"pgfence.task_ready_keys(text,integer,text)",
		"pgfence.task_status(bigint)",
		"pgfence.try_acquire(text,interval,text,uuid,text,boolean)",
	}
	operations := []string{
		"pgfence.advance_retention()",
		"pgfence.force_release(text,text)",
		"pgfence.grant_prefix(regrole,text)",
		"pgfence.guard()",
		"pgfence.idempotency_gc(integer)",
		"pgfence.lower_fence(text,bigint,text)",
		"pgfence.max_stored_token()",
		"pgfence.next_token(bigint)",
		"pgfence.pause_grants(text,text)",
		"pgfence.protect(regclass,text,text)",
		"pgfence.prune_fence_rejections(interval)",
		"pgfence.prune_lease_events(text,integer)",
		"pgfence.prune_retired(integer)",
		"pgfence.prune_tasks(interval,integer)",
		"pgfence.raise_token_floor(bigint,text)",
		"pgfence.reject_truncate()",
		"pgfence.resume_grants(text,text)",
		"pgfence.revoke_prefix(regrole,text)",
		"pgfence.task_retry(bigint,text)",
		"pgfence.task_skip(bigint,text)",
		"pgfence.token_epoch()",
		"pgfence.unprotect(regclass)",
	}
	for role, want := range map[string][]string{
		"pgfence_app":      protocol,
		"pgfence_operator": append(slices.Clone(protocol), operations...),
	} {
		rows, err := pool.Query(ctx, `
			SELECT replace(p.oid::regprocedure::text, ', ', ',')
			  FROM pg_proc p
			 WHERE p.pronamespace = 'pgfence'::regnamespace AND has_function_privilege($1, p.oid, 'EXECUTE')`, role)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s may execute\n  %v\nwant exactly\n  %v", role, got, want)
		}
	}
}

func mustExecPool(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// gcStore runs idempotency GC with the defaults.
var gcStore = func() *idempotency.Store {
	s, err := idempotency.NewStore(nil)
	if err != nil {
		panic(err)
	}
	return s
}()
