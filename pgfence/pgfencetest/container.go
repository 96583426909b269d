package pgfencetest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// startContainer starts PostgreSQL in Docker through testcontainers-go, for
// machines with a Docker engine but no local server binaries.
func startContainer(ctx context.Context) (url string, stop func(), err error) {
	defer func() {
		// testcontainers panics on some Docker setups instead of returning.
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers: %v", r)
		}
	}()
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return "", nil, fmt.Errorf("no Docker engine: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = provider.Health(pingCtx)
	cancel()
	_ = provider.Close()
	if err != nil {
		return "", nil, fmt.Errorf("no Docker engine: %w", err)
	}
	ctr, err := tcpostgres.Run(ctx, "postgres:15-alpine",
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return "", nil, err
	}
	url, err = ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return "", nil, err
	}
	if url == "" {
		return "", nil, errors.New("container has no connection string")
	}
	return url, func() { _ = testcontainers.TerminateContainer(ctr) }, nil
}
