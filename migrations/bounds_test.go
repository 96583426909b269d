package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Every documented limit is enforced by the function that takes it, with
// PF008: none of these may raise another SQLSTATE (22023 from lock_timeout,
// 23514 from a table's CHECK) or, worse, be accepted.
func TestLimitsArePF008(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	const fp = `'\x00112233445566778899aabbccddeeff'`
	for _, q := range []string{
		`SELECT * FROM pgfence.try_acquire('k', interval '500 microseconds')`,
		`SELECT * FROM pgfence.try_acquire('k', interval '25 hours')`,
		`SELECT * FROM pgfence.idempotency_claim_atomic('s', 'k', ` + fp + `, interval '30 days', interval '1 day')`,
		`SELECT * FROM pgfence.idempotency_claim_atomic('s', 'k', ` + fp + `, interval '1 second', interval '367 days')`,
		`SELECT * FROM pgfence.idempotency_claim('s', 'k', ` + fp + `, interval '100 years', interval '1 day')`,
		`SELECT * FROM pgfence.idempotency_claim('s', 'k', ` + fp + `, interval '1 minute', interval '1 day', interval '30 days')`,
		`SELECT pgfence.raise_token_floor(4611686018427387905, 'too high')`,
		`SELECT pgfence.raise_token_floor(9223372036854775807, 'too high')`,
		`SELECT pgfence.lease_queue_turn('k', gen_random_uuid(), interval '200000 years')`,
		`SELECT pgfence.fence('r', 9223372036854775807)`,
	} {
		if _, err := pool.Exec(ctx, q); pgerr.Code(err) != pgerr.CodeInvalid {
			t.Errorf("%s: %v, want PF008", q, err)
		}
	}
}

// A renewal by the wrong holder says what is wrong: the grant belongs to
// another holder, or was granted again since, or never issued the token;
// never "granted again since (token N)" with the caller's own token.
func TestRenewRefusalSaysWhy(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	var holder string
	var token int64
	if err := pool.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.acquire('k', interval '1 minute')`).Scan(&holder, &token); err != nil {
		t.Fatal(err)
	}
	detail := func(h string, tok int64) string {
		t.Helper()
		_, err := pool.Exec(ctx, `SELECT * FROM pgfence.renew('k', $1, $2, interval '1 minute')`, h, tok)
		pe := pgerr.PgError(err)
		if pe == nil || pe.Code != pgerr.CodeLeaseNotHeld {
			t.Fatalf("renew by %s/%d: %v, want PF002", h, tok, err)
		}
		return pe.Detail
	}
	const other = "3b241101-e2bb-4255-8caf-4136c566a962"
	if d := detail(other, token); !strings.Contains(d, "belongs to another holder") {
		t.Errorf("wrong holder of the live grant: %q", d)
	}
	if d := detail(holder, token+1); !strings.Contains(d, "never issued") {
		t.Errorf("a token the lease never issued: %q", d)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgfence.leases SET expires_at = granted_at WHERE key = 'k'`); err != nil {
		t.Fatal(err)
	}
	var newToken int64
	if err := pool.QueryRow(ctx, `SELECT token FROM pgfence.acquire('k', interval '1 minute')`).Scan(&newToken); err != nil {
		t.Fatal(err)
	}
	if d := detail(holder, token); !strings.Contains(d, "granted again since") {
		t.Errorf("a grant taken over since: %q", d)
	}
}

// The guard names a row's resource by its resource column's text, so protect
// accepts only columns whose text is one per row: char(n) (padding), numeric
// (scale) and nondeterministic collations (case) are refused.
func TestProtectRefusesColumnsWithSeveralTexts(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	for _, q := range []string{
		`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`,
		`CREATE TABLE padded (k char(8) PRIMARY KEY)`,
		`CREATE TABLE scaled (k numeric PRIMARY KEY)`,
		`CREATE TABLE caseless (k text COLLATE ci PRIMARY KEY)`,
		`CREATE DOMAIN sku AS text COLLATE ci`,
		`CREATE TABLE caseless_domain (k sku PRIMARY KEY)`,
		`CREATE TABLE ok (k text PRIMARY KEY, n bigint UNIQUE, u uuid UNIQUE, v varchar(20) UNIQUE)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, table := range []string{"padded", "scaled", "caseless", "caseless_domain"} {
		_, err := pool.Exec(ctx, `SELECT pgfence.protect($1::regclass, 'k', 'x:')`, table)
		var pe *pgconn.PgError
		if pe = pgerr.PgError(err); pe == nil || pe.Code != pgerr.CodeInvalid || pe.Hint == "" {
			t.Errorf("protect %s: %v, want PF008 with a hint", table, err)
		}
	}
	for _, col := range []string{"k", "n", "u", "v"} {
		if _, err := pool.Exec(ctx, `SELECT pgfence.protect('ok', $1, 'ok:')`, col); err != nil {
			t.Errorf("protect ok.%s: %v", col, err)
		}
	}
}
