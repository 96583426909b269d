package main

import (
	"net/url"
	"regexp"
	"strings"
)

// Patterns of a password in a connection string, as pgx or a driver may echo
// it back in an error. Redaction is greedy: it may hide more than the
// password, never less.
var (
	// postgres://user:PASSWORD@host — up to the last '@' of the run, since a
	// careless URL may carry an unescaped '@' in its password.
	urlPassword = regexp.MustCompile(`(?i)(://[^:/@\s]*:)\S*@`)
	// password=PASSWORD or password='PASS WORD' (key=value strings, and
	// ?password= / &sslpassword= in URLs).
	kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&]*)`)
)

// redact hides every password in s, a message that may quote a connection
// string: the URL's user password, password= and sslpassword= settings. The
// secrets, when known (the parsed password), are hidden wherever they occur,
// also percent-encoded.
func redact(s string, secrets ...string) string {
	for _, secret := range secrets {
		if len(secret) < 3 { // too short to hide without hiding everything else
			continue
		}
		s = strings.ReplaceAll(s, secret, "xxxxx")
		if esc := url.QueryEscape(secret); esc != secret {
			s = strings.ReplaceAll(s, esc, "xxxxx")
		}
		if esc := url.PathEscape(secret); esc != secret {
			s = strings.ReplaceAll(s, esc, "xxxxx")
		}
	}
	s = urlPassword.ReplaceAllString(s, "${1}xxxxx@")
	return kvPassword.ReplaceAllString(s, "${1}xxxxx")
}
