package idemhttp

import (
	"strings"
	"testing"
)

// FuzzParseKey: the Idempotency-Key parser never panics, accepts only 1 to
// maxKeyBytes of printable ASCII, and reads back every such key sent as a
// quoted sf-string.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `abc`, `"a\"b\\c"`, `"`, `""`, `"\x"`, " \"k\" ", "k;x", strings.Repeat("k", 256), "\"é\""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, err := parseKey(s)
		if err == nil {
			if len(key) == 0 || len(key) > maxKeyBytes {
				t.Fatalf("parseKey(%q) = %q: %d bytes", s, key, len(key))
			}
			for i := 0; i < len(key); i++ {
				if key[i] < 0x20 || key[i] > 0x7e {
					t.Fatalf("parseKey(%q) = %q: byte %#x is not printable ASCII", s, key, key[i])
				}
			}
		}
		printable := s != "" && len(s) <= maxKeyBytes
		for i := 0; i < len(s); i++ {
			printable = printable && s[i] >= 0x20 && s[i] <= 0x7e
		}
		if printable {
			quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
			if got, err := parseKey(quoted); err != nil || got != s {
				t.Fatalf("parseKey(%q) = %q, %v; want %q", quoted, got, err, s)
			}
		}
	})
}
