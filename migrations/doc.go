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
// them with [SQL] (`pgfence migrate sql`).
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
//
// # Failure handling
//
// Errors name the database's host:port when the server never answered. A
// broken connection during Up leaves the schema at the last committed
// migration; run Up again. [Migrator.Up] returns the migrations it applied
// before the error.
package migrations
