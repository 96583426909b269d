package migrations_test

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/migrations"
)

var update = flag.Bool("update", false, "rewrite schema.sql from a freshly migrated database")

const (
	schemaFile = "schema.sql"
	regenerate = "go test ./migrations -run '^TestSchemaFile$' -update"
)

// schemaDump dumps schema pgfence the way schema.sql records it, with the
// pg_dump that sits next to the server binaries the test harness uses.
type schemaDump struct {
	pgDump string
	server int // the server's major version
	client int // pg_dump's major version
}

// findSchemaDump finds pg_dump next to initdb and postgres, in the directory
// the harness takes them from (pgcluster.FindBinaries) or, when those are
// symlinks (/usr/local/bin/postgres -> /usr/lib/postgresql/15/bin/postgres),
// in the directory they point into.
func findSchemaDump(pool *pgxpool.Pool) (*schemaDump, error) {
	binDir, err := pgcluster.FindBinaries()
	if err != nil {
		return nil, err
	}
	dirs := []string{binDir}
	for _, name := range []string{"postgres", "initdb"} {
		if real, err := filepath.EvalSymlinks(filepath.Join(binDir, name)); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
	}
	d := &schemaDump{}
	for _, dir := range dirs {
		if p := filepath.Join(dir, "pg_dump"); isExecutable(p) {
			d.pgDump = p
			break
		}
	}
	if d.pgDump == "" {
		return nil, fmt.Errorf("pg_dump not found in %s", strings.Join(dirs, " or "))
	}
	out, err := exec.Command(d.pgDump, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", d.pgDump, err)
	}
	m := regexp.MustCompile(`\) (\d+)`).FindSubmatch(out) // "pg_dump (PostgreSQL) 15.18 (Debian ...)"
	if m == nil {
		return nil, fmt.Errorf("%s --version: unexpected output %q", d.pgDump, out)
	}
	d.client, _ = strconv.Atoi(string(m[1]))
	var num int
	if err := pool.QueryRow(context.Background(), `SELECT current_setting('server_version_num')::int`).Scan(&num); err != nil {
		return nil, err
	}
	d.server = num / 10000
	return d, nil
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// header starts schema.sql; its last line records the versions that wrote it.
func (d *schemaDump) header() string {
	return fmt.Sprintf(`-- The catalog of schema pgfence as migrating an empty database produces it:
-- pg_dump --schema-only --schema=pgfence --no-owner, without the lines that
-- vary from one run to the next (version banner, SET, \restrict). Generated
-- by a test that fails when the migrations no longer produce it; regenerate:
--   %s
-- Written from PostgreSQL %d by pg_dump %d.
`, regenerate, d.server, d.client)
}

var writtenBy = regexp.MustCompile(`(?m)^-- Written from PostgreSQL (\d+) by pg_dump (\d+)\.$`)

// file returns what schema.sql holds for the pgfence schema of the database
// at url.
func (d *schemaDump) file(t *testing.T, url string) string {
	t.Helper()
	cmd := exec.Command(d.pgDump, "--schema-only", "--schema="+migrations.Schema, "--no-owner", "--dbname="+url)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", d.pgDump, err, stderr.String())
	}
	varying := regexp.MustCompile(`^(\\restrict |\\unrestrict |-- Dumped (from|by) |SET |SELECT pg_catalog\.set_config\()`)
	var b strings.Builder
	b.WriteString(d.header() + "\n")
	blank := true
	for _, line := range strings.Split(string(out), "\n") {
		if varying.MatchString(line) {
			continue
		}
		if strings.TrimSpace(line) == "" {
			if !blank {
				b.WriteString("\n")
			}
			blank = true
			continue
		}
		blank = false
		b.WriteString(line + "\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

// committed returns schema.sql as committed. It returns "" and the reason
// when other major versions of PostgreSQL or pg_dump wrote it: their dumps
// differ in form, not in what they say.
func (d *schemaDump) committed(t *testing.T) (file, mismatch string) {
	t.Helper()
	raw, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatalf("%v: generate it with %s", err, regenerate)
	}
	m := writtenBy.FindSubmatch(raw)
	if m == nil {
		t.Fatalf("%s: no line %q; regenerate it with %s", schemaFile, "-- Written from PostgreSQL N by pg_dump N.", regenerate)
	}
	server, _ := strconv.Atoi(string(m[1]))
	client, _ := strconv.Atoi(string(m[2]))
	if server != d.server || client != d.client {
		return "", fmt.Sprintf("%s was written from PostgreSQL %d by pg_dump %d; this run has PostgreSQL %d and pg_dump %d (%s), whose dump differs in form",
			schemaFile, server, client, d.server, d.client, d.pgDump)
	}
	return string(raw), ""
}

// noSchemaDump skips the test when pg_dump is missing, or fails it under
// CI=true, where every tool the tests need is installed.
func noSchemaDump(t *testing.T, err error) {
	t.Helper()
	msg := fmt.Sprintf("no pg_dump to compare the schema with %s: %v", schemaFile, err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI installs the PostgreSQL server and client packages)")
	}
	t.Skip(msg)
}

// TestSchemaFile migrates an empty database and checks that its schema
// pgfence is exactly schema.sql, so that the file always shows the current
// SQL of every function, table and grant. With -update it rewrites the file
// instead.
func TestSchemaFile(t *testing.T) {
	t.Parallel()
	if _, err := fs.Stat(migrations.FS, schemaFile); err == nil {
		t.Errorf("migrations.FS holds %s: a tool that applies every file of FS would run it", schemaFile)
	}
	ctx := context.Background()
	db := blankDatabase(t)
	if err := migrations.Up(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	d, err := findSchemaDump(db.Pool)
	if err != nil {
		noSchemaDump(t, err)
	}
	got := d.file(t, db.URL)
	if *update {
		if err := os.WriteFile(schemaFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (PostgreSQL %d, pg_dump %d)", schemaFile, d.server, d.client)
		return
	}
	want, mismatch := d.committed(t)
	if mismatch != "" {
		t.Skip(mismatch + "; compare with those versions, or regenerate with " + regenerate)
	}
	if got != want {
		t.Fatalf("the migrations no longer produce %s (- %s, + a database migrated now):\n%s\nIf the change is intended, regenerate it: %s",
			schemaFile, schemaFile, unifiedDiff(want, got), regenerate)
	}
}

// unifiedDiff shows the lines that differ between want (-) and got (+),
// with three lines of context, like diff -u without the file header.
func unifiedDiff(want, got string) string {
	x, y := strings.Split(want, "\n"), strings.Split(got, "\n")
	// Common prefix and suffix first: what differs is usually a few lines.
	pre := 0
	for pre < len(x) && pre < len(y) && x[pre] == y[pre] {
		pre++
	}
	suf := 0
	for suf < len(x)-pre && suf < len(y)-pre && x[len(x)-1-suf] == y[len(y)-1-suf] {
		suf++
	}
	mx, my := x[pre:len(x)-suf], y[pre:len(y)-suf]
	// Longest common subsequence of the middle.
	lcs := make([][]int32, len(mx)+1)
	for i := range lcs {
		lcs[i] = make([]int32, len(my)+1)
	}
	for i := len(mx) - 1; i >= 0; i-- {
		for j := len(my) - 1; j >= 0; j-- {
			if mx[i] == my[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type op struct {
		kind byte // ' ', '-', '+'
		text string
		line int // 1-based line number in want (' ', '-') or got ('+')
	}
	var ops []op
	for i := 0; i < pre; i++ {
		ops = append(ops, op{' ', x[i], i + 1})
	}
	i, j := 0, 0
	for i < len(mx) || j < len(my) {
		switch {
		case i < len(mx) && j < len(my) && mx[i] == my[j]:
			ops = append(ops, op{' ', mx[i], pre + i + 1})
			i, j = i+1, j+1
		case i < len(mx) && (j == len(my) || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, op{'-', mx[i], pre + i + 1})
			i++
		default:
			ops = append(ops, op{'+', my[j], pre + j + 1})
			j++
		}
	}
	for k := len(x) - suf; k < len(x); k++ {
		ops = append(ops, op{' ', x[k], k + 1})
	}
	const context = 3
	var b strings.Builder
	last := -1 // index of the last op written
	for k, o := range ops {
		if o.kind == ' ' {
			continue
		}
		from := max(k-context, last+1)
		if from > last+1 && last >= 0 {
			b.WriteString("...\n")
		}
		if from > last+1 || last < 0 {
			fmt.Fprintf(&b, "@@ near line %d @@\n", ops[from].line)
		}
		for _, c := range ops[from:k] {
			b.WriteString(string(c.kind) + c.text + "\n")
		}
		b.WriteString(string(o.kind) + o.text + "\n")
		last = k
		for n := k + 1; n < len(ops) && n <= k+context && ops[n].kind == ' '; n++ {
			b.WriteString(" " + ops[n].text + "\n")
			last = n
		}
	}
	return b.String()
}
