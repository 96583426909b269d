package migrations_test

import (
	"io/fs"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/migrations"
)

// createRE finds what an Up section creates in schema pgfence.
var createRE = regexp.MustCompile(`(?i)CREATE\s+(?:OR\s+REPLACE\s+)?(?:TABLE|FUNCTION|VIEW|TYPE|SEQUENCE)\s+(?:IF\s+NOT\s+EXISTS\s+)?pgfence\.(\w+)`)

// The README's table names, in each migration's row, every table, view and
// function that migration creates: a reader looking for where try_acquire
// or job_slots comes from finds it there.
func TestReadmeListsWhatEachMigrationCreates(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(string(readme), "\n") {
		if m := regexp.MustCompile("^\\| `(\\d{5}_\\w+\\.sql)` \\|").FindStringSubmatch(line); m != nil {
			rows[m[1]] = line
		}
	}
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("no migrations (%v)", err)
	}
	for _, name := range names {
		row, ok := rows[name]
		if !ok {
			t.Errorf("README.md has no row for %s", name)
			continue
		}
		sql, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		up, _, _ := strings.Cut(string(sql), "-- +goose Down")
		for _, m := range createRE.FindAllStringSubmatch(up, -1) {
			if !strings.Contains(row, "`"+m[1]+"`") {
				t.Errorf("README.md's row for %s does not name %s, which it creates", name, m[1])
			}
		}
	}
}
