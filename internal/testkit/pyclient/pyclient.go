// Package pyclient runs Python scripts that talk to PostgreSQL with psycopg2,
// so that tests can check pgfence's SQL surface as a client in another
// language meets it: psycopg2 opens a transaction before the first statement
// unless autocommit is set, which is where SQL clients differ most from the
// Go packages.
package pyclient

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Python returns a python3 that can import psycopg2, or skips t (fails it
// under CI=true, where the package python3-psycopg2 must be installed).
func Python(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(p)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import psycopg2").Run() == nil {
			return path
		}
	}
	const msg = "no python3 with psycopg2 (Debian: apt-get install python3-psycopg2)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// Run runs script with python3 and psycopg2, with the database URL as its
// first argument, and returns its standard output, one string per line. A
// script that fails fails t with its standard error.
func Run(t testing.TB, url, script string) []string {
	t.Helper()
	py := Python(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", script, url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("python script failed: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	return strings.Split(strings.TrimSpace(stdout.String()), "\n")
}
