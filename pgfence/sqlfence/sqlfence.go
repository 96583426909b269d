package sqlfence

import (
	"context"
	"database/sql"

	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/internal/sqlbridge"
)

// DB is what the helpers run on: a [*sql.DB] (or a type that embeds one, such
// as *sqlx.DB), a [*sql.Conn], or the caller's [*sql.Tx]. On a pool or a
// connection each helper runs its own transaction; on a Tx it joins the
// caller's transaction (under a savepoint), so the fence and the caller's
// other writes commit or roll back together. Any other type is refused with
// [pgfence.ErrInvalid]: an ORM's transaction is passed as the *sql.Tx it
// wraps (sqlx and bun: tx.Tx; GORM: tx.Statement.ConnPool.(*sql.Tx)).
type DB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ DB = (*sql.DB)(nil)
	_ DB = (*sql.Conn)(nil)
	_ DB = (*sql.Tx)(nil)
)

// fencing is the implementation, in package pgfence, of this package's
// writes (see internal/sqlbridge).
type fencing interface {
	Write(f *pgfence.Fencer, ctx context.Context, db sqlbridge.DB, lease pgfence.Lease, fn func(context.Context, *sql.Tx) error) (pgfence.Receipt, error)
	WriteToken(f *pgfence.Fencer, ctx context.Context, db sqlbridge.DB, resource string, token int64, fn func(context.Context, *sql.Tx) error) (pgfence.Receipt, error)
	Exec(f *pgfence.Fencer, ctx context.Context, db sqlbridge.DB, lease pgfence.Lease, query string, args []any) (sql.Result, error)
	ExecToken(f *pgfence.Fencer, ctx context.Context, db sqlbridge.DB, resource string, token int64, query string, args []any) (sql.Result, error)
	WriteLeased(f *pgfence.Fencer, ctx context.Context, db sqlbridge.DB, lease pgfence.Lease, fn func(context.Context, *sql.Tx) error) error
	ExecLeased(f *pgfence.Fencer, ctx context.Context, db sqlbridge.DB, lease pgfence.Lease, query string, args []any) (sql.Result, error)
	UpdateRow(f *pgfence.Fencer, ctx context.Context, db sqlbridge.DB, t pgfence.Table, id any, token int64, set map[string]any) error
	Resolve(ctx context.Context, db sqlbridge.DB, e *pgfence.OutcomeUnknownError) (pgfence.Outcome, error)
}

var impl = sqlbridge.Fencing.(fencing)

// Fencer runs fenced and lease-checked writes on database/sql and reports
// them as a [pgfence.Fencer] with the same configuration does: the same log
// events, metrics (pgfence.fence.writes, pgfence.fence.duration) and spans.
// It holds no connection; it is safe for concurrent use. The package-level
// functions use the default configuration, shared with package pgfence's.
type Fencer struct {
	f *pgfence.Fencer // nil: the default
}

// New returns a Fencer configured by cfg (nil for the defaults).
func New(cfg *pgfence.Config) *Fencer { return &Fencer{f: pgfence.New(cfg)} }

func (f *Fencer) fencer() *pgfence.Fencer {
	if f == nil {
		return nil
	}
	return f.f
}

// Write runs fn in a transaction that first presents the lease's token for
// the resource named by the lease's key, as [pgfence.Fencer.Write] does:
// pgfence.fence() accepts it iff the lease named by the resource issued it,
// it is not retired by a floor, and no higher token was accepted for the
// resource, records it and keeps the fence row locked until the transaction
// ends, so fn's writes commit only together with the acceptance. fn must do
// its writes through tx and read the rows it changes after the fence, that
// is in fn.
//
// On a *sql.DB or a *sql.Conn, Write runs its own transaction: BEGIN, the
// fence, fn's statements, COMMIT. On a *sql.Tx it runs in a savepoint of the
// caller's transaction and fn is given that *sql.Tx: a rejection rolls back
// only the savepoint, and nothing is durable until the caller commits.
//
// A stale token returns a *[pgfence.StaleTokenError] (errors.Is
// [pgfence.ErrStaleToken]), a token the lease never issued a
// *[pgfence.TokenNotIssuedError], and fn is not called. If fn returns an
// error the transaction (savepoint) rolls back and that error is returned
// unchanged (pgfence SQLSTATEs raised inside fn are mapped); if fn panics it
// rolls back and the panic goes on. fn must not commit or roll back tx (with
// tx.Commit, tx.Rollback, or COMMIT or ROLLBACK sent as SQL): Write then
// cannot know the outcome and returns an error that wraps
// [pgfence.ErrOutcomeUnknown]. A COMMIT whose answer is lost returns a
// *[pgfence.OutcomeUnknownError]: pass it to [Resolve].
func (f *Fencer) Write(ctx context.Context, db DB, lease pgfence.Lease, fn func(ctx context.Context, tx *sql.Tx) error) (pgfence.Receipt, error) {
	return impl.Write(f.fencer(), ctx, db, lease, fn)
}

// WriteToken is [Fencer.Write] with a bare token for resource, as
// [pgfence.Fencer.WriteToken]: for a token that came without its lease (with
// a request from the lease's holder, say). Tokens count per lease key: the
// token must come from the lease whose key is resource.
func (f *Fencer) WriteToken(ctx context.Context, db DB, resource string, token int64, fn func(ctx context.Context, tx *sql.Tx) error) (pgfence.Receipt, error) {
	return impl.WriteToken(f.fencer(), ctx, db, resource, token, fn)
}

// Exec presents the lease's token for the resource named by its key and runs
// one statement (query with args), which commits only if the token is
// accepted; it returns the statement's result. With pgx's database/sql
// driver (github.com/jackc/pgx/v5/stdlib) on a *sql.DB or a *sql.Conn, both
// are sent as one pipeline, one round trip and one implicit transaction, as
// [pgfence.Fencer.Exec] does; with other drivers (lib/pq) in a transaction of
// its own: BEGIN, the fence, the statement, COMMIT. On a *sql.Tx both join
// the caller's transaction and a rejection aborts it, as any failing
// statement does; use [Fencer.Write] to confine a rejection to a savepoint.
// Errors are as for [Fencer.Write].
func (f *Fencer) Exec(ctx context.Context, db DB, lease pgfence.Lease, query string, args ...any) (sql.Result, error) {
	return impl.Exec(f.fencer(), ctx, db, lease, query, args)
}

// ExecToken is [Fencer.Exec] with a bare token for resource.
func (f *Fencer) ExecToken(ctx context.Context, db DB, resource string, token int64, query string, args ...any) (sql.Result, error) {
	return impl.ExecToken(f.fencer(), ctx, db, resource, token, query, args)
}

// WriteLeased runs fn in a transaction that first checks, with
// pgfence.check_lease(), that lease is still live and held by its holder with
// its token, by the database clock, as [pgfence.Fencer.WriteLeased] does: the
// check takes FOR SHARE on the lease row, so no takeover can commit before
// this transaction ends. A lost lease returns a *[pgfence.LeaseNotHeldError]
// (errors.Is [pgfence.ErrLeaseNotHeld]) and fn is not called. A COMMIT whose
// answer is lost returns an error wrapping [pgfence.ErrOutcomeUnknown]
// (there is no operation id to resolve it by: re-read what fn wrote). Other
// errors, and db, are as for [Fencer.Write].
func (f *Fencer) WriteLeased(ctx context.Context, db DB, lease pgfence.Lease, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return impl.WriteLeased(f.fencer(), ctx, db, lease, fn)
}

// ExecLeased checks lease as [Fencer.WriteLeased] does and runs one
// statement, in one round trip where the driver pipelines, as [Fencer.Exec].
// Errors are as for [Fencer.WriteLeased].
func (f *Fencer) ExecLeased(ctx context.Context, db DB, lease pgfence.Lease, query string, args ...any) (sql.Result, error) {
	return impl.ExecLeased(f.fencer(), ctx, db, lease, query, args)
}

// UpdateRow is the versioned write of [pgfence.Fencer.UpdateRow] on
// database/sql: one UPDATE that sets the row's columns and its fence column
// to token where the row's token is not newer. The values of set and id go
// through the driver's conversions.
func (f *Fencer) UpdateRow(ctx context.Context, db DB, t pgfence.Table, id any, token int64, set map[string]any) error {
	return impl.UpdateRow(f.fencer(), ctx, db, t, id, token, set)
}

// Resolve tells whether the write behind an *[pgfence.OutcomeUnknownError]
// committed, and makes the answer final, as [pgfence.Resolve] does: it
// abandons the write (pgfence.abandon_fence) in a statement of its own, then
// probes the resource (pgfence.fence_probe) in another. db must be a *sql.DB
// or a *sql.Conn, not a *sql.Tx ([pgfence.ErrInvalid]).
func Resolve(ctx context.Context, db DB, e *pgfence.OutcomeUnknownError) (pgfence.Outcome, error) {
	return impl.Resolve(ctx, db, e)
}

// Write is [Fencer.Write] with the default configuration.
func Write(ctx context.Context, db DB, lease pgfence.Lease, fn func(ctx context.Context, tx *sql.Tx) error) (pgfence.Receipt, error) {
	return impl.Write(nil, ctx, db, lease, fn)
}

// WriteToken is [Fencer.WriteToken] with the default configuration.
func WriteToken(ctx context.Context, db DB, resource string, token int64, fn func(ctx context.Context, tx *sql.Tx) error) (pgfence.Receipt, error) {
	return impl.WriteToken(nil, ctx, db, resource, token, fn)
}

// Exec is [Fencer.Exec] with the default configuration.
func Exec(ctx context.Context, db DB, lease pgfence.Lease, query string, args ...any) (sql.Result, error) {
	return impl.Exec(nil, ctx, db, lease, query, args)
}

// ExecToken is [Fencer.ExecToken] with the default configuration.
func ExecToken(ctx context.Context, db DB, resource string, token int64, query string, args ...any) (sql.Result, error) {
	return impl.ExecToken(nil, ctx, db, resource, token, query, args)
}

// WriteLeased is [Fencer.WriteLeased] with the default configuration.
func WriteLeased(ctx context.Context, db DB, lease pgfence.Lease, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return impl.WriteLeased(nil, ctx, db, lease, fn)
}

// ExecLeased is [Fencer.ExecLeased] with the default configuration.
func ExecLeased(ctx context.Context, db DB, lease pgfence.Lease, query string, args ...any) (sql.Result, error) {
	return impl.ExecLeased(nil, ctx, db, lease, query, args)
}

// UpdateRow is [Fencer.UpdateRow] with the default configuration.
func UpdateRow(ctx context.Context, db DB, t pgfence.Table, id any, token int64, set map[string]any) error {
	return impl.UpdateRow(nil, ctx, db, t, id, token, set)
}
