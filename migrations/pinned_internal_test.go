package migrations

import (
	"io/fs"
	"strings"
	"testing"
)

// goose runs each migration with search_path pinned: the first statement of
// every Up and Down section is the pin.
func TestPinnedSections(t *testing.T) {
	for _, name := range names() {
		raw, err := fs.ReadFile(files, name)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		sections := 0
		for i, line := range lines {
			if s := strings.TrimSpace(line); s != "-- +goose Up" && s != "-- +goose Down" {
				continue
			}
			sections++
			if i+1 >= len(lines) || lines[i+1] != searchPathPin {
				t.Errorf("%s, line %d: %q is not followed by the search_path pin", name, i+1, line)
			}
		}
		if sections != 2 {
			t.Errorf("%s: %d sections, want an Up and a Down", name, sections)
		}
	}
}
