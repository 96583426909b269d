package migrations

import (
	"strconv"
	"testing"
)

// A schema that records a version from 5 to 17 is taken for one a
// pre-release build installed (ErrPreReleaseSchema): no migration may use
// those versions.
func TestPreReleaseVersionsStayUnused(t *testing.T) {
	for _, n := range names() {
		v, _ := strconv.ParseInt(migrationName.FindStringSubmatch(n)[1], 10, 64)
		if v >= preReleaseFirst && v <= preReleaseLast {
			t.Errorf("%s: versions %d to %d belong to pre-release builds; number it above %d", n, preReleaseFirst, preReleaseLast, preReleaseLast)
		}
	}
}
