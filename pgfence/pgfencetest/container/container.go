// Package container gives pgfencetest a PostgreSQL server in Docker, through
// testcontainers-go, for machines with a Docker engine but no local
// PostgreSQL binaries. Call its [Main] from TestMain instead of
// pgfencetest.Main:
//
//	func TestMain(m *testing.M) { container.Main(m) }
//
// With PGFENCE_TEST_DATABASE_URL set, or local server binaries installed,
// it starts nothing and behaves as pgfencetest.Main.
package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Main runs the tests as pgfencetest.Main does, on a PostgreSQL container
// when neither PGFENCE_TEST_DATABASE_URL nor local server binaries give a
// server; the container is removed when the tests end. When no Docker engine
// answers either, the tests that need a database are skipped (or fail under
// CI=true) as with pgfencetest.Main.
func Main(m *testing.M) {
	if os.Getenv("PGFENCE_TEST_DATABASE_URL") == "" {
		if _, err := pgcluster.FindBinaries(); err != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			url, stop, err := startContainer(ctx)
			cancel()
			if err == nil {
				defer stop()
				_ = os.Setenv("PGFENCE_TEST_DATABASE_URL", url)
			}
		}
	}
	pgfencetest.Main(m)
}

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
