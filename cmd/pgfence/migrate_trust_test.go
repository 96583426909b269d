package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A pgfence schema that another role created is refused by `migrate up`
// with what is wrong and how to fix it, not a bare permission error.
func TestMigrateRefusesASchemaAnotherRoleOwns(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "pgfence_t_squatter_" + hex.EncodeToString(b[:])
	for _, q := range []string{
		`DROP SCHEMA pgfence CASCADE`,
		`CREATE ROLE ` + pgx.Identifier{role}.Sanitize() + ` NOLOGIN`,
		`CREATE SCHEMA pgfence AUTHORIZATION ` + pgx.Identifier{role}.Sanitize(),
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA pgfence CASCADE`)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+pgx.Identifier{role}.Sanitize())
	})
	code, out, errOut := cli(t, map[string]string{"DATABASE_URL": db.URL}, "migrate", "up")
	if code != exitFailure || !strings.Contains(errOut, "schema pgfence is owned by role "+role) || !strings.Contains(errOut, "hint:") {
		t.Fatalf("migrate up on a schema %s owns: code %d\n%s%s", role, code, out, errOut)
	}
}
