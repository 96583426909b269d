package pgfence

import (
	"database/sql"
	"database/sql/driver"
	"strconv"
	"strings"
)

// interpolate returns query with each placeholder $n replaced by a constant
// that PostgreSQL reads exactly as it reads lib/pq's parameter: lib/pq sends
// every argument as text of unspecified type, and the server resolves such a
// parameter from its context just as it resolves a quoted constant of
// unknown type. The result is one statement that can travel in one simple
// query with the fence's check: one round trip and one implicit transaction.
//
// It declines (ok false), and the statement is sent with its arguments as
// usual, whenever the equivalence is not certain:
//
//   - an argument whose text lib/pq chooses by the parameter's type, which
//     only the server knows ([]byte, a string with a backslash, which a
//     bytea parameter would read otherwise), or that lib/pq formats its own
//     way (time.Time, slices, a value with BinaryValue), or a named or
//     output argument;
//   - a placeholder used twice (the server gives a parameter one type, a
//     constant gets one per use) or an argument never used (the server
//     refuses those);
//   - anything the scan below does not follow with certainty: a backslash
//     anywhere (escape strings, standard_conforming_strings off), a dollar
//     sign that is not a placeholder (dollar quoting, identifiers), a
//     placeholder next to a quote or an identifier or followed by a field
//     selection or subscript ($1.f, $1[1]), an unterminated quote or
//     comment, or a second statement.
//
// The scan skips quoted constants and identifiers ('...', "...", their
// doubled quotes) and comments (--, nested /* */), so a "$1" inside them is
// left alone. Each constant is written with a space on either side, so that
// it cannot join a neighbouring token.
//
// pgfence's own statements take writeWithLiterals instead: their text holds
// no quotes or comments to scan, and their parameters' types are known
// (text, bigint), so any string can be an escape-string constant there.
func interpolate(query string, args []any) (string, bool) {
	if strings.ContainsAny(query, "\\\x00") {
		return "", false
	}
	used := make([]bool, len(args))
	var b strings.Builder
	b.Grow(len(query) + 16*len(args))
	ended := false // a ';' was seen: only blanks and comments may follow
	for i := 0; i < len(query); {
		c := query[i]
		switch {
		case c == '\'' || c == '"':
			j := closingQuote(query, i)
			if j < 0 || ended {
				return "", false
			}
			b.WriteString(query[i:j])
			i = j
		case c == '-' && strings.HasPrefix(query[i:], "--"):
			j := strings.IndexByte(query[i:], '\n')
			if j < 0 {
				j = len(query)
			} else {
				j += i
			}
			b.WriteString(query[i:j])
			i = j
		case c == '/' && strings.HasPrefix(query[i:], "/*"):
			j := commentEnd(query, i)
			if j < 0 {
				return "", false
			}
			b.WriteString(query[i:j])
			i = j
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			b.WriteByte(c)
			i++
		case ended:
			return "", false // a second statement
		case c == ';':
			ended = true
			b.WriteByte(c)
			i++
		case c == '$':
			j := i + 1
			for j < len(query) && query[j] >= '0' && query[j] <= '9' {
				j++
			}
			if j == i+1 || j-i > 6 || query[i+1] == '0' || (i > 0 && !placeholderNeighbour(query[i-1])) ||
				(j < len(query) && (!placeholderNeighbour(query[j]) || query[j] == '.' || query[j] == '[')) {
				return "", false
			}
			n, _ := strconv.Atoi(query[i+1 : j])
			if n < 1 || n > len(args) || used[n-1] {
				return "", false
			}
			used[n-1] = true
			b.WriteByte(' ')
			if !writeTextConstant(&b, args[n-1]) {
				return "", false
			}
			b.WriteByte(' ')
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	for _, u := range used {
		if !u {
			return "", false
		}
	}
	return b.String(), true
}

// closingQuote returns the index after the quote that closes the quoted
// constant or identifier opening at query[i] (a doubled quote stands for
// itself), or -1.
func closingQuote(query string, i int) int {
	q := query[i]
	for j := i + 1; j < len(query); j++ {
		if query[j] != q {
			continue
		}
		if j+1 < len(query) && query[j+1] == q {
			j++
			continue
		}
		return j + 1
	}
	return -1
}

// commentEnd returns the index after the block comment opening at query[i]
// (PostgreSQL's nest), or -1.
func commentEnd(query string, i int) int {
	depth := 0
	for j := i; j+1 < len(query); j++ {
		switch {
		case query[j] == '/' && query[j+1] == '*':
			depth++
			j++
		case query[j] == '*' && query[j+1] == '/':
			depth--
			j++
			if depth == 0 {
				return j + 1
			}
		}
	}
	return -1
}

// placeholderNeighbour reports whether c may stand right before or after a
// placeholder without the scan having to know more: not part of an
// identifier or a number (PostgreSQL reads "a$1" as one identifier), and not
// a quote or an ampersand, which a constant could join (U&'...').
func placeholderNeighbour(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c >= 0x80:
		return false
	}
	switch c {
	case '_', '$', '\'', '"', '&':
		return false
	}
	return true
}

// writeTextConstant writes the constant for arg: the text lib/pq sends for
// it, quoted, or NULL. Conversion follows database/sql's for a driver that
// takes the default (lib/pq does for every kind handled here).
func writeTextConstant(b *strings.Builder, arg any) bool {
	switch arg.(type) {
	case sql.NamedArg, *sql.NamedArg, sql.Out, *sql.Out, driver.NamedValue, *driver.NamedValue,
		interface{ BinaryValue() ([]byte, error) }:
		return false
	}
	v, err := driver.DefaultParameterConverter.ConvertValue(arg)
	if err != nil {
		return false
	}
	var text string
	switch v := v.(type) {
	case nil:
		b.WriteString("NULL")
		return true
	case int64:
		text = strconv.FormatInt(v, 10)
	case float64:
		text = strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		text = strconv.FormatBool(v)
	case string:
		if strings.ContainsAny(v, "\\\x00") {
			return false
		}
		text = v
	default: // []byte, time.Time
		return false
	}
	b.WriteByte('\'')
	b.WriteString(strings.ReplaceAll(text, "'", "''"))
	b.WriteByte('\'')
	return true
}
