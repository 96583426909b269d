package pgfence

import (
	"context"
	"database/sql"
	"strings"

	"github.com/pgfence/pgfence/pgfence/internal/sqlbridge"
)

// sqlFencing is the implementation of package sqlfence's writes: the writes
// of this package on a database/sql session. sqlfence reaches it through
// internal/sqlbridge; a nil *Fencer is the default one.
type sqlFencing struct{}

func init() { sqlbridge.Fencing = sqlFencing{} }

func (sqlFencing) WriteToken(f *Fencer, ctx context.Context, db sqlbridge.DB, resource string, token int64, fn func(context.Context, *sql.Tx) error) (r Receipt, err error) {
	s, err := newSQLSession(db)
	if err != nil {
		return Receipt{}, err
	}
	w := &write{op: opWrite, resource: resource, token: token}
	err = orDefault(f).observed(ctx, s, w, func(ctx context.Context) error {
		r, err = writeFenced(ctx, s, w, fn)
		return err
	})
	return r, err
}

func (x sqlFencing) Write(f *Fencer, ctx context.Context, db sqlbridge.DB, lease Lease, fn func(context.Context, *sql.Tx) error) (Receipt, error) {
	w, err := leaseWrite(opWrite, lease)
	if err != nil {
		return Receipt{}, err
	}
	return x.WriteToken(f, ctx, db, w.resource, w.token, fn)
}

func (sqlFencing) ExecToken(f *Fencer, ctx context.Context, db sqlbridge.DB, resource string, token int64, query string, args []any) (r sql.Result, err error) {
	s, err := newSQLSession(db)
	if err != nil {
		return nil, err
	}
	w := &write{op: opExec, resource: resource, token: token}
	err = orDefault(f).observed(ctx, s, w, func(ctx context.Context) error {
		r, err = execFenced(ctx, s, w, query, args)
		return err
	})
	return r, err
}

func (x sqlFencing) Exec(f *Fencer, ctx context.Context, db sqlbridge.DB, lease Lease, query string, args []any) (sql.Result, error) {
	w, err := leaseWrite(opExec, lease)
	if err != nil {
		return nil, err
	}
	return x.ExecToken(f, ctx, db, w.resource, w.token, query, args)
}

func (sqlFencing) WriteLeased(f *Fencer, ctx context.Context, db sqlbridge.DB, lease Lease, fn func(context.Context, *sql.Tx) error) error {
	s, err := newSQLSession(db)
	if err != nil {
		return err
	}
	w, err := leaseWrite(opWriteLeased, lease)
	if err != nil {
		return err
	}
	return orDefault(f).observed(ctx, s, w, func(ctx context.Context) error {
		return writeLeased(ctx, s, w, fn)
	})
}

func (sqlFencing) ExecLeased(f *Fencer, ctx context.Context, db sqlbridge.DB, lease Lease, query string, args []any) (r sql.Result, err error) {
	s, err := newSQLSession(db)
	if err != nil {
		return nil, err
	}
	w, err := leaseWrite(opExecLeased, lease)
	if err != nil {
		return nil, err
	}
	err = orDefault(f).observed(ctx, s, w, func(ctx context.Context) error {
		r, err = execLeased(ctx, s, w, query, args)
		return err
	})
	return r, err
}

func (sqlFencing) UpdateRow(f *Fencer, ctx context.Context, db sqlbridge.DB, t Table, id any, token int64, set map[string]any) error {
	s, err := newSQLSession(db)
	if err != nil {
		return err
	}
	w := &write{op: opUpdateRow, token: token, table: strings.Join(t.Name, ".")}
	return orDefault(f).observed(ctx, s, w, func(ctx context.Context) error {
		return updateRow(ctx, s, t, id, token, set)
	})
}

func (sqlFencing) Resolve(ctx context.Context, db sqlbridge.DB, e *OutcomeUnknownError) (Outcome, error) {
	s, err := newSQLSession(db)
	if err != nil {
		return 0, err
	}
	return resolve(ctx, s, e)
}

// orDefault is f, or the Fencer of the package-level functions.
func orDefault(f *Fencer) *Fencer {
	if f == nil {
		return defaultFencer()
	}
	return f
}
