package idempotency

import (
	"bytes"
	"encoding/json"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzCanonicalJSON: no panics; the canonical form is valid JSON with the
// same value, canonicalizing it again changes nothing, and re-indenting the
// input does not change its fingerprint.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, ` { "a" : 1.50 , "b" : {"d":{},"c":[]} } `, `"\u00e9\ud83d\ude00"`, `"\ud800"`, `"\\\ud800"`, `"\uFFFD"`, `1e400`, `{"a":1,"a":2}`, `[1,2] [3]`, "\"\xff\"", `{"<>&":"\u2028"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := CanonicalJSON(data)
		if err != nil {
			return
		}
		if !utf8.Valid(data) {
			t.Fatalf("CanonicalJSON accepted invalid UTF-8 %q", data)
		}
		if !json.Valid(out) {
			t.Fatalf("CanonicalJSON(%q) = %q: not JSON", data, out)
		}
		// U+FFFD in the canonical form must come from the document: a
		// decoder's replacement (of a bad byte or a lone surrogate) would
		// give two documents one fingerprint.
		if bytes.ContainsRune(out, utf8.RuneError) && !bytes.ContainsRune(data, utf8.RuneError) &&
			!bytes.Contains(bytes.ToLower(data), []byte(`\ufffd`)) {
			t.Fatalf("CanonicalJSON(%q) = %q: a U+FFFD the document does not have", data, out)
		}
		again, err := CanonicalJSON(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", data, out, again, err)
		}
		var in, canon any
		decode := func(b []byte, v *any) error {
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.UseNumber()
			return dec.Decode(v)
		}
		if err := decode(data, &in); err != nil {
			t.Fatal(err)
		}
		if err := decode(out, &canon); err != nil {
			t.Fatal(err)
		}
		if !sameValue(in, canon) {
			t.Fatalf("value changed: %q -> %q", data, out)
		}
		var indented bytes.Buffer
		if err := json.Indent(&indented, bytes.TrimSpace(data), "", "\t "); err == nil {
			re, err := CanonicalJSON(indented.Bytes())
			if err != nil || !bytes.Equal(Fingerprint(re), Fingerprint(out)) {
				t.Fatalf("re-indented %q gets another fingerprint: %q vs %q, %v", data, re, out, err)
			}
		}
	})
}

// sameValue compares two decoded JSON values, numbers by their exact value
// (big.Rat; numbers with an exponent beyond ±1000 only by their text, which
// the canonical form may change: they are not compared).
func sameValue(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || !sameValue(v, w) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameValue(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		if hugeExponent(string(a)) || hugeExponent(string(b)) {
			return true
		}
		x, okx := new(big.Rat).SetString(string(a))
		y, oky := new(big.Rat).SetString(string(b))
		return okx && oky && x.Cmp(y) == 0
	}
	return a == b
}

func hugeExponent(n string) bool {
	_, e, ok := strings.Cut(strings.ToLower(n), "e")
	if !ok {
		return false
	}
	x, err := strconv.Atoi(e)
	return err != nil || x > 1000 || x < -1000
}
