package leases_test

import (
	"os"
	"testing"

	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envWorker); mode != "" {
		os.Exit(runWorker(mode))
	}
	pgfencetest.Main(m)
}

// The helpers every leases test package shares.
var (
	checkLeaks  = leasetest.CheckLeaks
	newClient   = leasetest.NewClient
	ctxTimeout  = leasetest.Context
	backdate    = leasetest.Backdate
	newProxy    = leasetest.NewProxy
	proxiedPool = leasetest.ProxiedPool
)
