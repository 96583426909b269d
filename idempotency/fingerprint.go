package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxJSONDepth bounds the nesting of a document CanonicalJSON accepts, as
// encoding/json bounds what it decodes.
const maxJSONDepth = 10000

// CanonicalJSON re-encodes one JSON value canonically, so that two documents
// that encode the same value get the same bytes (and so the same
// fingerprint, the SHA-256 stored with a key):
//
//   - object members sorted by name (byte order of their UTF-8), no
//     insignificant white space;
//   - strings with the escapes decoded and re-encoded one way (only ", \ and
//     control characters escaped; U+2028 and U+2029 as \u2028 and \u2029);
//   - numbers by their exact decimal value, without rounding through
//     float64: 1, 1.0, 1e0 and 10E-1 are all 1; 1.50 is 1.5; -0 is 0; 100
//     is 100 and 1e21 is 1e21 (plain digits up to 21 of them, an exponent
//     beyond); 12345678901234567890123 and 12345678901234567890124 stay
//     different numbers.
//
// A document whose value is not one JSON value (trailing data), that has an
// object with the same member name twice (parsers disagree which one
// counts), is nested deeper than 10000 levels, is not valid UTF-8, or has a
// \u escape of half a surrogate pair (a decoder replaces each bad byte, and
// each lone surrogate, with U+FFFD, so two different requests would share a
// fingerprint) is refused with [ErrInvalid].
func CanonicalJSON(data []byte) ([]byte, error) {
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: canonical JSON: not valid UTF-8", ErrInvalid)
	}
	if loneSurrogate(data) {
		return nil, fmt.Errorf("%w: canonical JSON: a \\u escape of half a surrogate pair", ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out bytes.Buffer
	if err := canonicalValue(dec, &out, 0); err != nil {
		return nil, fmt.Errorf("%w: canonical JSON: %w", ErrInvalid, err)
	}
	// Only white space may follow the value (Decoder.More would let a stray
	// ] or } through).
	if len(bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n")) > 0 {
		return nil, fmt.Errorf("%w: canonical JSON: data after the value", ErrInvalid)
	}
	return out.Bytes(), nil
}

// loneSurrogate reports whether data has a \u escape of a high surrogate not
// followed by one of a low surrogate, or of a low surrogate alone. A document
// the decoder accepts has backslashes only inside strings, each starting an
// escape; malformed escapes are left to the decoder, which refuses them.
func loneSurrogate(data []byte) bool {
	for i := 0; i+1 < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		i++ // the escaped character: \\ and \" are skipped whole
		switch surrogate(data, i) {
		case 'l':
			return true
		case 'h':
			if i+5 >= len(data) || data[i+5] != '\\' || surrogate(data, i+6) != 'l' {
				return true
			}
			i += 10 // the low half's last digit
		}
	}
	return false
}

// surrogate returns which half of a surrogate pair the \u escape whose u is
// at data[at] is: 'h' (high), 'l' (low), or 0 for none.
func surrogate(data []byte, at int) byte {
	if at+5 > len(data) || data[at] != 'u' {
		return 0
	}
	r, err := strconv.ParseUint(string(data[at+1:at+5]), 16, 16)
	switch {
	case err != nil || r < 0xD800 || r > 0xDFFF:
		return 0
	case r < 0xDC00:
		return 'h'
	}
	return 'l'
}

// canonicalValue reads one value from dec and writes its canonical form.
func canonicalValue(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	if depth >= maxJSONDepth {
		return errors.New("nested too deeply")
	}
	tok, err := dec.Token()
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	} else if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '[':
			out.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if err := canonicalValue(dec, out, depth+1); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil { // ]
				return err
			}
			out.WriteByte(']')
		case '{':
			type member struct {
				name  string
				value []byte
			}
			var members []member
			for dec.More() {
				tok, err := dec.Token()
				if err != nil {
					return err
				}
				name, _ := tok.(string) // the decoder gives a string, or an error
				var value bytes.Buffer
				if err := canonicalValue(dec, &value, depth+1); err != nil {
					return err
				}
				members = append(members, member{name, value.Bytes()})
			}
			if _, err := dec.Token(); err != nil { // }
				return err
			}
			slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.name, b.name) })
			out.WriteByte('{')
			for i, m := range members {
				if i > 0 {
					if m.name == members[i-1].name {
						return fmt.Errorf("object member %q appears twice", m.name)
					}
					out.WriteByte(',')
				}
				writeString(out, m.name)
				out.WriteByte(':')
				out.Write(m.value)
			}
			out.WriteByte('}')
		} // a value is never ] or }: the decoder refuses them there
	case string:
		writeString(out, v)
	case json.Number:
		out.WriteString(canonicalNumber(string(v)))
	case bool:
		out.WriteString(strconv.FormatBool(v))
	case nil:
		out.WriteString("null")
	}
	return nil
}

// writeString writes s as a JSON string the way encoding/json does without
// HTML escaping.
func writeString(out *bytes.Buffer, s string) {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)           // a valid UTF-8 string always encodes
	out.Truncate(out.Len() - 1) // Encode's newline
}

// canonicalNumber writes a JSON number (as validated by the decoder) by its
// exact decimal value: the significant digits without leading or trailing
// zeros, and the position of the decimal point.
func canonicalNumber(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mantissa, expPart, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, fracPart, _ := strings.Cut(mantissa, ".")
	digits := strings.TrimLeft(intPart+fracPart, "0")
	if digits == "" {
		return "0"
	}
	// value = digits × 10^exp
	exp := new(big.Int)
	if expPart != "" {
		exp.SetString(strings.TrimPrefix(expPart, "+"), 10) // the decoder validated it
	}
	exp.Sub(exp, big.NewInt(int64(len(fracPart))))
	trimmed := strings.TrimRight(digits, "0")
	exp.Add(exp, big.NewInt(int64(len(digits)-len(trimmed))))
	digits = trimmed

	// point is where the decimal point goes, counted from the left of
	// digits: value = 0.digits × 10^point.
	point := new(big.Int).Add(exp, big.NewInt(int64(len(digits))))
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	switch p := point.Int64(); {
	case !point.IsInt64() || p > 21 || p <= -6:
		b.WriteByte(digits[0])
		if len(digits) > 1 {
			b.WriteByte('.')
			b.WriteString(digits[1:])
		}
		b.WriteByte('e')
		b.WriteString(new(big.Int).Sub(point, big.NewInt(1)).String())
	case p >= int64(len(digits)):
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", int(p)-len(digits)))
	case p > 0:
		b.WriteString(digits[:p])
		b.WriteByte('.')
		b.WriteString(digits[p:])
	default:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", int(-p)))
		b.WriteString(digits)
	}
	return b.String()
}
