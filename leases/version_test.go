package leases_test

import (
	"runtime/debug"
	"testing"

	"github.com/pgfence/pgfence/leases"
)

// TestModuleVersion: the version recorded with every grant is the module
// version the binary was built with, for each way this module can be built in.
func TestModuleVersion(t *testing.T) {
	const path = "github.com/pgfence/pgfence"
	main := func(version string) debug.Module { return debug.Module{Path: "example.com/app", Version: version} }
	for _, c := range []struct {
		what string
		bi   debug.BuildInfo
		want string
	}{
		{"built inside this module by go test or go run",
			debug.BuildInfo{Main: debug.Module{Path: path, Version: "(devel)"}}, "(devel)"},
		{"built inside this module by go build (a VCS version)",
			debug.BuildInfo{Main: debug.Module{Path: path, Version: "v0.4.1-0.20261202214833-abcdefabcdef+dirty"}}, "v0.4.1-0.20261202214833-abcdefabcdef+dirty"},
		{"built inside this module without a version",
			debug.BuildInfo{Main: debug.Module{Path: path}}, "(devel)"},
		{"a dependency",
			debug.BuildInfo{Main: main("v1.0.0"), Deps: []*debug.Module{
				{Path: "github.com/jackc/pgx/v5", Version: "v5.7.5"},
				{Path: path, Version: "v0.4.0"},
				{Path: path + "/other", Version: "v9.9.9"},
			}}, "v0.4.0"},
		{"a dependency replaced by another version (a fork)",
			debug.BuildInfo{Main: main("v1.0.0"), Deps: []*debug.Module{
				{Path: path, Version: "v0.4.0", Replace: &debug.Module{Path: "example.com/fork", Version: "v0.4.0-fork.1"}},
			}}, "v0.4.0-fork.1"},
		{"a dependency replaced by a local directory",
			debug.BuildInfo{Main: main("v1.0.0"), Deps: []*debug.Module{
				{Path: path, Version: "v0.4.0", Replace: &debug.Module{Path: "../pgfence"}},
			}}, "(devel)"},
		{"not in the build info at all", debug.BuildInfo{Main: main("v1.0.0")}, "(devel)"},
	} {
		if got := leases.ModuleVersion(&c.bi); got != c.want {
			t.Errorf("%s: %q, want %q", c.what, got, c.want)
		}
	}
}
