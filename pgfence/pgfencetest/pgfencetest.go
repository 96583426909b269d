// Package pgfencetest gives tests a real PostgreSQL database with the pgfence
// schema installed, the way net/http/httptest gives them a server, and gives
// programs (demos, examples, local tools) a throwaway one with [Start].
//
// Each call to [NewPool] returns a pool on a fresh, isolated database cloned
// from a migrated template, so a test pays milliseconds, not a migration run.
// The server comes from, in order:
//
//  1. the URL in PGFENCE_TEST_DATABASE_URL (its role needs CREATEDB);
//  2. a throwaway local cluster started from the PostgreSQL binaries on PATH or
//     under /usr/lib/postgresql/*/bin, one per test process, on 127.0.0.1 and a
//     free port, as an unprivileged user when running as root, removed at exit;
//  3. with [github.com/pgfence/pgfence/pgfence/pgfencetest/container.Main]
//     in TestMain instead of [Main], testcontainers-go's postgres module where
//     a Docker engine answers. It lives in a package of its own so that
//     programs and tests that never start a container do not link Docker's
//     client.
//
// The shared local cluster runs with fsync off for speed; set
// PGFENCE_TEST_DURABLE=1 to keep it on, for benchmarks whose absolute
// figures must include the cost of durable commits. Commits still wait for
// the WAL write (synchronous_commit stays on), so process crashes and server
// restarts lose nothing; only an OS crash could, and no test crashes the OS.
// Dedicated clusters from [NewCluster] keep fsync on.
//
// When none is available the test is skipped, except under CI=true, where it
// fails with a message that says what to install.
//
// Use [Main] in TestMain so the local cluster is stopped when the tests end:
//
//	func TestMain(m *testing.M) { pgfencetest.Main(m) }
//
// Fault tests that stop, restart or kill the server get a cluster of their own
// from [NewCluster].
package pgfencetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/migrations"
)

// envDatabaseURL names the environment variable with an admin URL of an existing
// server to create test databases on.
const envDatabaseURL = "PGFENCE_TEST_DATABASE_URL"

// Main runs the tests and then stops the shared local cluster, if one was
// started. Ctrl-C stops it too. Call it from TestMain.
func Main(m *testing.M) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		if _, ok := <-sigs; ok {
			shutdown()
			os.Exit(130)
		}
	}()
	m.Run() // TestMain returning passes its exit code on
	signal.Stop(sigs)
	shutdown()
}

// server is the process-wide source of test databases.
type server struct {
	adminURL string // connects to the maintenance database
	cluster  *pgcluster.Cluster
	stop     func()
	template string
}

var shared struct {
	once sync.Once
	srv  *server
	err  error
	mu   sync.Mutex
}

func shutdown() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv != nil && shared.srv.stop != nil {
		shared.srv.stop()
	}
	pgcluster.CleanupPristine()
}

// unavailable skips the test, or fails it under CI=true.
func unavailable(t testing.TB, err error) {
	t.Helper()
	msg := fmt.Sprintf("pgfencetest: no PostgreSQL for tests: %v\n"+
		"  set %s to a server URL whose role has CREATEDB, or install the server binaries "+
		"(Debian/Ubuntu: apt-get install postgresql), or run a Docker engine and call pgfencetest/container.Main from TestMain", err, envDatabaseURL)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func getServer(t testing.TB) *server {
	t.Helper()
	shared.once.Do(func() {
		shared.mu.Lock()
		defer shared.mu.Unlock()
		shared.srv, shared.err = startServer()
	})
	if shared.err != nil {
		unavailable(t, shared.err)
	}
	return shared.srv
}

func startServer() (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if url := os.Getenv(envDatabaseURL); url != "" {
		if _, err := pgx.ParseConfig(url); err != nil {
			return nil, fmt.Errorf("%s: %w", envDatabaseURL, err)
		}
		return &server{adminURL: url}, nil
	}
	cluster, err := pgcluster.Start(ctx, &pgcluster.Config{Settings: sharedSettings()})
	if err == nil {
		return &server{adminURL: cluster.ConnString("postgres"), cluster: cluster, stop: func() { _ = cluster.Close() }}, nil
	}
	return nil, fmt.Errorf("local cluster: %w", err)
}

// sharedSettings turns fsync off in the shared local cluster, unless
// PGFENCE_TEST_DURABLE=1: a database clone then costs a fraction.
func sharedSettings() map[string]string {
	if os.Getenv("PGFENCE_TEST_DURABLE") == "1" {
		return nil
	}
	return map[string]string{"fsync": "off", "full_page_writes": "off"}
}

// migrationsHash identifies the embedded migrations, so a template built by an
// older or newer pgfence is never used.
func migrationsHash() string {
	h := sha256.New()
	_ = fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// templateLock serializes template creation across test processes that share
// one server (go test runs packages in parallel).
const templateLock int64 = 0x2f0e1ce5a3b1d0c8

// ensureTemplate creates the migrated template database once per server and
// migrations version. It is built under another name and renamed when complete,
// so a template that exists is always fully migrated.
func (s *server) ensureTemplate(ctx context.Context) (string, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if s.template != "" {
		return s.template, nil
	}
	name := "pgfence_tpl_" + migrationsHash()
	admin, err := pgx.Connect(ctx, s.adminURL)
	if err != nil {
		return "", fmt.Errorf("connect to test server: %w", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `SELECT pg_catalog.pg_advisory_lock($1)`, templateLock); err != nil {
		return "", err
	}
	defer func() {
		_, _ = admin.Exec(context.Background(), `SELECT pg_catalog.pg_advisory_unlock($1)`, templateLock)
	}()
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		building := name + "_building"
		if _, err := admin.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{building}.Sanitize()+` WITH (FORCE)`); err != nil {
			return "", err
		}
		if _, err := admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{building}.Sanitize()); err != nil {
			return "", err
		}
		if err := migrate(ctx, withDatabase(s.adminURL, building)); err != nil {
			return "", fmt.Errorf("migrate template: %w", err)
		}
		if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{building}.Sanitize()+` RENAME TO `+pgx.Identifier{name}.Sanitize()); err != nil {
			return "", err
		}
	}
	s.template = name
	return name, nil
}

func migrate(ctx context.Context, url string) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrations.Up(ctx, pool)
}

// withDatabase returns the connection string url with its database replaced.
// It handles both URLs and keyword/value strings.
func withDatabase(url, database string) string {
	if i := strings.Index(url, "://"); i >= 0 {
		rest, query := url[i+3:], ""
		if q := strings.IndexByte(rest, '?'); q >= 0 {
			rest, query = rest[:q], rest[q:]
		}
		if slash := strings.IndexByte(rest, '/'); slash >= 0 {
			rest = rest[:slash]
		}
		return url[:i+3] + rest + "/" + database + query
	}
	return url + " dbname=" + database // the last occurrence of a keyword wins
}

// Database is one migrated database: a fresh one from [NewPool],
// [NewDatabase] or [Open], dropped by Close (and when the test ends), or the
// one [Start] opened for a program.
type Database struct {
	// Name is the database name.
	Name string
	// URL connects to it (as the harness's role).
	URL string
	// Pool is a pool on it, closed by Close (and when the test ends).
	Pool *pgxpool.Pool

	admin   string             // drops the database on Close, when set
	cluster *pgcluster.Cluster // a throwaway cluster of Start, removed on Close
}

// NewPool returns a pool on a fresh, migrated, isolated database. The database is
// dropped and the pool closed when t ends.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return NewDatabase(t).Pool
}

// NewDatabase is [NewPool] that also returns the database's name and URL, for
// tests that open their own connections (other processes, psql, a proxy).
func NewDatabase(t testing.TB) *Database {
	t.Helper()
	return newDatabase(t, getServer(t))
}

func newDatabase(t testing.TB, s *server) *Database {
	t.Helper()
	db, err := s.create()
	if err != nil {
		t.Fatalf("pgfencetest: %v", err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Logf("pgfencetest: %v", err)
		}
	})
	return db
}

// Open creates a fresh migrated database without a *testing.T, for Example
// functions and TestMain. Close drops it. It returns an error where a test
// would be skipped.
func Open() (*Database, error) {
	shared.once.Do(func() {
		shared.mu.Lock()
		defer shared.mu.Unlock()
		shared.srv, shared.err = startServer()
	})
	if shared.err != nil {
		return nil, shared.err
	}
	return shared.srv.create()
}

func (s *server) create() (*Database, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tpl, err := s.ensureTemplate(ctx)
	if err != nil {
		return nil, err
	}
	name := "pgfence_test_" + randomSuffix()
	if err := exec(ctx, s.adminURL, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()+` TEMPLATE `+pgx.Identifier{tpl}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	url := withDatabase(s.adminURL, name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	return &Database{Name: name, URL: url, Pool: pool, admin: s.adminURL}, nil
}

// Close closes the pool; it drops a database made for a test, and stops and
// removes the throwaway cluster of [Start]. It never drops a database
// [Start] was given by URL.
func (d *Database) Close() error {
	if d.Pool != nil {
		d.Pool.Close()
	}
	if d.cluster != nil {
		return d.cluster.Close()
	}
	if d.admin == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := exec(ctx, d.admin, `DROP DATABASE IF EXISTS `+pgx.Identifier{d.Name}.Sanitize()+` WITH (FORCE)`); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("drop database %s: %w", d.Name, err)
	}
	return nil
}

func exec(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// IssueToken records in pgfence.leases that lease key has issued tokens up
// to token, as its grants would have (the lease itself is left released), so
// that a test may fence resource key with made-up tokens up to token: a
// fenced write accepts only a token its resource's lease has issued. db must
// be able to write pgfence.leases, as the harness's own role can; an
// application's role cannot, and its tokens come from grants.
// db is a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
func IssueToken(t testing.TB, db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, key string, token int64) {
	t.Helper()
	_, err := db.Exec(context.Background(), `INSERT INTO pgfence.leases AS l (key, holder, token, granted_at, expires_at, released_at)
VALUES ($1, pg_catalog.gen_random_uuid(), $2, pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp())
ON CONFLICT (key) DO UPDATE SET token = GREATEST(l.token, excluded.token)`, key, token)
	if err != nil {
		t.Fatalf("pgfencetest: issue token %d of lease %q: %v", token, key, err)
	}
}
