package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Fingerprint returns the SHA-256 of payload: what is stored with a key and
// compared with every later request that presents it. Pass a canonical form of
// the request (see [CanonicalJSON]), so that two encodings of the same request
// do not count as different payloads.
func Fingerprint(payload []byte) []byte {
	sum := sha256.Sum256(payload)
	return sum[:]
}

// CanonicalJSON re-encodes one JSON value canonically: object keys sorted, no
// insignificant white space, numbers kept as written. Two documents that differ
// only in key order or spacing get the same bytes (and so the same
// [Fingerprint]). Input that is not valid UTF-8 is refused: the decoder would
// replace each bad byte with U+FFFD, so two different requests would share a
// fingerprint.
func CanonicalJSON(data []byte) ([]byte, error) {
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: canonical JSON: not valid UTF-8", ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: canonical JSON: %w", ErrInvalid, err)
	}
	// Only white space may follow the value (Decoder.More would let a stray
	// ] or } through).
	if len(bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n")) > 0 {
		return nil, fmt.Errorf("%w: canonical JSON: data after the value", ErrInvalid)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("%w: canonical JSON: %w", ErrInvalid, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
