package idempotency_test

import (
	"errors"
	"strings"
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

// TestCanonicalJSONRefusesLoneSurrogates: the decoder turns a \u escape of
// half a surrogate pair into U+FFFD, so {"a":"\ud800"}, {"a":"\udfff"} and
// {"a":"\ufffd"} would share a fingerprint. Half pairs are refused; whole
// pairs, and U+FFFD itself, are accepted.
func TestCanonicalJSONRefusesLoneSurrogates(t *testing.T) {
	for _, in := range []string{`{"a":"\ud800"}`, `{"a":"\udfff"}`, `"\uD83D"`, `"\ud83d\u0041"`, `"x\ud83dy"`,
		`{"\udc00":1}`, `"\ude00\ud83d"`, `["\\", "\ud800"]`} {
		if out, err := idempotency.CanonicalJSON([]byte(in)); !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("CanonicalJSON(%s) = %q, %v; want ErrInvalid", in, out, err)
		}
	}
	for in, want := range map[string]string{
		`"\ud83d\ude00"`:         "\"\U0001F600\"",
		`"\uD83D\uDE00"`:         "\"\U0001F600\"",
		`"\ufffd"`:               "\"\uFFFD\"",
		`"\\ud800"`:              `"\\ud800"`, // an escaped backslash, then text
		`{"a":"\"\ud83d\ude00"}`: "{\"a\":\"\\\"\U0001F600\"}",
	} {
		out, err := idempotency.CanonicalJSON([]byte(in))
		if err != nil || string(out) != want {
			t.Errorf("CanonicalJSON(%s) = %q, %v; want %q", in, out, err, want)
		}
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

// TestCanonicalJSONNumbers: numbers are written by their exact decimal
// value, so the same number in another form gets the same bytes, and two
// numbers that float64 would round to one stay apart.
func TestCanonicalJSONNumbers(t *testing.T) {
	for in, want := range map[string]string{
		`1`: `1`, `1.0`: `1`, `1e0`: `1`, `10E-1`: `1`, `0.1e1`: `1`, `1.50`: `1.5`, `-0`: `0`, `-0.0e5`: `0`,
		`100`: `100`, `1e2`: `100`, `-12.340`: `-12.34`, `0.000001`: `0.000001`, `1e-7`: `1e-7`,
		`100000000000000000000`: `100000000000000000000`, `1e21`: `1e21`, `123.456e25`: `1.23456e27`,
		`12345678901234567890123`: `1.2345678901234567890123e22`, `1e400`: `1e400`, `-1E-400`: `-1e-400`,
		`1e99999999999999999999`: `1e99999999999999999999`,
	} {
		got, err := idempotency.CanonicalJSON([]byte(in))
		if err != nil || string(got) != want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
	a, _ := idempotency.CanonicalJSON([]byte(`12345678901234567890123`))
	b, _ := idempotency.CanonicalJSON([]byte(`12345678901234567890124`))
	if string(a) == string(b) {
		t.Errorf("two numbers float64 cannot tell apart got one form: %s", a)
	}
}

// TestCanonicalJSONForm: key order, white space and string escapes do not
// matter; the output is what encoding/json writes for the value (members
// sorted, no HTML escaping), so fingerprints of documents without numbers
// in another form are what they always were.
func TestCanonicalJSONForm(t *testing.T) {
	for in, want := range map[string]string{
		`{"b":1,"a":[true,null,"x"]}`:                  `{"a":[true,null,"x"],"b":1}`,
		" { \"a\" : { \"d\" : {} , \"c\" : [ ] } } \n": `{"a":{"c":[],"d":{}}}`,
		`{"<>&":"\u2028\u00e9\t"}`:                     `{"<>&":"\u2028é\t"}`,
		`"\ud83d\ude00"`:                               `"😀"`,
	} {
		got, err := idempotency.CanonicalJSON([]byte(in))
		if err != nil || string(got) != want {
			t.Errorf("CanonicalJSON(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
}

// TestCanonicalJSONRefusesDuplicateMembers: parsers disagree which of two
// members with one name counts, so such a document has no canonical form.
func TestCanonicalJSONRefusesDuplicateMembers(t *testing.T) {
	for _, in := range []string{`{"a":1,"a":2}`, `{"a":1,"b":{"c":1,"c":1}}`, `[{"x":1,"y":2,"x":1}]`} {
		if out, err := idempotency.CanonicalJSON([]byte(in)); !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want ErrInvalid", in, out, err)
		}
	}
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	if _, err := idempotency.CanonicalJSON([]byte(deep)); !errors.Is(err, idempotency.ErrInvalid) {
		t.Errorf("10001 levels: %v, want ErrInvalid", err)
	}
}
