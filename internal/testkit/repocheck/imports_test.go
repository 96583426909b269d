package repocheck

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/pgfence/pgfence"

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// list runs go list -json over patterns.
func list(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Imports,Deps"}, patterns...)...)
	cmd.Dir = "../../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestImportsRunOneWay: the libraries never depend on the test kit or the
// CLI's tooling, the internal foundation they share depends on no public
// package, and the examples import public packages only, so a user who
// copies one can compile it.
func TestImportsRunOneWay(t *testing.T) {
	libraries := []string{"leases", "pgfence", "idempotency", "idempotency/idemhttp", "migrations"}
	for _, p := range list(t, "./leases/...", "./pgfence", "./idempotency/...", "./migrations") {
		for _, d := range p.Deps {
			if strings.HasPrefix(d, module+"/internal/testkit") || strings.HasPrefix(d, module+"/cmd/") {
				t.Errorf("library %s depends on %s", p.ImportPath, d)
			}
		}
	}
	for _, p := range list(t, "./internal/pgerr", "./internal/driver", "./internal/telemetry") {
		for _, d := range p.Deps {
			for _, lib := range libraries {
				if d == module+"/"+lib {
					t.Errorf("foundation %s depends on the public package %s", p.ImportPath, d)
				}
			}
		}
	}
	for _, p := range list(t, "./examples/...") {
		for _, i := range p.Imports {
			if strings.HasPrefix(i, module+"/internal/") {
				t.Errorf("example %s imports %s: a user who copies it cannot compile it", p.ImportPath, i)
			}
		}
	}
}

// TestNestedExamplesImportPublicPackages: the database/sql and ORM examples
// are a module of their own, which ./... (and go list) at the root does not
// enter; their imports are read from the source instead. They use pgfence's
// public packages only, and the ORMs they use stay out of the root module.
func TestNestedExamplesImportPublicPackages(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	files, err := filepath.Glob(filepath.Join(root, "examples", "orm", "*", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("found %d files in examples/orm: the check no longer sees the examples", len(files))
	}
	for _, path := range files {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if i, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(i, module+"/internal/") {
				t.Errorf("%s imports %s: a user who copies it cannot compile it", path, i)
			}
		}
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, orm := range []string{"gorm.io/", "github.com/jmoiron/sqlx", "github.com/uptrace/bun"} {
		if strings.Contains(string(gomod), orm) {
			t.Errorf("the root go.mod requires %s: the ORMs belong to examples/orm's module", orm)
		}
	}
}

// TestProgramsLinkNoDocker: a program that uses pgfencetest (the examples
// run on its throwaway database) and never starts a container does not link
// testcontainers or Docker's client; only pgfencetest/container does.
func TestProgramsLinkNoDocker(t *testing.T) {
	for _, p := range list(t, "./examples/quickstart", "./pgfence/pgfencetest") {
		for _, d := range p.Deps {
			if strings.Contains(d, "testcontainers") || strings.Contains(d, "docker") {
				t.Errorf("%s depends on %s", p.ImportPath, d)
			}
		}
	}
	var docker bool
	for _, p := range list(t, "./pgfence/pgfencetest/container") {
		for _, d := range p.Deps {
			docker = docker || strings.Contains(d, "testcontainers")
		}
	}
	if !docker {
		t.Error("pgfencetest/container does not reach testcontainers: the check above proves nothing")
	}
}
