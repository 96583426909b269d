package pgfence

import (
	"context"
	"testing"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// isUUID accepts exactly what PostgreSQL's uuid input accepts, so a holder
// the database would refuse is caught before any round trip and a holder it
// accepts is never refused.
func TestIsUUIDMatchesPostgreSQL(t *testing.T) {
	ctx := context.Background()
	pool := pgfencetest.NewPool(t)
	for _, s := range []string{
		"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
		"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
		"a0eebc999c0b4ef8bb6d6bb9bd380a11",
		"a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11",
		"{a0eebc999c0b4ef8bb6d6bb9bd380a11}",
		"3b2e1a4c0000400080000000000000-00",
		"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11-",
		"-a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"a0eebc99--9c0b-4ef8-bb6d-6bb9bd380a11",
		"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
		"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a111",
		"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
		"a0eeb-c99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		" a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"",
	} {
		var parsed string
		err := pool.QueryRow(ctx, `SELECT $1::text::uuid::text`, s).Scan(&parsed)
		if err != nil && pgerr.Code(err) != "22P02" { // invalid_text_representation
			t.Fatalf("%q::uuid: %v", s, err)
		}
		if got, pgOK := isUUID(s), err == nil; got != pgOK {
			t.Errorf("isUUID(%q) = %v, PostgreSQL says %v", s, got, pgOK)
		}
	}
}
