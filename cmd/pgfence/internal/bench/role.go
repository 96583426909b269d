package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
	"github.com/pgfence/pgfence/leases"
)

// errSkip marks a case that cannot run on this database; the report says why
// instead of failing the run.
var errSkip = errors.New("skipped")

// The login role of leases-service is a member of pgfence_app granted the
// prefix bench/, as the README's service roles are. Roles belong to the whole
// server, so each measurement makes its own and drops it.
const (
	sqlServiceRole   = `CREATE ROLE %s LOGIN IN ROLE pgfence_app`
	sqlServiceGrant  = `SELECT pgfence.grant_prefix($1::pg_catalog.regrole, 'bench/')`
	sqlServiceRevoke = `SELECT pgfence.revoke_prefix($1::pg_catalog.regrole, 'bench/')`
	sqlServiceDrop   = `DROP ROLE IF EXISTS %s`
)

// prepareService runs the leases case as serviceRole, whose every grant and
// release checks the prefix grants (the schema's owner skips that check).
// It needs a role that may create roles and a server that lets the new role
// in without a password (the throwaway cluster does); elsewhere it is skipped.
func prepareService(ctx context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
	serviceRole := fmt.Sprintf("pgfence_bench_service_%d", time.Now().UnixNano())
	if _, err := lab.pool.Exec(ctx, fmt.Sprintf(sqlServiceRole, serviceRole)); err != nil {
		return nil, nil, fmt.Errorf("%w: creating a service role: %v", errSkip, err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_, _ = lab.pool.Exec(ctx, sqlServiceRevoke, serviceRole)
		_, _ = lab.pool.Exec(ctx, fmt.Sprintf(sqlServiceDrop, serviceRole))
	}
	if _, err := lab.pool.Exec(ctx, sqlServiceGrant, serviceRole); err != nil {
		drop()
		return nil, nil, err
	}
	cfg := lab.pool.Config().Copy()
	cfg.ConnConfig.User = serviceRole
	cfg.ConnConfig.Password = ""
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		drop()
		return nil, nil, fmt.Errorf("%w: connecting as %s without a password: %v", errSkip, serviceRole, err)
	}
	client, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	return leaseCycle(client), func() {
		client.Close()
		pool.Close()
		drop()
	}, nil
}
