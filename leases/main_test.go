package leases_test

import (
	"os"
	"testing"

	"github.com/pgfence/pgfence/internal/testkit/leasetest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envWorker); mode != "" {
		os.Exit(runWorker(mode))
	}
	container.Main(m)
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

// manual returns options that grant a lease without keeping it alive: for
// tests that renew by hand, let the lease expire, backdate its row or count
// its statements, which a background renewal would change.
func manual() *leases.AcquireOptions { return &leases.AcquireOptions{NoKeepAlive: true} }
