package migrations

import (
	"testing"
)

// Builds from before the first release numbered their migrations 1 to 17,
// and a schema that records a version from 5 to 17 is refused as one of
// theirs (ErrSchemaTooNew): no migration may use those versions.
func TestPreReleaseVersionsStayUnused(t *testing.T) {
	for _, n := range names() {
		if v := versionOf(n); v >= 5 && v <= 17 {
			t.Errorf("%s: versions 5 to 17 belong to builds from before the first release; number it above 17", n)
		}
	}
}
