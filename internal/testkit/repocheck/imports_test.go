package repocheck

import (
	"encoding/json"
	"os/exec"
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
	for _, p := range list(t, "./internal/pgerr", "./internal/telemetry", "./internal/tracesql") {
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
