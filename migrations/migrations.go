package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"regexp"
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

	// LockID is the advisory lock key that serializes pgfence migrations. It is
	// not goose's default (5887940537704921958), so the host application's goose
	// runs never wait for ours. It is the first 8 bytes of sha256("pgfence.migrations").
	LockID int64 = 0x2f0e1ce5a3b1d0c7
)

// ErrSchemaTooNew is returned when the database's pgfence schema has a version
// this binary does not know: a newer pgfence migrated it. Upgrade the binary.
var ErrSchemaTooNew = errors.New("migrations: the database schema is newer than this pgfence build")

// ErrPreReleaseSchema is returned when a pre-release build of pgfence
// installed the database's pgfence schema. Its migrations were replaced by
// the current ones before the first release, so no build upgrades it, and no
// build rolls it back: export the rows you need, DROP SCHEMA pgfence CASCADE,
// and migrate again.
var ErrPreReleaseSchema = errors.New("migrations: the pgfence schema was installed by a pre-release build of pgfence and cannot be migrated")

// Pre-release builds numbered their migrations 1 to 17. Versions 1 to 4 are
// the current migrations' too; 5 to 17 are never used again (a test fails if
// a migration does), so that a schema that records one of them is known to be
// a pre-release schema. The next migration is 00018.
const (
	preReleaseFirst = 5
	preReleaseLast  = 17
)

// preReleaseSQL is true on a schema that a pre-release build migrated: it
// records a version from 5 to 17, or it records a migration but its
// pgfence.token_floor lacks floor_leaves_room, which the current first
// migration creates with the table and pre-release builds added only at their
// version 12. It needs goose's version table.
var preReleaseSQL = fmt.Sprintf(`EXISTS (SELECT 1 FROM %[1]s v WHERE v.is_applied AND v.version_id BETWEEN %[2]d AND %[3]d)
        OR (EXISTS (SELECT 1 FROM %[1]s v WHERE v.is_applied AND v.version_id > 0)
            AND pg_catalog.to_regclass('pgfence.token_floor') IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint c
                             WHERE c.conrelid = pg_catalog.to_regclass('pgfence.token_floor')
                               AND c.conname = 'floor_leaves_room'))`, VersionTable, preReleaseFirst, preReleaseLast)

// Config configures a [Migrator]. A nil *Config and the zero value use the
// defaults.
type Config struct {
	// Logger receives one event per applied migration. Default: discard.
	Logger *slog.Logger
}

// Migrator applies the embedded migrations to one database. It is safe for
// concurrent use, and several processes may migrate the same database at once:
// every run holds a session advisory lock ([LockID]).
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
	addr     string // host:port, named in connection errors
}

// New returns a Migrator on pool. Close it when done; the pool stays open.
func New(pool *pgxpool.Pool, cfg *Config) (*Migrator, error) {
	if pool == nil {
		return nil, errors.New("migrations: pool is nil")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	db := stdlib.OpenDBFromPool(pool)
	store, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("migrations: %w", err)
	}
	provider, err := goose.NewProvider("", db, files,
		goose.WithStore(store),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSessionLocker(advisoryLocker{}),
		goose.WithSlog(logger),
	)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("migrations: %w", err)
	}
	cc := pool.Config().ConnConfig
	addr := net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
	return &Migrator{db: db, provider: provider, addr: addr}, nil
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

// Close releases the migrator's database/sql handle. The pgx pool stays open.
func (m *Migrator) Close() error {
	return m.db.Close()
}

// Direction is the way a migration runs: [DirectionUp] or [DirectionDown].
type Direction string

// The two directions.
const (
	DirectionUp   Direction = "up"
	DirectionDown Direction = "down"
)

// Result is one migration applied or rolled back.
type Result struct {
	Version   int64
	Name      string
	Direction Direction
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
			Direction: Direction(r.Direction),
			Duration:  r.Duration,
		})
	}
	return out
}

// Up applies every pending migration. It is a no-op on an up-to-date schema.
func (m *Migrator) Up(ctx context.Context) ([]Result, error) {
	if _, err := m.prepare(ctx, true); err != nil {
		return nil, err
	}
	rs, err := m.provider.Up(ctx)
	if err != nil {
		return results(partial(err)), m.wrap(err)
	}
	return results(rs), nil
}

// DownTo rolls back every applied migration above version; DownTo(ctx, 0)
// removes every pgfence object but the schema and its version table. On a
// database without the version table it does nothing and creates nothing.
func (m *Migrator) DownTo(ctx context.Context, version int64) ([]Result, error) {
	if version < 0 {
		return nil, fmt.Errorf("migrations: version %d: must be >= 0", version)
	}
	installed, err := m.prepare(ctx, false)
	if err != nil || !installed {
		return nil, err
	}
	rs, err := m.provider.DownTo(ctx, version)
	if err != nil {
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
// It creates nothing: on a database without the version table every migration
// is pending.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	installed, err := m.prepare(ctx, false)
	if err != nil {
		return nil, err
	}
	if !installed {
		var out []Status
		for _, src := range m.provider.ListSources() {
			out = append(out, Status{Version: src.Version, Name: sourceName(src.Path)})
		}
		return out, nil
	}
	ss, err := m.provider.Status(ctx)
	if err != nil {
		return nil, m.wrap(err)
	}
	out := make([]Status, 0, len(ss))
	for _, s := range ss {
		st := Status{Version: s.Source.Version, Name: sourceName(s.Source.Path), Applied: s.State == goose.StateApplied}
		if st.Applied {
			st.AppliedAt = s.AppliedAt.UTC()
		}
		out = append(out, st)
	}
	return out, nil
}

// Version returns the applied schema version (0 for none) and the newest version
// this binary knows. It returns [ErrSchemaTooNew] when the database is ahead.
// It creates nothing: a database without the version table is at version 0.
func (m *Migrator) Version(ctx context.Context) (current, latest int64, err error) {
	installed, err := m.prepare(ctx, false)
	if err != nil {
		return 0, 0, err
	}
	latest = Latest()
	if !installed {
		return 0, latest, nil
	}
	current, err = m.provider.GetDBVersion(ctx)
	if err != nil {
		return 0, latest, m.wrap(err)
	}
	if current > latest {
		return current, latest, fmt.Errorf("%w: database is at version %d, this build knows up to %d", ErrSchemaTooNew, current, latest)
	}
	return current, latest, nil
}

// Pending reports the migrations not applied yet, oldest first.
func (m *Migrator) Pending(ctx context.Context) ([]Status, error) {
	ss, err := m.Status(ctx)
	if err != nil {
		return nil, err
	}
	var out []Status
	for _, s := range ss {
		if !s.Applied {
			out = append(out, s)
		}
	}
	return out, nil
}

// prepare reports whether goose's version table exists and refuses to touch a
// schema newer than this build, or one a pre-release build migrated
// ([ErrPreReleaseSchema]). With create (Up) it also creates the schema
// that holds the version table, under the same advisory lock as the
// migrations so that concurrent first runs do not race on CREATE SCHEMA.
// Without create it writes nothing: the callers that read (Status, Version)
// or have nothing to undo on a blank database (DownTo) must not leave a
// schema behind, nor need the CREATE privilege a read-only role lacks. They
// skip goose when the table is missing, since goose creates it on any call.
func (m *Migrator) prepare(ctx context.Context, create bool) (installed bool, err error) {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return false, m.wrap(err)
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return false, m.wrap(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, LockID); err != nil {
		return false, m.wrap(err)
	}
	if create {
		// Only when it is missing: CREATE SCHEMA checks the CREATE privilege
		// on the database even with IF NOT EXISTS.
		var schemaExists bool
		if err := tx.QueryRowContext(ctx, `SELECT to_regnamespace($1) IS NOT NULL`, Schema).Scan(&schemaExists); err != nil {
			return false, m.wrap(err)
		}
		if !schemaExists {
			if _, err := tx.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+Schema); err != nil {
				return false, m.wrap(err)
			}
		}
	}
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, VersionTable).Scan(&installed); err != nil {
		return false, m.wrap(err)
	}
	if installed {
		var newest sql.NullInt64
		var preRelease bool
		if err := tx.QueryRowContext(ctx, `SELECT max(version_id) FILTER (WHERE is_applied), `+preReleaseSQL+` FROM `+VersionTable).Scan(&newest, &preRelease); err != nil {
			return false, m.wrap(err)
		}
		if preRelease {
			return false, fmt.Errorf("%w: it records version %d of the pre-release numbering; export the rows you need, DROP SCHEMA %s CASCADE, and migrate again", ErrPreReleaseSchema, newest.Int64, Schema)
		}
		if newest.Valid && newest.Int64 > Latest() {
			return false, fmt.Errorf("%w: database is at version %d, this build knows up to %d; upgrade pgfence", ErrSchemaTooNew, newest.Int64, Latest())
		}
	}
	if err := tx.Commit(); err != nil {
		return false, m.wrap(err)
	}
	return installed, nil
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
	if errors.Is(err, ErrSchemaTooNew) || errors.Is(err, ErrPreReleaseSchema) {
		return err
	}
	if pgerr.PgError(err) == nil && !strings.Contains(err.Error(), m.addr) {
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
	var latest int64
	for _, f := range names() {
		v, _ := strconv.ParseInt(migrationName.FindStringSubmatch(f)[1], 10, 64)
		latest = max(latest, v)
	}
	return latest
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

// SQL returns the plain SQL of every migration in one direction (up in version
// order, down in reverse), with goose's annotations removed, for teams that
// apply it with another tool. Apply it in one transaction. It is
// Script(0, Latest()) for [DirectionUp] and Script(Latest(), 0) for
// [DirectionDown].
func SQL(direction Direction) (string, error) {
	switch direction {
	case DirectionUp:
		return Script(0, Latest())
	case DirectionDown:
		return Script(Latest(), 0)
	default:
		return "", fmt.Errorf("migrations: direction %q: want %q or %q", direction, DirectionUp, DirectionDown)
	}
}

// versionTableDDL is the table goose's Provider creates for PostgreSQL
// (goose v3, internal/dialects/postgres.go), and the version-0 row it inserts
// with it. A script that installs pgfence creates them the same way, so that
// a Migrator, `pgfence migrate status` and `pgfence doctor` see what it
// applied and a later Up applies only newer migrations.
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
// at version from, so that it fails cleanly on a schema at another version
// (or on one a pre-release build installed, see [ErrPreReleaseSchema]).
// Apply it in one transaction.
func Script(from, to int64) (string, error) {
	known := map[int64]string{0: ""}
	var ns []string
	for _, n := range names() {
		v, _ := strconv.ParseInt(migrationName.FindStringSubmatch(n)[1], 10, 64)
		known[v] = n
		if up := from <= to; (up && v > from && v <= to) || (!up && v > to && v <= from) {
			ns = append(ns, n)
		}
	}
	for _, v := range []int64{from, to} {
		if _, ok := known[v]; !ok {
			return "", fmt.Errorf("migrations: version %d: not a pgfence migration (want 0 to %d)", v, Latest())
		}
	}
	up := from <= to
	direction := "up"
	if !up {
		direction = "down"
		for i, j := 0, len(ns)-1; i < j; i, j = i+1, j-1 {
			ns[i], ns[j] = ns[j], ns[i]
		}
	}
	var b strings.Builder
	if up && from == 0 {
		b.WriteString("-- goose's version table, as `pgfence migrate up` creates it.\n")
		b.WriteString(versionTableDDL)
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, `-- Refuse to run on a schema that is not at version %[1]d, or that a pre-release
-- build of pgfence installed.
DO $pgfence$
DECLARE
    v_current bigint;
BEGIN
    IF to_regclass('%[2]s') IS NULL THEN
        RAISE EXCEPTION 'pgfence: %[2]s does not exist; this script starts from schema version %[1]d'
            USING HINT = 'pgfence records its schema version there: is pgfence installed in this database?';
    END IF;
    IF %[4]s THEN
        RAISE EXCEPTION 'pgfence: the pgfence schema was installed by a pre-release build of pgfence and cannot be migrated'
            USING HINT = 'Export the rows you need, DROP SCHEMA %[5]s CASCADE, and install it again.';
    END IF;
    SELECT coalesce(max(version_id), 0) INTO v_current FROM %[2]s;
    IF v_current <> %[1]d THEN
        RAISE EXCEPTION 'pgfence: the schema is at version %%, this script starts from version %[1]d', v_current
            USING HINT = 'Generate a script from that version: pgfence migrate sql --direction %[3]s --from ' || v_current || '.';
    END IF;
END
$pgfence$;

`, from, VersionTable, direction, preReleaseSQL, Schema)
	for _, n := range ns {
		raw, err := fs.ReadFile(files, n)
		if err != nil {
			return "", err
		}
		v, _ := strconv.ParseInt(migrationName.FindStringSubmatch(n)[1], 10, 64)
		fmt.Fprintf(&b, "-- pgfence migration %s (%s)\n", n, direction)
		b.WriteString(section(string(raw), up))
		if up {
			fmt.Fprintf(&b, "INSERT INTO %s (version_id, is_applied) VALUES (%d, true);\n\n", VersionTable, v)
		} else {
			fmt.Fprintf(&b, "DELETE FROM %s WHERE version_id = %d;\n\n", VersionTable, v)
		}
	}
	return b.String(), nil
}

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

// advisoryLocker is goose's SessionLocker on a blocking pg_advisory_lock: a
// waiting migrator wakes the moment the lock holder finishes (goose's own
// postgres locker polls every 5 s), and context cancellation ends the wait.
type advisoryLocker struct{}

func (advisoryLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, LockID); err != nil {
		return fmt.Errorf("take migration lock: %w", err)
	}
	return nil
}

func (advisoryLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var ok bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_advisory_unlock($1)`, LockID).Scan(&ok); err != nil {
		return fmt.Errorf("release migration lock: %w", err)
	}
	if !ok {
		return errors.New("release migration lock: lock was not held")
	}
	return nil
}
