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
