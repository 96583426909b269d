package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

func TestInterspersed(t *testing.T) {
	e := &env{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	for _, tc := range []struct {
		args, want []string
	}{
		{[]string{"KEY", "--json"}, []string{"--json", "--", "KEY"}},
		{[]string{"KEY", "--reason", "r", "--force"}, []string{"--reason", "r", "--force", "--", "KEY"}},
		{[]string{"--reason=r", "KEY"}, []string{"--reason=r", "--", "KEY"}},
		{[]string{"KEY", "--", "-not-a-flag"}, []string{"--", "KEY", "-not-a-flag"}},
		// A value flag given last has no value: Parse must see it last, not
		// followed by "--" (which it would take as the value).
		{[]string{"KEY", "--force", "--reason"}, []string{"--force", "--reason"}},
	} {
		fs := newFlags(e, "t", "t", "")
		fs.Bool("json", false, "")
		fs.Bool("force", false, "")
		fs.String("reason", "", "")
		if got := interspersed(fs, tc.args); !slices.Equal(got, tc.want) {
			t.Errorf("interspersed(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

// A string flag given last without its value is a usage error, before the
// command connects or changes anything: it once took "--" as the value, and
// `leases release KEY --force --reason` released a live lease with reason "--".
func TestFlagWithoutValueLast(t *testing.T) {
	environ := map[string]string{"DATABASE_URL": "postgres://pgfence@127.0.0.1:1/none"}
	for _, args := range [][]string{
		{"leases", "release", "jobs/c", "--force", "--reason"},
		{"leases", "pause", "billing/", "--reason"},
		{"floor", "raise", "--reason"},
		{"tables", "protect", "stock", "--resource-column", "sku", "--prefix"},
		{"leases", "show", "jobs/a", "--database-url"},
	} {
		code, _, errOut := cli(t, environ, args...)
		if code != exitUsage || !strings.Contains(errOut, "flag needs an argument") {
			t.Errorf("%q: code %d, want %d with \"flag needs an argument\":\n%s", args, code, exitUsage, errOut)
		}
	}
}

// Asked for, the help goes to stdout; without a command it is a usage error
// and goes to stderr.
func TestHelpOutput(t *testing.T) {
	code, out, errOut := cli(t, nil)
	if code != exitUsage || out != "" || !strings.Contains(errOut, "Exit codes:") {
		t.Errorf("pgfence without arguments: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = cli(t, nil, "help")
	if code != exitOK || errOut != "" || !strings.Contains(out, "Exit codes:") {
		t.Errorf("pgfence help: code %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// A bad flag is reported like every other error, in one line plus a hint,
// without the usage; -h prints the usage and exits 0.
func TestFlagErrorsAreOneLine(t *testing.T) {
	code, out, errOut := cli(t, nil, "leases", "list", "--nope")
	if code != exitUsage || out != "" || strings.Contains(errOut, "Usage:") ||
		errOut != "pgfence: flag provided but not defined: -nope\nhint: run the command with -h for its flags\n" {
		t.Errorf("bad flag: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = cli(t, nil, "leases", "list", "-h")
	if code != exitOK || !strings.Contains(errOut, "Usage: pgfence leases") || !strings.Contains(errOut, "-database-url") {
		t.Errorf("-h: code %d, stderr %q", code, errOut)
	}
	// A subcommand's -h shows its own arguments and flags, not its siblings'.
	code, _, errOut = cli(t, nil, "leases", "pause", "-h")
	if code != exitOK || !strings.Contains(errOut, "leases pause PREFIX --reason TEXT") || strings.Contains(errOut, "-force") || strings.Contains(errOut, "-history") {
		t.Errorf("leases pause -h: code %d, stderr %q", code, errOut)
	}
	// A noun's help lists its commands.
	if code, _, errOut = cli(t, nil, "fences", "help"); code != exitOK || !strings.Contains(errOut, "pgfence fences show RESOURCE") || !strings.Contains(errOut, "pgfence fences list") {
		t.Errorf("fences help: code %d, stderr %q", code, errOut)
	}
	if code, _, errOut = cli(t, nil, "fences"); code != exitUsage || !strings.Contains(errOut, "pgfence fences list") || !strings.Contains(errOut, "needs a subcommand: list or show") {
		t.Errorf("fences without a subcommand: code %d, stderr %q", code, errOut)
	}
	if code, _, errOut = cli(t, nil, "leases", "list", "--force"); code != exitUsage {
		t.Errorf("leases list --force: code %d, want a usage error: %q", code, errOut)
	}
}

// `pgfence help` lists every noun and every command.
func TestHelpListsEveryCommand(t *testing.T) {
	_, out, _ := cli(t, nil, "help")
	for _, c := range commands() {
		want := "  " + c.noun + " "
		if c.verb != "" {
			want = "    " + c.usageLine() + "\n"
		}
		if !strings.Contains(out, want) {
			t.Errorf("pgfence help lacks %q:\n%s", want, out)
		}
	}
}
