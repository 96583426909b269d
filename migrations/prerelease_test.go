package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/pgfence/pgfence/migrations"
)

// preReleaseFS returns the migrations of the pre-release builds, read from
// git history: the tree just before the commit that removed the last of
// them. Without git or that history the test is skipped (it fails under
// CI=true, which runs on a full clone).
func preReleaseFS(t *testing.T) fstest.MapFS {
	t.Helper()
	unavailable := func(format string, args ...any) {
		t.Helper()
		msg := "pre-release migrations from git history: " + fmt.Sprintf(format, args...)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	git := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("git", args...).Output()
		if err != nil {
			unavailable("git %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	root := strings.TrimSpace(git("rev-parse", "--show-toplevel"))
	const last = "migrations/00017_protect_guard_after.sql"
	removedBy := strings.TrimSpace(git("-C", root, "log", "-1", "--format=%H", "--diff-filter=D", "--", last))
	if removedBy == "" {
		unavailable("no commit removes %s (a shallow clone?)", last)
	}
	fsys := fstest.MapFS{}
	name := regexp.MustCompile(`^migrations/\d{5}_[a-z0-9_]+\.sql$`)
	for _, p := range strings.Fields(git("-C", root, "ls-tree", "--name-only", removedBy+"^", "migrations/")) {
		if name.MatchString(p) {
			fsys[path.Base(p)] = &fstest.MapFile{Data: []byte(git("-C", root, "show", removedBy+"^:"+p))}
		}
	}
	if len(fsys) != 17 {
		t.Fatalf("%s^ holds %d pre-release migrations, want 17", removedBy, len(fsys))
	}
	return fsys
}

// A database migrated by a pre-release build, at any of its versions, is
// refused by every Migrator call and by the scripts, with an error that says
// what it is and what to do; nothing in it changes. At versions 1 to 4 its
// version table looks like the current one's, at 17 its catalog does.
func TestPreReleaseSchemaRefused(t *testing.T) {
	t.Parallel()
	old := preReleaseFS(t)
	for _, version := range []int64{1, 4, 12, 17} {
		t.Run(fmt.Sprint("version ", version), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := blankDatabase(t)
			if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA `+migrations.Schema); err != nil {
				t.Fatal(err)
			}
			store, err := database.NewStore(database.DialectPostgres, migrations.VersionTable)
			if err != nil {
				t.Fatal(err)
			}
			sqlDB := stdlib.OpenDBFromPool(db.Pool)
			defer sqlDB.Close()
			p, err := goose.NewProvider("", sqlDB, old, goose.WithStore(store), goose.WithDisableGlobalRegistry(true))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.UpTo(ctx, version); err != nil {
				t.Fatalf("install the pre-release migrations up to %d: %v", version, err)
			}
			state := func() string {
				t.Helper()
				var versions string
				if err := db.Pool.QueryRow(ctx, `SELECT string_agg(version_id::text, ',' ORDER BY id) FROM `+migrations.VersionTable).Scan(&versions); err != nil {
					t.Fatal(err)
				}
				return versions + "\n" + strings.Join(snapshot(t, db.Pool), "\n")
			}
			before := state()

			refused := func(call string, err error) {
				t.Helper()
				if !errors.Is(err, migrations.ErrPreReleaseSchema) || errors.Is(err, migrations.ErrSchemaTooNew) {
					t.Errorf("%s: %v, want ErrPreReleaseSchema", call, err)
				} else if !strings.Contains(err.Error(), "DROP SCHEMA pgfence CASCADE") {
					t.Errorf("%s: %v, want the way out", call, err)
				}
			}
			m := newMigrator(t, db.Pool)
			_, err = m.Up(ctx)
			refused("Up", err)
			_, err = m.Status(ctx)
			refused("Status", err)
			_, _, err = m.Version(ctx)
			refused("Version", err)
			_, err = m.Pending(ctx)
			refused("Pending", err)
			_, err = m.DownTo(ctx, 0)
			refused("DownTo", err)
			// The scripts that apply to a database at this version: up from it
			// (from 0 when no migration has it), down from it (from the newest).
			from, downFrom := int64(0), migrations.Latest()
			if slices.Contains(migrations.Versions(), version) {
				from, downFrom = version, version
			}
			for _, script := range []struct{ from, to int64 }{{from, migrations.Latest()}, {downFrom, 0}} {
				sql, err := migrations.Script(script.from, script.to)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := db.Pool.Exec(ctx, sql); err == nil || !strings.Contains(err.Error(), "pre-release build") {
					t.Errorf("script from %d to %d: %v, want a refusal", script.from, script.to, err)
				}
			}
			if after := state(); after != before {
				t.Fatalf("a refused call changed the schema:\n%s", diff(strings.Split(before, "\n"), strings.Split(after, "\n")))
			}

			// The way out the error names.
			if _, err := db.Pool.Exec(ctx, `DROP SCHEMA pgfence CASCADE`); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Up(ctx); err != nil {
				t.Fatalf("Up after DROP SCHEMA: %v", err)
			}
			if current, latest, err := m.Version(ctx); err != nil || current != latest {
				t.Fatalf("after DROP SCHEMA and Up: version %d of %d, %v", current, latest, err)
			}
		})
	}
}
