package pgfence

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// maxIdentifierLen is the longest table, schema or column name the helpers
// accept, in bytes: PostgreSQL's NAMEDATALEN - 1. PostgreSQL silently
// truncates a longer name, which could then name another object, so the
// helpers refuse it instead.
const maxIdentifierLen = 63

// CheckIdentifier reports whether name can be quoted with [pgx.Identifier]
// and then means exactly the object it spells: 1 to 3 parts (table,
// schema.table, database.schema.table), each 1 to 63 bytes
// of valid UTF-8 without NUL bytes. pgx drops NUL bytes when it quotes a
// name and PostgreSQL truncates long ones: both would name another object.
// Quotes, dots, semicolons, backslashes and any other character are fine:
// the name is always quoted. The error wraps [ErrInvalid].
//
// [Protect], [Unprotect], [ProtectionOf] and [MaxStoredToken] check every name
// they are given with it.
func CheckIdentifier(name pgx.Identifier) error {
	return checkIdentifier("name", name)
}

// checkIdentifier is [CheckIdentifier] with errors naming field.
func checkIdentifier(field string, name pgx.Identifier) error {
	if len(name) == 0 || len(name) > 3 {
		return fmt.Errorf("%w: %s must have 1 to 3 parts (table, schema.table), got %d", ErrInvalid, field, len(name))
	}
	for _, part := range name {
		if err := checkName(field, part); err != nil {
			return err
		}
	}
	return nil
}

// checkName checks one part of an identifier (see [CheckIdentifier]).
func checkName(field, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalid, field)
	case len(s) > maxIdentifierLen:
		return fmt.Errorf("%w: %s %q… is %d bytes, at most %d allowed (PostgreSQL would truncate it to another name)",
			ErrInvalid, field, truncate(s, 20), len(s), maxIdentifierLen)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: %s %q contains a NUL byte", ErrInvalid, field, s)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s %q is not valid UTF-8", ErrInvalid, field, s)
	}
	return nil
}

// truncate returns at most n bytes of s, cut at a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
