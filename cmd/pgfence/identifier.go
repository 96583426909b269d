package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/pgfence"
)

// splitIdentifier parses a dotted name from the command line into its parts:
// `table`, `schema.table`, `schema.table.column`. A part is taken as written
// (case kept, unlike SQL's unquoted names) unless it is double-quoted as in
// SQL, which it must be to contain a dot or a double quote: `"my.schema"."a""b"`
// is {my.schema, a"b}. Each part must pass [pgfence.CheckIdentifier] (1 to 63
// bytes, no NUL); the parts are quoted again when they reach SQL, so no
// character can change the statement.
func splitIdentifier(s string) (pgx.Identifier, error) {
	var parts pgx.Identifier
	for i := 0; ; {
		var part string
		if i < len(s) && s[i] == '"' {
			var b strings.Builder
			closed := false
			for i++; i < len(s); i++ {
				if s[i] == '"' {
					if i+1 < len(s) && s[i+1] == '"' {
						b.WriteByte('"')
						i++
						continue
					}
					closed = true
					i++
					break
				}
				b.WriteByte(s[i])
			}
			if !closed {
				return nil, errors.New("unterminated double quote")
			}
			part = b.String()
			if i < len(s) && s[i] != '.' {
				return nil, fmt.Errorf("unexpected %q after a quoted name (quote the whole part)", s[i:i+1])
			}
		} else {
			end := strings.IndexByte(s[i:], '.')
			if end < 0 {
				end = len(s) - i
			}
			part = s[i : i+end]
			if strings.Contains(part, `"`) {
				return nil, fmt.Errorf("name %q contains a double quote: quote the whole part and double it (\"a\"\"b\")", part)
			}
			i += end
		}
		if part == "" {
			return nil, errors.New("empty name part")
		}
		if err := pgfence.CheckIdentifier(pgx.Identifier{part}); err != nil {
			return nil, err
		}
		parts = append(parts, part)
		if i >= len(s) {
			return parts, nil
		}
		i++ // the dot
		if i >= len(s) {
			return nil, errors.New("empty name part after the last dot")
		}
	}
}
