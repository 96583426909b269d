package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/pgfence/pgfence/idempotency"
)

// parseKey accepts the draft's sf-string ("...") and, leniently, a bare token
// of visible ASCII.
func parseKey(v string) (string, error) {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var b strings.Builder
		inner := v[1 : len(v)-1]
		for i := 0; i < len(inner); i++ {
			c := inner[i]
			switch {
			case c == '\\':
				if i+1 >= len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
					return "", errors.New(`a quoted key may escape only " and \`)
				}
				i++
				b.WriteByte(inner[i])
			case c == '"':
				return "", errors.New("unescaped quote inside the key")
			case c < 0x20 || c > 0x7e:
				return "", errors.New("the key must be printable ASCII")
			default:
				b.WriteByte(c)
			}
		}
		v = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			if v[i] <= 0x20 || v[i] > 0x7e || v[i] == '"' || v[i] == ',' || v[i] == ';' {
				return "", errors.New(`the key must be a quoted string ("...") of printable ASCII`)
			}
		}
	}
	if len(v) == 0 || len(v) > maxKeyBytes {
		return "", fmt.Errorf("the key must be 1 to %d characters", maxKeyBytes)
	}
	return v, nil
}

// ScopePrefix starts the scope of every key the middleware stores: the
// service's name and "/" ([Config.Service]), then "http:". Grant it to the
// service's database role (pgfence.grant_prefix), and give it to
// [idempotency.RecoverOptions.ScopePrefix].
func (m *Middleware) ScopePrefix() string { return m.prefix }

// scope keeps keys of different routes and principals apart, under the
// service's prefix. A scope that is too long, or is not text PostgreSQL can
// store (a decoded path or a principal may hold NUL or invalid UTF-8: POST
// /a%00b), is kept as its SHA-256; "http:sha256:" never starts a scope of the
// other form.
func (m *Middleware) scope(route, principal string) string {
	s := fmt.Sprintf("%s%d:%s:%s", m.prefix, len(route), route, principal)
	if len(s) > idempotency.MaxScopeBytes || !validText(s) {
		sum := sha256.Sum256([]byte(s))
		s = m.prefix + "sha256:" + hex.EncodeToString(sum[:])
	}
	return s
}

func validText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// payload is what must match for a duplicate: method, URI (path and query),
// media type and the canonical body.
func payload(r *http.Request, canonical []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n%s\n%s\n%d\n", r.Method, r.URL.RequestURI(), mediaType(r.Header.Get("Content-Type")), len(canonical))
	b.Write(canonical)
	return b.Bytes()
}

// mediaType is a Content-Type in canonical form (type and parameter names
// lower case, parameters sorted; a JSON type's charset=utf-8 dropped, JSON
// being UTF-8 anyway), or the value as sent when it does not parse (or is
// empty).
func mediaType(ct string) string {
	t, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return strings.TrimSpace(ct)
	}
	if isJSON(t) && strings.EqualFold(params["charset"], "utf-8") {
		delete(params, "charset")
	}
	if f := mime.FormatMediaType(t, params); f != "" {
		return f
	}
	return t
}

// isJSON reports whether a media type (as parsed, lower case) is JSON:
// application/json or a structured +json type (application/problem+json,
// application/vnd.x+json).
func isJSON(t string) bool { return t == "application/json" || strings.HasSuffix(t, "+json") }

// defaultCanonicalBody is the canonical JSON of a JSON body, and the body
// as sent otherwise (or when it is not valid JSON: then only the same bytes
// are the same request).
func defaultCanonicalBody(r *http.Request, body []byte) ([]byte, error) {
	t, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if len(body) == 0 || err != nil || !isJSON(t) {
		return body, nil
	}
	if c, err := idempotency.CanonicalJSON(body); err == nil {
		return c, nil
	}
	return body, nil
}
