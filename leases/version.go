package leases

import (
	"cmp"
	"runtime/debug"
	"sync"
)

// modulePath is this module's import path, looked up in the build info.
const modulePath = "github.com/pgfence/pgfence"

// clientVersion is what this client records with every grant it makes
// (pgfence.leases.client_version, shown by [Status.ClientVersion] and in the
// acquired/taken_over history entries): "pgfence-go/" followed by the
// module version the binary was built with. A build inside this module
// reports what the go command stamped (a version from the VCS with go
// build, "(devel)" with go run or go test), and a dependency replaced by a
// local directory reports "(devel)": its code is no released version. During
// a rolling deploy it tells which grants came from which library version, and
// grants by clients that predate it (or by plain SQL clients) show an empty
// version.
var clientVersion = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "pgfence-go/(devel)"
	}
	return "pgfence-go/" + moduleVersion(bi)
})

// moduleVersion is the version of this module in bi (see clientVersion).
func moduleVersion(bi *debug.BuildInfo) string {
	for _, m := range append([]*debug.Module{&bi.Main}, bi.Deps...) {
		if m.Path != modulePath {
			continue
		}
		if m.Replace != nil { // a directory has no version: not the required version's code
			m = m.Replace
		}
		return cmp.Or(m.Version, "(devel)")
	}
	return "(devel)"
}
