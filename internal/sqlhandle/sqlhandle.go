// Package sqlhandle tells apart the database/sql handles that pgfence's
// helpers accept (a pool, one connection, or the caller's transaction), so
// that every package treats them alike.
package sqlhandle

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// DB is what the helpers take: what *sql.DB, *sql.Conn and *sql.Tx share.
type DB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Pool is a *sql.DB (or a type that embeds one, such as *sqlx.DB).
type Pool interface {
	DB
	Conn(ctx context.Context) (*sql.Conn, error)
}

// Conn is a *sql.Conn (or a type that embeds one).
type Conn interface {
	DB
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
	Raw(f func(driverConn any) error) error
}

var (
	_ Pool = (*sql.DB)(nil)
	_ Conn = (*sql.Conn)(nil)
	_ DB   = (*sql.Tx)(nil)
)

// Handle is one of the three: exactly one field is set.
type Handle struct {
	Pool Pool
	Conn Conn
	Tx   *sql.Tx
}

// Of tells what db is, or returns an error wrapping [pgerr.ErrInvalid] that
// says what it should have been: a type that only has the methods of DB
// could commit on its own or not, and a transaction type that wraps a
// *sql.Tx cannot be given to a function that takes the *sql.Tx.
func Of(db DB) (Handle, error) {
	if db == nil {
		return Handle{}, fmt.Errorf("%w: db is nil", pgerr.ErrInvalid)
	}
	if v := reflect.ValueOf(db); v.Kind() == reflect.Pointer && v.IsNil() {
		return Handle{}, fmt.Errorf("%w: db is a nil %T", pgerr.ErrInvalid, db)
	}
	switch db := db.(type) {
	case *sql.Tx:
		return Handle{Tx: db}, nil
	case Conn:
		return Handle{Conn: db}, nil
	case Pool:
		return Handle{Pool: db}, nil
	case interface{ Commit() error }:
		return Handle{}, fmt.Errorf("%w: db is a %T: pass the *sql.Tx it wraps (sqlx and bun: tx.Tx; GORM: tx.Statement.ConnPool.(*sql.Tx)), which fn is given", pgerr.ErrInvalid, db)
	}
	return Handle{}, fmt.Errorf("%w: db is a %T: it must be a *sql.DB, a *sql.Conn or a *sql.Tx", pgerr.ErrInvalid, db)
}

// DB returns what statements of the handle itself run on.
func (h Handle) DB() DB {
	switch {
	case h.Tx != nil:
		return h.Tx
	case h.Conn != nil:
		return h.Conn
	}
	return h.Pool
}

// Own returns the connection a helper's own transaction runs on: the
// caller's *sql.Conn, or one taken from the pool until release. The error
// (the pool gave no connection) is not mapped: nothing was sent.
func (h Handle) Own(ctx context.Context) (_ Conn, release func(), _ error) {
	if h.Conn != nil {
		return h.Conn, func() {}, nil
	}
	c, err := h.Pool.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	return c, func() { _ = c.Close() }, nil
}

// Savepoint is the savepoint of one helper call inside the caller's
// transaction. Every call has a name of its own: ROLLBACK TO keeps the
// savepoint it rolls back to, so with a shared name the outer call of two
// nested ones (a fenced write inside an idempotent claim) would roll back to
// the inner one's and keep its own work.
type Savepoint string

var savepoints atomic.Uint64

// NewSavepoint returns a name no other call of this process uses.
func NewSavepoint() Savepoint {
	return Savepoint("pgfence_" + strconv.FormatUint(savepoints.Add(1), 10))
}

// Create, Release and RollbackTo are the statements of the savepoint.
func (s Savepoint) Create() string     { return "SAVEPOINT " + string(s) }
func (s Savepoint) Release() string    { return "RELEASE SAVEPOINT " + string(s) }
func (s Savepoint) RollbackTo() string { return "ROLLBACK TO SAVEPOINT " + string(s) }

// SQLSTATEs of a RELEASE SAVEPOINT whose transaction the caller's code ended.
const (
	CodeNoActiveTransaction = "25P01" // no_active_sql_transaction
	CodeInvalidSavepoint    = "3B001" // invalid_savepoint_specification
)

// PgxConn returns the *pgx.Conn of a driver connection of pgx's stdlib
// driver (as [sql.Conn.Raw] gives it), or nil for another driver.
func PgxConn(driverConn any) *pgx.Conn {
	if c, ok := driverConn.(interface{ Conn() *pgx.Conn }); ok {
		return c.Conn()
	}
	return nil
}

// SeveralStatements reports whether a driver connection (as [sql.Conn.Raw]
// gives it) sends a statement without arguments as one simple query, which
// may hold several statements: lib/pq does. Such a driver cannot pipeline
// statements with arguments, but it can send BEGIN with statements whose
// arguments are written as literals in one round trip.
func SeveralStatements(driverConn any) bool {
	return fmt.Sprintf("%T", driverConn) == "*pq.conn"
}
