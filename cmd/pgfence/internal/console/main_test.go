package console

import (
	"testing"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestMain(m *testing.M) { pgfencetest.Main(m) }
