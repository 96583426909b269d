package pgfence_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(workerMain())
	}
	container.Main(m)
}

// grantSQL grants lease $1 to holder $2 for $3 (an interval) if it is free
// (never granted, released or expired), drawing the next token in the granting
// statement. It stands in for the leases package, which these tests do not use.
const grantSQL = `INSERT INTO pgfence.leases AS l (key, holder, token, granted_at, expires_at)
VALUES ($1, $2, pgfence.next_token(NULL), clock_timestamp(), clock_timestamp() + $3::interval)
ON CONFLICT (key) DO UPDATE
   SET holder = excluded.holder, token = pgfence.next_token(l.token),
       granted_at = excluded.granted_at, expires_at = excluded.expires_at,
       renewed_at = NULL, released_at = NULL
 WHERE l.released_at IS NOT NULL OR l.expires_at <= clock_timestamp()
RETURNING token`

// expireSQL moves lease $1's expiry into the past: the database clock decides.
const expireSQL = `UPDATE pgfence.leases SET expires_at = clock_timestamp() - interval '1 second', granted_at = clock_timestamp() - interval '1 minute' WHERE key = $1`

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func mustExec(t testing.TB, db execer, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func newHolder() string {
	var h [16]byte
	_, _ = rand.Read(h[:])
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	return pgfence.OpID(h).String()
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// leaseRow is a grant read over SQL, with fields a test can change.
type leaseRow struct {
	Key, Holder string
	Token       int64
}

func (l leaseRow) lease() pgfence.Lease { return pgfence.LeaseOf(l.Key, l.Holder, l.Token) }

// madeUp is the highest made-up token a test uses on a resource whose lease
// it lets issue tokens with issue: below the first token any grant draws
// (timeline 1 << 40, + 1), so real grants of the same key are unaffected.
const madeUp = 1<<40 - 1

// issue lets tests fence resources with made-up tokens up to madeUp: it
// records in pgfence.leases, as their grants would, that their leases issued
// them.
func issue(t testing.TB, db execer, resources ...string) {
	t.Helper()
	for _, r := range resources {
		pgfencetest.IssueToken(t, db, r, madeUp)
	}
}
