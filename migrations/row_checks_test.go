package migrations_test

import (
	"context"
	"testing"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestRowChecksRefuseNonsense: leases, lease_events and fences check their
// rows with domains (key_name, token_value, lease_event_kind, ...) and, for
// the conditions across columns of a lease row, one CHECK calling a plpgsql
// function (pgfence.lease_row_valid), instead of column and table CHECKs,
// said to test the same conditions. A writer that
// bypasses the pgfence functions (here the owner) must still be refused every
// row a plain CHECK of each condition would refuse, and a sane row must pass.
func TestRowChecksRefuseNonsense(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgfencetest.NewPool(t)

	const lease = `INSERT INTO pgfence.leases (key, holder, token, granted_at, renewed_at, expires_at, released_at, holder_info) VALUES `
	const event = `INSERT INTO pgfence.lease_events (key, event, holder, token, reason) VALUES `
	const fence = `INSERT INTO pgfence.fences (resource, token, writes) VALUES `
	for name, q := range map[string]string{
		"lease: empty key":               lease + `('', gen_random_uuid(), 1, now(), NULL, now(), NULL, '')`,
		"lease: key over 512 bytes":      lease + `(repeat('é', 257), gen_random_uuid(), 1, now(), NULL, now(), NULL, '')`,
		"lease: token 0":                 lease + `('k', gen_random_uuid(), 0, now(), NULL, now(), NULL, '')`,
		"lease: holder_info over 1 KiB":  lease + `('k', gen_random_uuid(), 1, now(), NULL, now(), NULL, repeat('é', 513))`,
		"lease: expires before grant":    lease + `('k', gen_random_uuid(), 1, now(), NULL, now() - interval '1s', NULL, '')`,
		"lease: renewed before grant":    lease + `('k', gen_random_uuid(), 1, now(), now() - interval '1s', now(), NULL, '')`,
		"lease: released before grant":   lease + `('k', gen_random_uuid(), 1, now(), NULL, now(), now() - interval '1s', '')`,
		"event: empty key":               event + `('', 'acquired', gen_random_uuid(), 1, NULL)`,
		"event: key over 512 bytes":      event + `(repeat('é', 257), 'acquired', gen_random_uuid(), 1, NULL)`,
		"event: unknown event":           event + `('k', 'stolen', gen_random_uuid(), 1, NULL)`,
		"event: token 0":                 event + `('k', 'acquired', gen_random_uuid(), 0, NULL)`,
		"event: empty reason":            event + `('k', 'released', gen_random_uuid(), 1, '')`,
		"event: reason over 1000 chars":  event + `('k', 'released', gen_random_uuid(), 1, repeat('x', 1001))`,
		"fence: empty resource":          fence + `('', 1, 1)`,
		"fence: resource over 512 bytes": fence + `(repeat('é', 257), 1, 1)`,
		"fence: token 0":                 fence + `('r', 0, 1)`,
		"fence: negative writes":         fence + `('r', 1, -1)`,
	} {
		if _, err := pool.Exec(ctx, q); pgerr.Code(err) != "23514" {
			t.Errorf("%s: %v, want a check violation (23514)", name, err)
		}
	}
	for _, q := range []string{
		lease + `(repeat('é', 256), gen_random_uuid(), 1, now(), now(), now(), now(), repeat('é', 512))`,
		event + `(repeat('é', 256), 'force_released', gen_random_uuid(), 1, repeat('x', 1000))`,
		fence + `(repeat('é', 256), 1, 0)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Errorf("a sane row was refused: %s: %v", q, err)
		}
	}
}
