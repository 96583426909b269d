package migrations

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// Only the migrations: schema.sql, next to them, is a dump of the schema
// they produce, for reading, never for applying.
//
//go:embed [0-9]*.sql
var files embed.FS

// FS holds the plain goose SQL migrations (NNNNN_name.sql, each with an Up and a
// Down section). Teams that apply SQL with another tool can read the files from
// here, or print them with `pgfence migrate sql`.
var FS fs.FS = files

const (
	// Schema is the PostgreSQL schema that holds every pgfence object.
	Schema = "pgfence"

	// VersionTable is goose's version table, kept inside [Schema] so that it never
	// collides with the host application's own goose_db_version.
	VersionTable = Schema + ".goose_db_version"
)

// ErrSchemaTooNew is returned when the database's pgfence schema records a
// migration this build does not know: a newer pgfence migrated it (upgrade
// the binary), or a build from before the first release did (its
// migrations were replaced; export the rows you need, DROP SCHEMA pgfence
// CASCADE, and migrate again).
var ErrSchemaTooNew = errors.New("migrations: the database schema records a migration this pgfence build does not know")

// Config configures a [Migrator]. A nil *Config and the zero value use the
// defaults.
type Config struct {
	// Logger receives one event per applied migration, and the waits for
	// the migration lock. Default: discard.
	Logger *slog.Logger

	// LockTimeout bounds how long Up and DownTo wait for the migration lock
	// that another migration holds; they then return a [*LockedError] that
	// names the holder. The caller's context bounds the wait too. Zero means
	// 5 minutes; negative is an error.
	LockTimeout time.Duration
}

// Migrator applies the embedded migrations to one database. It is safe for
// concurrent use, and several processes may migrate the same database at
// once, directly or through a transaction-mode pooler such as PgBouncer: a
// run holds the migration lock, a row of [LockTable] with a lease that it
// renews while it runs.
type Migrator struct {
	db          *sql.DB
	ownDB       bool // db was opened by New; Close closes it
	provider    *goose.Provider
	addr        string // host:port, named in connection errors; "" when unknown
	logger      *slog.Logger
	lockTimeout time.Duration

	// What the lock row records of this migrator.
	host        string
	pid         int
	application string
}

// New returns a Migrator on pool. Close it when done; the pool stays open.
// The pool needs room for two connections (MaxConns >= 2): one runs the
// migrations while the other renews the migration lock.
func New(pool *pgxpool.Pool, cfg *Config) (*Migrator, error) {
	if pool == nil {
		return nil, errors.New("migrations: pool is nil")
	}
	if n := pool.Config().MaxConns; n < 2 {
		return nil, fmt.Errorf("migrations: the pool allows %d connection(s) (MaxConns); a Migrator needs 2: one runs the migrations while the other renews the migration lock", n)
	}
	cc := pool.Config().ConnConfig
	db := stdlib.OpenDBFromPool(pool)
	m, err := newMigrator(db, cfg, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), cc.RuntimeParams["application_name"])
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	m.ownDB = true
	return m, nil
}

// NewDB returns a Migrator on db, a database/sql pool of any PostgreSQL
// driver (lib/pq, pgx's stdlib): for services whose handle is a *sql.DB, and
// for teams that run their own goose migrations on it (pgfence's version
// table and lock are its own, see the package documentation). Close it when
// done; db stays open. db needs room for two connections (SetMaxOpenConns
// of 0, unlimited, or at least 2): one runs the migrations while the other
// renews the migration lock.
func NewDB(db *sql.DB, cfg *Config) (*Migrator, error) {
	if db == nil {
		return nil, errors.New("migrations: db is nil")
	}
	if n := db.Stats().MaxOpenConnections; n == 1 {
		return nil, errors.New("migrations: the *sql.DB allows 1 connection (SetMaxOpenConns); a Migrator needs 2: one runs the migrations while the other renews the migration lock")
	}
	return newMigrator(db, cfg, "", "")
}

// newMigrator returns a Migrator on db; addr (host:port) and application
// name the migrator where they are known.
func newMigrator(db *sql.DB, cfg *Config, addr, application string) (*Migrator, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if cfg.LockTimeout < 0 {
		return nil, fmt.Errorf("migrations: Config.LockTimeout: must be >= 0 (0 means %s), got %s", lockTimeoutDefault, cfg.LockTimeout)
	}
	if maxLock := math.MaxInt32 * time.Millisecond; cfg.LockTimeout > maxLock {
		// Up and DownTo set it as lock_timeout, whose largest value this is:
		// PostgreSQL would refuse every run.
		return nil, fmt.Errorf("migrations: Config.LockTimeout: must be at most %s (lock_timeout's largest value), got %s", maxLock, cfg.LockTimeout)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	store, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	// No goose locker: Up and DownTo take the migration lock themselves,
	// before goose runs, and the store's fence checks it in each
	// migration's transaction.
	provider, err := goose.NewProvider("", db, files,
		goose.WithStore(fencedStore{store}),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(logger),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	host, pid, application := lockIdentity(application)
	return &Migrator{
		db: db, provider: provider, addr: addr, logger: logger,
		lockTimeout: cmp.Or(cfg.LockTimeout, lockTimeoutDefault),
		host:        host, pid: pid, application: application,
	}, nil
}

// Up applies every pending migration to the database of pool: the one call an
// application makes at start-up (open a pool, migrate). It is New, Migrator.Up
// and Close; use a [Migrator] for status, rollbacks or a logger.
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := New(pool, nil)
	if err != nil {
		return err
	}
	defer m.Close()
	_, err = m.Up(ctx)
	return err
}

// Close releases the database/sql handle New opened on the pgx pool; the
// pool stays open. A Migrator of NewDB leaves its *sql.DB open.
func (m *Migrator) Close() error {
	if !m.ownDB {
		return nil
	}
	return m.db.Close()
}

// Result is one migration applied or rolled back.
type Result struct {
	Version   int64
	Name      string
	Direction string // "up" or "down"
	Duration  time.Duration
}

func results(rs []*goose.MigrationResult) []Result {
	out := make([]Result, 0, len(rs))
	for _, r := range rs {
		if r == nil {
			continue
		}
		out = append(out, Result{
			Version:   r.Source.Version,
			Name:      sourceName(r.Source.Path),
			Direction: string(r.Direction),
			Duration:  r.Duration,
		})
	}
	return out
}

// Up applies every pending migration. It is a no-op on an up-to-date schema.
//
// It first checks that the migrating role owns schema pgfence and
// everything in it and that the pgfence roles are plain groups
// ([*UntrustedError] otherwise, before it changes anything), then takes the
// migration lock, waiting at most [Config.LockTimeout] ([*LockedError]).
func (m *Migrator) Up(ctx context.Context) ([]Result, error) {
	return m.migrate(ctx, true, func(ctx context.Context) ([]*goose.MigrationResult, error) {
		return m.provider.Up(ctx)
	})
}

// DownTo rolls back every applied migration above version; DownTo(ctx, 0)
// removes every pgfence object but the schema, its version table and the
// migration lock's table. On a database without the version table it does
// nothing and creates nothing. It checks and locks as Up does.
func (m *Migrator) DownTo(ctx context.Context, version int64) ([]Result, error) {
	if version < 0 {
		return nil, fmt.Errorf("migrations: version %d: must be >= 0", version)
	}
	if version != 0 && !slices.Contains(Versions(), version) {
		return nil, fmt.Errorf("migrations: version %d: not a pgfence migration (want 0 or one of %v)", version, Versions())
	}
	return m.migrate(ctx, false, func(ctx context.Context) ([]*goose.MigrationResult, error) {
		return m.provider.DownTo(ctx, version)
	})
}

// migrate runs apply (goose's Up or DownTo) under the migration lock, after
// the checks.
func (m *Migrator) migrate(ctx context.Context, up bool, apply func(context.Context) ([]*goose.MigrationResult, error)) ([]Result, error) {
	installed, err := m.prepare(ctx, up)
	if err != nil {
		return nil, m.wrap(err)
	}
	if !up && !installed {
		return nil, nil
	}
	held, runCtx, err := m.lock(ctx)
	if err != nil {
		return nil, m.wrap(err)
	}
	defer held.release(ctx)
	// Again under the lock: another build may have migrated meanwhile.
	if _, err := m.prepare(runCtx, false); err != nil {
		return nil, m.wrap(err)
	}
	rs, err := apply(runCtx)
	if err != nil {
		if errors.Is(context.Cause(runCtx), ErrLockLost) && !errors.Is(err, ErrLockLost) {
			err = fmt.Errorf("%w: %w", ErrLockLost, err)
		}
		return results(partial(err)), m.wrap(err)
	}
	return results(rs), nil
}

// Status is the state of one known migration.
type Status struct {
	Version   int64
	Name      string
	Applied   bool
	AppliedAt time.Time // zero when pending
}

// Status reports every migration this binary knows and whether it is applied.
// It reads the version table in one read-only transaction, takes no lock and
// creates nothing: on a database without the version table every migration
// is pending.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	st, err := m.read(ctx, true)
	if err != nil {
		return nil, m.wrap(err)
	}
	var out []Status
	for _, src := range m.provider.ListSources() {
		s := Status{Version: src.Version, Name: sourceName(src.Path)}
		if at, ok := st.applied[src.Version]; ok {
			s.Applied, s.AppliedAt = true, at.UTC()
		}
		out = append(out, s)
	}
	return out, nil
}

// Version returns the applied schema version (0 for none) and the newest version
// this binary knows. It returns [ErrSchemaTooNew] when the database is ahead.
// It takes no lock and creates nothing: a database without the version table
// is at version 0.
func (m *Migrator) Version(ctx context.Context) (current, latest int64, err error) {
	st, err := m.read(ctx, false)
	if err != nil {
		return st.newest, Latest(), m.wrap(err)
	}
	return st.newest, Latest(), nil
}

// schemaState is what the version table says.
type schemaState struct {
	installed bool                // the version table exists
	newest    int64               // the highest applied version, 0 for none
	applied   map[int64]time.Time // applied versions (read with applied only)
}

// read reads the version table in one read-only transaction, without any
// lock, and refuses a schema that records a version this build does not
// know ([ErrSchemaTooNew]). It writes
// nothing and needs no privilege but SELECT on the version table, so a
// role without CREATE on the database reads "not installed".
func (m *Migrator) read(ctx context.Context, applied bool) (st schemaState, err error) {
	tx, err := m.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return st, err
	}
	defer func() { _ = tx.Rollback() }()
	if st, err = readVersions(ctx, tx); err != nil || !st.installed || !applied {
		return st, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT v.version_id, pg_catalog.max(v.tstamp) FROM `+VersionTable+` v
		 WHERE v.version_id OPERATOR(pg_catalog.>) 0 GROUP BY v.version_id`)
	if err != nil {
		return st, err
	}
	defer rows.Close()
	st.applied = map[int64]time.Time{}
	for rows.Next() {
		var v int64
		var at time.Time
		if err := rows.Scan(&v, &at); err != nil {
			return st, err
		}
		st.applied[v] = at
	}
	if err := rows.Err(); err != nil {
		return st, err
	}
	return st, tx.Commit()
}

// readVersions reads whether the version table exists and its highest
// applied version, and refuses a schema that records a version this build
// does not know.
func readVersions(ctx context.Context, tx *sql.Tx) (st schemaState, err error) {
	if err := tx.QueryRowContext(ctx, `SELECT pg_catalog.to_regclass($1) IS NOT NULL`, VersionTable).Scan(&st.installed); err != nil || !st.installed {
		return st, err
	}
	var unknown int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(pg_catalog.max(version_id) FILTER (WHERE is_applied), 0),
	        COALESCE(pg_catalog.max(version_id) FILTER (WHERE is_applied AND version_id OPERATOR(pg_catalog.<>) ALL ($1::pg_catalog.text::pg_catalog.int8[])), 0)
	   FROM `+VersionTable, knownVersions()).Scan(&st.newest, &unknown); err != nil {
		return st, err
	}
	switch {
	case unknown > Latest():
		return st, fmt.Errorf("%w: database is at version %d, this build knows up to %d; upgrade pgfence", ErrSchemaTooNew, unknown, Latest())
	case unknown > 0:
		return st, fmt.Errorf("%w: it records version %d, which a build from before the first release used; export the rows you need, DROP SCHEMA %s CASCADE, and migrate again", ErrSchemaTooNew, unknown, Schema)
	}
	return st, nil
}

// knownVersions is Versions and 0 as a PostgreSQL array literal.
func knownVersions() string {
	var b strings.Builder
	b.WriteString("{0")
	for _, v := range Versions() {
		fmt.Fprintf(&b, ",%d", v)
	}
	return b.String() + "}"
}

// prepare readies a run of Up (create) or DownTo, in one transaction:
//
//   - it refuses, before it writes anything, a database the migrating role
//     cannot trust ([checkTrust], an [*UntrustedError]);
//   - with create it creates schema pgfence when missing, and when the
//     schema is installed or created it creates the lock table
//     ([LockTable]) when missing, then checks again what it created in;
//   - it refuses a schema that records a version this build does not know.
//
// It reports whether goose's version table exists. DownTo does nothing on a
// database without it, and leaves nothing behind: goose would create its
// table on any call. Concurrent first runs race on CREATE ... IF NOT EXISTS,
// which then fails with a unique violation: prepare tries again. Waiting for
// another transaction that creates them ends after LockTimeout with a
// [*LockedError].
func (m *Migrator) prepare(ctx context.Context, create bool) (installed bool, err error) {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		installed, err = m.prepareOnce(ctx, create)
		switch pgerr.Code(err) {
		case "23505", "42P06", "42P07", "42710": // unique_violation, duplicate_schema, _table, _object
			if attempt < 5 {
				continue
			}
		case "55P03": // lock_not_available: lock_timeout
			return false, &LockedError{Waited: time.Since(start), Err: ctx.Err()}
		}
		return installed, err
	}
}

func (m *Migrator) prepareOnce(ctx context.Context, create bool) (bool, error) {
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	// Creating the schema or the lock table waits for another transaction
	// that is creating them (a script, another migrator): as long as the
	// lock, at most.
	if _, err := tx.ExecContext(ctx, `SELECT pg_catalog.set_config('lock_timeout', $1, true)`,
		strconv.FormatInt(max(m.lockTimeout.Milliseconds(), 1), 10)); err != nil {
		return false, err
	}
	if err := checkTrust(ctx, tx); err != nil { // before the pin: it reads the session's search_path
		return false, err
	}
	if _, err := tx.ExecContext(ctx, searchPathPin); err != nil {
		return false, err
	}
	var schemaExists, lockExists bool
	if err := tx.QueryRowContext(ctx, `SELECT pg_catalog.to_regnamespace($1) IS NOT NULL, pg_catalog.to_regclass($2) IS NOT NULL`,
		Schema, LockTable).Scan(&schemaExists, &lockExists); err != nil {
		return false, err
	}
	st, err := readVersions(ctx, tx)
	if err != nil {
		return false, err
	}
	created := false
	if create && !schemaExists {
		// Only when it is missing: CREATE SCHEMA checks the CREATE privilege
		// on the database even with IF NOT EXISTS.
		if _, err := tx.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+Schema); err != nil {
			return false, err
		}
		schemaExists, created = true, true
	}
	if schemaExists && !lockExists && (create || st.installed) {
		if _, err := tx.ExecContext(ctx, lockTableDDL); err != nil {
			return false, err
		}
		created = true
	}
	if created {
		if err := checkTrust(ctx, tx); err != nil {
			return false, err
		}
	}
	return st.installed, tx.Commit()
}

func partial(err error) []*goose.MigrationResult {
	var pe *goose.PartialError
	if errors.As(err, &pe) {
		return pe.Applied
	}
	return nil
}

// wrap names the database's address when the server never answered, so
// "context deadline exceeded" says where it was waiting.
func (m *Migrator) wrap(err error) error {
	if errors.Is(err, ErrSchemaTooNew) || errors.Is(err, ErrUntrusted) ||
		errors.Is(err, ErrLocked) || errors.Is(err, ErrLockLost) {
		return err
	}
	if m.addr != "" && pgerr.Code(err) == "" && !strings.Contains(err.Error(), m.addr) {
		return fmt.Errorf("migrations: database at %s: %w", m.addr, err)
	}
	return fmt.Errorf("migrations: %w", err)
}

var migrationName = regexp.MustCompile(`^(\d+)_(.+)\.sql$`)

func sourceName(path string) string {
	base := path[strings.LastIndex(path, "/")+1:]
	if m := migrationName.FindStringSubmatch(base); m != nil {
		return m[2]
	}
	return base
}

// Latest returns the newest migration version embedded in this build.
func Latest() int64 {
	vs := Versions()
	return vs[len(vs)-1]
}

// Versions returns the migration versions embedded in this build, oldest
// first. They are not consecutive: versions 5 to 17 belong to builds from
// before the first release and are never used again.
func Versions() []int64 {
	var vs []int64
	for _, f := range names() {
		vs = append(vs, versionOf(f))
	}
	return vs
}

// versionOf is the version of a migration's file name.
func versionOf(name string) int64 {
	v, _ := strconv.ParseInt(migrationName.FindStringSubmatch(name)[1], 10, 64)
	return v
}

func names() []string {
	entries, _ := fs.ReadDir(files, ".")
	var out []string
	for _, e := range entries {
		if migrationName.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// versionTableDDL is the table goose's Provider creates for PostgreSQL
// (goose v3, internal/dialects/postgres.go), and the version-0 row it inserts
// with it. A script that installs pgfence creates them the same way, so that
// a Migrator, `pgfence migrate status` and `pgfence doctor` see what it
// applied and a later Up applies only newer migrations.
// searchPathPin is the first statement of every migration's Up and Down
// section (written in each file, so that it holds for a file applied by hand
// too) and of every script: for the rest of the transaction, every name that
// is not schema-qualified resolves in pg_catalog only, so that no object of
// another schema (say, public, which the database owner controls) is
// picked up by a column default, a constraint or a statement of a migration
// run as the migrating role.
const searchPathPin = `SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);`

const versionTableDDL = `CREATE SCHEMA IF NOT EXISTS ` + Schema + `;
CREATE TABLE IF NOT EXISTS ` + VersionTable + ` (
    id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
    version_id bigint NOT NULL,
    is_applied boolean NOT NULL,
    tstamp timestamp NOT NULL DEFAULT now()
);
INSERT INTO ` + VersionTable + ` (version_id, is_applied)
SELECT 0, true WHERE NOT EXISTS (SELECT 1 FROM ` + VersionTable + `);
`

// Script returns the plain SQL that moves a schema at version from to version
// to: the Up sections of the migrations above from up to to in version order
// when from < to, the Down sections of the migrations above to down from from
// in reverse order when from > to. Each version is 0 or a known migration.
// Like goose, the script records every step in [VersionTable] (an up script
// from 0 creates the table), and it starts by checking that the database is
// at version from, so that it fails cleanly on a schema at another version.
// Apply it in one transaction.
//
// The script first pins search_path to pg_catalog, pg_temp for its
// transaction, then refuses a database that the migrating role cannot
// trust, as [Migrator.Up] does ([UntrustedError] describes the rules), then
// takes the migration lock ([LockTable]) until it ends, so that it never
// runs at the same time as a Migrator or another script.
func Script(from, to int64) (string, error) {
	known := map[int64]string{0: ""}
	var ns []string
	for _, n := range names() {
		v := versionOf(n)
		known[v] = n
		if up := from <= to; (up && v > from && v <= to) || (!up && v > to && v <= from) {
			ns = append(ns, n)
		}
	}
	for _, v := range []int64{from, to} {
		if _, ok := known[v]; !ok {
			return "", fmt.Errorf("migrations: version %d: not a pgfence migration (want 0 or one of %v)", v, Versions())
		}
	}
	up := from <= to
	direction := "up"
	if !up {
		direction = "down"
		slices.Reverse(ns)
	}
	trust, err := trustSQL(trustBlockBegin, trustBlockEnd)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("-- For the rest of the transaction, names that are not schema-qualified\n-- resolve in pg_catalog only.\n")
	b.WriteString(searchPathPin + "\n\n")
	b.WriteString("-- Refuse a database where another role owns schema pgfence or anything in it,\n-- or where the pgfence roles are not plain NOLOGIN groups.\n")
	b.WriteString(trust + "\n\n")
	if up && from == 0 {
		b.WriteString("-- goose's version table, as `pgfence migrate up` creates it.\n")
		b.WriteString(versionTableDDL)
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, scriptLockSQL, VersionTable, from, lockTableDDL, LockTable, lockLease.Seconds())
	fmt.Fprintf(&b, `-- Refuse to run on a schema that is not at version %[1]d.
DO $pgfence$
DECLARE
    v_current bigint;
BEGIN
    SELECT coalesce(max(version_id), 0) INTO v_current FROM %[2]s;
    IF v_current <> %[1]d THEN
        RAISE EXCEPTION 'pgfence: the schema is at version %%, this script starts from version %[1]d', v_current
            USING HINT = CASE WHEN v_current = %[3]d
                              THEN 'The schema is already at version %[3]d, where this script ends: there is nothing to run.'
                              ELSE 'Generate a script from that version: pgfence migrate sql --direction '
                                   || CASE WHEN v_current > %[3]d THEN 'down' ELSE 'up' END
                                   || ' --from ' || v_current || ' --to %[3]d.' END;
    END IF;
END
$pgfence$;

`, from, VersionTable, to)
	for _, n := range ns {
		raw, err := fs.ReadFile(files, n)
		if err != nil {
			return "", err
		}
		v := versionOf(n)
		fmt.Fprintf(&b, "-- pgfence migration %s (%s)\n", n, direction)
		b.WriteString(section(string(raw), up))
		if up {
			fmt.Fprintf(&b, "INSERT INTO %s (version_id, is_applied) VALUES (%d, true);\n\n", VersionTable, v)
		} else {
			fmt.Fprintf(&b, "DELETE FROM %s WHERE version_id = %d;\n\n", VersionTable, v)
		}
	}
	fmt.Fprintf(&b, "-- Release the migration lock.\nDELETE FROM %s WHERE holder OPERATOR(pg_catalog.=) pg_catalog.current_setting('pgfence.migration_lock_holder')::pg_catalog.uuid;\n", LockTable)
	return b.String(), nil
}

// scriptLockSQL takes the migration lock for a script, as a Migrator does,
// so that a script and a Migrator never migrate at once: the row stays
// uncommitted until the script's transaction ends, and the script deletes
// it before then, so a Migrator that tries to take the lock meanwhile waits
// (at most its LockTimeout) for the script to commit or roll back.
const scriptLockSQL = `-- Take the migration lock, as ` + "`pgfence migrate up`" + ` does, until the end of the
-- transaction.
DO $pgfence$
DECLARE
    v_holder uuid := pg_catalog.gen_random_uuid();
    v_lock   record;
BEGIN
    IF pg_catalog.to_regclass('%[1]s') IS NULL THEN
        RAISE EXCEPTION 'pgfence: %[1]s does not exist; this script starts from schema version %[2]d'
            USING HINT = 'pgfence records its schema version there: is pgfence installed in this database?';
    END IF;
    %[3]s
    INSERT INTO %[4]s AS l (holder, host, pid, application, db_user, locked_at, lease_until)
    VALUES (v_holder, coalesce(pg_catalog.host(pg_catalog.inet_client_addr()), 'local'), pg_catalog.pg_backend_pid(),
            pg_catalog.concat('pgfence migrate sql, applied by ', pg_catalog.current_setting('application_name')),
            SESSION_USER, pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => %[5]g))
    ON CONFLICT (singleton) DO UPDATE
       SET holder = excluded.holder, host = excluded.host, pid = excluded.pid, application = excluded.application,
           db_user = excluded.db_user, locked_at = excluded.locked_at, lease_until = excluded.lease_until
     WHERE l.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp();
    IF NOT FOUND THEN
        SELECT * INTO v_lock FROM %[4]s;
        RAISE EXCEPTION 'pgfence: another migration holds the migration lock: host %%, pid %%, application %%, role %%, since %%, lease until %%',
                v_lock.host, v_lock.pid, v_lock.application, v_lock.db_user, v_lock.locked_at, v_lock.lease_until
            USING ERRCODE = '55P03',
                  HINT = pg_catalog.format('Let it finish and apply the script again. If that process is gone, its lease lapses at %%s; to clear it at once, make sure it no longer runs, then: DELETE FROM %[4]s', v_lock.lease_until);
    END IF;
    PERFORM pg_catalog.set_config('pgfence.migration_lock_holder', v_holder::text, true);
END
$pgfence$;

`

// section extracts the Up or Down part of a goose SQL file and drops goose's
// annotation lines.
func section(src string, up bool) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(t, "-- +goose Up"):
			in = up
			continue
		case strings.HasPrefix(t, "-- +goose Down"):
			in = !up
			continue
		case strings.HasPrefix(t, "-- +goose "):
			continue
		}
		if in {
			b.WriteString(line)
			b.WriteString("\n")
		}
	}
	return strings.TrimSpace(b.String()) + "\n"
}
