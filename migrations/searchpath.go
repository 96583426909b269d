package migrations

// searchPathPin is the first statement of every script and comes early in
// the migrator's own transactions: for the rest of the transaction, every name that is
// not schema-qualified resolves in pg_catalog only, so that no object of
// another schema (say, public, which the database owner controls) is
// picked up by a column default, a constraint or a statement of a migration
// run as the migrating role.
const searchPathPin = `SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);`
