// Package migrations installs and upgrades the pgfence schema.
//
// The schema is a set of plain goose SQL files embedded in the binary ([FS]):
// every object lives in the PostgreSQL schema "pgfence", including goose's
// version table ([VersionTable]). A [Migrator] applies them with goose's
// Provider API, the global registry disabled and an advisory lock of its own
// ([LockID]), so it never touches the host application's goose migrations and
// never waits for them.
//
// Teams that apply SQL with another tool read the files from [FS] or print
// one script with [SQL] or [Script] (`pgfence migrate sql`). A script
// records each step in [VersionTable] as a Migrator does, so a Migrator (and
// `pgfence migrate status`, `pgfence doctor`) sees what it applied, and it
// refuses to run on a schema at another version than the one it starts from.
//
// Status, Version and DownTo read the schema without creating anything: on a
// database without pgfence they report version 0 and every migration pending.
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
//   - Several processes may run [Migrator.Up] on the same database at once: one
//     applies each migration, the others wait on the advisory lock and find
//     nothing left to do.
//   - Every migration runs in its own transaction: a failure leaves the schema
//     at the last complete version.
//   - A binary never migrates, or rolls back, a schema newer than itself: it
//     returns [ErrSchemaTooNew].
//   - Nor a schema that a pre-release build of pgfence installed, whose
//     migrations the current ones replaced: it returns [ErrPreReleaseSchema].
//
// # Failure handling
//
// Errors name the database's host:port when the server never answered. A
// broken connection during Up leaves the schema at the last committed
// migration; run Up again. [Migrator.Up] returns the migrations it applied
// before the error.
package migrations
