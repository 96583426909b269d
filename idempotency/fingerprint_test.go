package idempotency_test

import (
	"errors"
	"testing"

	"github.com/pgfence/pgfence/idempotency"
)

// TestCanonicalJSONRefusesInvalidUTF8: the decoder would turn every invalid
// byte into U+FFFD, so two different bodies would share a fingerprint and a
// reused key with another payload would replay instead of being refused.
func TestCanonicalJSONRefusesInvalidUTF8(t *testing.T) {
	for _, in := range []string{"{\"a\":\"\xff\"}", "{\"a\":\"\xfe\"}", "\"\xc3\"", "{\"\xff\":1}"} {
		if out, err := idempotency.CanonicalJSON([]byte(in)); !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("CanonicalJSON(%q) = %q, %v; want ErrInvalid", in, out, err)
		}
	}
	// Valid UTF-8, escaped or not, is accepted, and the escapes decode to
	// the same text.
	a, err := idempotency.CanonicalJSON([]byte(`{"a":"é"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := idempotency.CanonicalJSON([]byte(`{"a":"\u00e9"}`))
	if err != nil || string(a) != string(b) {
		t.Fatalf("é and \\u00e9: %q and %q, %v; want the same bytes", a, b, err)
	}
}

// TestCanonicalJSONRefusesTrailingData: a document with anything but white
// space after its value is not JSON. Accepting a stray closing bracket
// would give {"a":1}] the fingerprint of {"a":1}: a corrected retry under
// the same key would replay the stored answer to the malformed request
// instead of being refused as another payload.
func TestCanonicalJSONRefusesTrailingData(t *testing.T) {
	for _, in := range []string{`{"a":1}]`, `{"a":1}}`, `[1]]`, `1]`, `{} x`, `[1] [2]`, `"a"}`} {
		if out, err := idempotency.CanonicalJSON([]byte(in)); !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("CanonicalJSON(%q) = %q, %v; want ErrInvalid", in, out, err)
		}
	}
	for _, in := range []string{` {"a":1} `, "{\"a\":1}\n", "\t[1]\r\n"} {
		if _, err := idempotency.CanonicalJSON([]byte(in)); err != nil {
			t.Errorf("CanonicalJSON(%q): %v", in, err)
		}
	}
}
