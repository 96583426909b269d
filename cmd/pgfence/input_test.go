package main

import (
	"net/url"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// Input no command could act on is a usage error (exit 2, with a hint), said
// before anything changes, never a raw server error or a bare exit 1.
func TestBadInputIsAUsageError(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	for name, args := range map[string][]string{
		"gc batch above int32":  {"keys", "gc", "--batch-size", "9223372036854775807"},
		"floor reason too long": {"floor", "raise", "--to", "5", "--reason", strings.Repeat("x", 1001)},
		"key not UTF-8":         {"keys", "show", "\xff", "k"},
		"scope not UTF-8":       {"keys", "show", "s", "\xff"},
		"resource not UTF-8":    {"fences", "show", "\xff"},
		"task key not UTF-8":    {"tasks", "list", "--key", "\xff"},
		"task prefix with NUL":  {"tasks", "list", "--prefix", "a\x00b"},
		"task key too long":     {"tasks", "list", "--key", strings.Repeat("k", 481)},
		"task after negative":   {"tasks", "list", "--after", "-1"},
		"task id too large":     {"tasks", "show", "9223372036854775808"},
		"task reason too long":  {"tasks", "retry", "1", "--reason", strings.Repeat("x", 1001)},
	} {
		code, out, errOut := cli(t, environ, args...)
		if code != exitUsage || !strings.Contains(errOut, "hint:") || strings.Contains(errOut, "22021") || strings.Contains(errOut, "SQLSTATE") {
			t.Errorf("%s: code %d, want %d with a hint and no server error\n%s%s", name, code, exitUsage, out, errOut)
		}
	}
}

// A database name is quoted for the shell in the command the CLI suggests.
func TestSuggestedCreatedbIsQuoted(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/x; rm -rf ~ #"
	code, _, errOut := cli(t, map[string]string{"DATABASE_URL": u.String()}, "migrate", "status")
	if code == exitOK || !strings.Contains(errOut, `createdb -- 'x; rm -rf ~ #'`) {
		t.Fatalf("a missing database with shell characters: code %d\n%s", code, errOut)
	}
}
