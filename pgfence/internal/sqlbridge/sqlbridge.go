// Package sqlbridge connects package sqlfence, the database/sql face of
// pgfence's fenced and lease-checked writes, to their one implementation in
// package pgfence, without exporting that implementation from pgfence.
//
// Package pgfence sets [Fencing] when it is initialised, to a value whose
// methods take and return pgfence's own types; package sqlfence, which
// imports pgfence (so pgfence is initialised first), asserts it to the
// interface of those methods that it declares. Nothing else uses it.
package sqlbridge

import "github.com/pgfence/pgfence/internal/sqlhandle"

// DB is what the database/sql writes run on: a *sql.DB, a *sql.Conn or a
// *sql.Tx (sqlfence.DB).
type DB = sqlhandle.DB

// Fencing is pgfence's implementation of the database/sql writes, set by
// package pgfence.
var Fencing any
