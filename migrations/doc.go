// Package migrations installs and upgrades the pgfence schema.
//
// The schema is a set of plain goose SQL files embedded in the binary ([FS]):
// every object lives in the PostgreSQL schema "pgfence", including goose's
// version table ([VersionTable]) and the migration lock ([LockTable]). A
// [Migrator] applies them with goose's Provider API, the global registry
// disabled and a lock of its own, so it never touches the host
// application's goose migrations and never waits for them.
//
// [New] takes a pgx pool, [NewDB] a *sql.DB of any PostgreSQL driver (lib/pq,
// pgx's stdlib); both run the same migrator, on database/sql. Teams that run
// their own goose migrations on the same database run a Migrator first, then
// their provider: the version tables and the locks are separate, neither
// waits for the other, and their migrations may then use pgfence (the
// package README shows it). They must not copy these files into their own
// migrations: their provider would record them in its table and skip the
// checks and the lock.
//
// Teams that apply SQL with another tool read the files from [FS] or print
// one script with [Script] (`pgfence migrate sql`). A script
// records each step in [VersionTable] as a Migrator does, so a Migrator (and
// `pgfence migrate status`, `pgfence doctor`) sees what it applied, and it
// refuses to run on a schema at another version than the one it starts from.
//
// Status and Version only read, in one read-only transaction: they
// take no lock, create nothing, and on a database without pgfence they report
// version 0 and every migration pending. DownTo on such a database does
// nothing.
//
// # Who owns the schema
//
// pgfence's SECURITY DEFINER functions run with the rights of the migrating
// role and use every object of schema pgfence, so the migrating role must own
// the schema and everything in it. Before they change anything, Up and
// DownTo refuse ([*UntrustedError]) a schema pgfence that another role owns
// or holds anything of, CREATE on it or write and TRIGGER privileges on its
// tables for other roles, default privileges that would grant those on what
// the migrations create, pgfence roles with LOGIN or another attribute or
// membership, and a search_path that puts a schema before pg_catalog. The
// first migration runs the same check in SQL, and a script from [Script]
// runs it first, so other tools refuse the same databases. Every migration
// runs with search_path pinned to pg_catalog, pg_temp.
//
// # The migration lock
//
// Up and DownTo hold the migration lock: the one row of [LockTable], taken
// with an INSERT … ON CONFLICT DO UPDATE that succeeds only when there is no
// row or its lease lapsed by the database clock, renewed every 10 seconds (its lease is 30 seconds)
// and deleted at the end. No statement relies on session state, so
// migrations run through a transaction-mode pooler such as PgBouncer. The
// table is its owner's alone: no other role can take or hold the lock, and
// advisory locks play no part. A waiting run polls with backoff for at most
// [Config.LockTimeout] and while its context lasts, then returns a
// [*LockedError] naming the holder. A crashed migrator's lock lapses after
// 30 seconds; to clear one at once, make sure the process it names no
// longer runs and delete the row.
//
// # Roles and privileges
//
// The first migration creates (if absent) the NOLOGIN group roles
// pgfence_app and pgfence_operator; every migration revokes the privileges
// on its objects from PUBLIC and grants each role its list: pgfence_app runs
// the protocol functions and reads the pgfence tables, pgfence_operator may
// also force-release, raise the token floor, protect and unprotect the
// tables it owns, pause and resume grants, prune the lease history and the
// rejection audit, and collect idempotency keys. Neither may INSERT, UPDATE,
// DELETE or TRUNCATE a pgfence table: the functions that write them are
// SECURITY DEFINER with search_path = pg_catalog, pg_temp. Creating the roles
// needs CREATEROLE the first time in a cluster; rolling back revokes the
// privileges in this database but keeps the roles, which other databases of
// the cluster may use. Grant the roles to your own login roles:
//
//	GRANT pgfence_app TO orders_service;
//	GRANT pgfence_operator TO orders_owner;
//
// A migration that adds a pgfence function must grant EXECUTE on it
// explicitly (functions are created executable by PUBLIC, so it must revoke
// that too); a test fails otherwise.
//
// # Guarantees
//
//   - Several processes may run [Migrator.Up] on the same database at once,
//     directly or through PgBouncer in transaction mode: one applies each
//     migration, the others wait for the migration lock and find nothing left
//     to do.
//   - A migration commits only while its run holds the migration lock: in
//     its transaction, before goose records it, the run locks the lock row
//     and checks that it is still its own. A run that was paused past its
//     lease and taken over rolls back instead ([ErrLockLost]).
//   - Waiting for the lock is bounded ([Config.LockTimeout], the context).
//   - Nothing is installed into, or rolled back in, a schema another role
//     controls ([ErrUntrusted]).
//   - Every migration runs in its own transaction: a failure leaves the schema
//     at the last complete version.
//   - A binary never migrates, or rolls back, a schema that records a
//     migration it does not know (a newer build's, or one from before the
//     first release): it returns [ErrSchemaTooNew].
//
// # Failure handling
//
// Errors of a Migrator from [New] name the database's host:port when the
// server never answered. A
// broken connection during Up leaves the schema at the last committed
// migration; run Up again. [Migrator.Up] returns the migrations it applied
// before the error. A run that cannot take the migration lock in time
// returns a [*LockedError] ([ErrLocked]); one that loses it while running
// returns [ErrLockLost] after its migration in progress rolled back. A
// release that fails is logged, not returned: the lock lapses after
// 30 seconds.
package migrations
