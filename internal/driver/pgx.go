package driver

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// PgxDB is what pgx's pool, connection and transaction share.
type PgxDB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

var (
	_ PgxDB = (*pgxpool.Pool)(nil)
	_ PgxDB = (*pgx.Conn)(nil)
	_ PgxDB = pgx.Tx(nil)
)

// Pgx returns the handle of db: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx. A
// nil db (or a nil pointer in it) is refused with ErrInvalid.
func Pgx(db PgxDB) (Handle[pgx.Tx], error) {
	if err := NilHandle(db); err != nil {
		return nil, err
	}
	_, inTx := db.(pgx.Tx)
	return pgxHandle{db: db, inTx: inTx}, nil
}

// NilHandle returns an ErrInvalid error when db is nil or holds a nil
// pointer, so that a call refuses it instead of dereferencing it somewhere
// inside.
func NilHandle(db any) error {
	if db == nil {
		return fmt.Errorf("%w: db is nil", pgerr.ErrInvalid)
	}
	if v := reflect.ValueOf(db); v.Kind() == reflect.Pointer && v.IsNil() {
		return fmt.Errorf("%w: db is a nil %T", pgerr.ErrInvalid, db)
	}
	return nil
}

type pgxHandle struct {
	db   PgxDB
	inTx bool
}

func (h pgxHandle) InTx() bool { return h.inTx }

// conn returns db itself, or for a pool one of its connections and the
// function that gives it back. A pool that gives no connection sent nothing,
// which its own QueryRow would report as a failure after sending.
func (h pgxHandle) conn(ctx context.Context) (PgxDB, func(), error) {
	p, ok := h.db.(*pgxpool.Pool)
	if !ok {
		return h.db, func() {}, nil
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil, nil, Acquired(ctx, err)
	}
	return c, c.Release, nil
}

// Conn returns the connection of db for statements a helper sends on it
// directly: db itself, or one of a pool's until release; nil for a
// transaction. A pool that gives no connection sent nothing: the error says
// so ([Acquired]).
func Conn(ctx context.Context, db PgxDB) (*pgx.Conn, func(), error) {
	switch db := db.(type) {
	case *pgxpool.Pool:
		c, err := db.Acquire(ctx)
		if err != nil {
			return nil, nil, Acquired(ctx, err)
		}
		return c.Conn(), c.Release, nil
	case *pgx.Conn:
		return db, func() {}, nil
	}
	return nil, func() {}, nil
}

func (h pgxHandle) Begin(ctx context.Context, readCommitted bool) (Tx[pgx.Tx], error) {
	db, release, err := h.conn(ctx)
	if err != nil {
		return nil, err
	}
	var tx pgx.Tx
	switch {
	case h.inTx:
		tx, err = db.Begin(ctx) // a savepoint
	case readCommitted:
		tx, err = db.(interface {
			BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
		}).BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	default:
		tx, err = db.Begin(ctx)
	}
	if err != nil {
		release()
		return nil, pgerr.Classify(err, false)
	}
	return BeginPgx(tx, !h.inTx, release), nil
}

// BeginPgx is the helper's transaction tx: its own (own) on a connection it
// gives back with release, or a savepoint of the caller's.
func BeginPgx(tx pgx.Tx, own bool, release func()) Tx[pgx.Tx] {
	t := &pgxTx{tx: tx, own: own, release: release}
	t.guard = &guardedTx{Tx: tx, closed: &t.closed}
	return t
}

func (h pgxHandle) Pipeline(ctx context.Context, stmts ...Stmt) (int64, error) {
	db, release, err := h.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	n, err := pipelinePgx(ctx, db, stmts)
	return n, classifyPipeline(err, !h.inTx)
}

// pipelinePgx sends stmts as one batch on db (unclassified errors).
func pipelinePgx(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, stmts []Stmt) (int64, error) {
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s.SQL, s.Args...)
	}
	br := db.SendBatch(ctx, b)
	var (
		tag pgconn.CommandTag
		err error
	)
	for range stmts {
		if tag, err = br.Exec(); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag.RowsAffected(), err
}

// classifyPipeline classifies a batch's error. pgx prepares statements new
// to the connection, and encodes the arguments, before it sends the batch's
// Sync: a failure reported as preprocessing sent nothing that could commit.
func classifyPipeline(err error, sent bool) error {
	var pre pgx.ErrPreprocessingBatch
	if errors.As(err, &pre) {
		return pgerr.Classify(pre.Unwrap(), false)
	}
	return pgerr.Classify(err, sent)
}

func (h pgxHandle) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return h.row(ctx, !h.inTx, sql, args)
}

func (h pgxHandle) Read(ctx context.Context, sql string, args ...any) Row {
	return h.row(ctx, false, sql, args)
}

func (h pgxHandle) row(ctx context.Context, sent bool, sql string, args []any) Row {
	db, release, err := h.conn(ctx)
	if err != nil {
		return errRow{err}
	}
	return releasingRow{classifiedRow{db.QueryRow(ctx, sql, args...), sent}, release}
}

// releasingRow gives its connection back once scanned.
type releasingRow struct {
	Row
	release func()
}

func (r releasingRow) Scan(dest ...any) error {
	defer r.release()
	return r.Row.Scan(dest...)
}

// pgxTx is a helper's transaction on pgx.
type pgxTx struct {
	tx        pgx.Tx
	guard     *guardedTx // what the caller's code is given
	closed    closedFlag
	own       bool
	release   func()
	committed bool
}

func (t *pgxTx) Handle() pgx.Tx { return t.guard }

func (t *pgxTx) Exec(ctx context.Context, stmts ...Stmt) error { return t.Query(ctx, nil, stmts...) }

func (t *pgxTx) Query(ctx context.Context, dest []any, stmts ...Stmt) error {
	if dest == nil {
		_, err := pipelinePgx(ctx, t.tx, stmts)
		var pre pgx.ErrPreprocessingBatch
		if errors.As(err, &pre) {
			return pre.Unwrap()
		}
		return err
	}
	return QueryRow(ctx, t.tx, stmts, dest...)
}

func (t *pgxTx) Classify(err error) error {
	if pgerr.Code(err) != "" || t.connLost() {
		return pgerr.Classify(err, false)
	}
	return err
}

func (t *pgxTx) connLost() bool {
	c := t.tx.Conn()
	return c != nil && c.PgConn() != nil && c.PgConn().IsClosed()
}

// EndedByCaller reads the connection's transaction status: pgx's Tx does not
// notice a COMMIT or ROLLBACK sent as SQL, after which a COMMIT only warns.
func (t *pgxTx) EndedByCaller() bool {
	c := t.tx.Conn()
	return c != nil && c.PgConn() != nil && c.PgConn().TxStatus() == 'I'
}

func (t *pgxTx) Commit(ctx context.Context, last *Stmt, dest ...any) error {
	t.closed.close() // the caller's handle is done with, whatever happens
	if last != nil && t.own {
		// One pipeline on the connection: if last fails, the server skips
		// the COMMIT and Rollback ends the transaction.
		b := &pgx.Batch{}
		b.Queue(last.SQL, last.Args...)
		b.Queue("commit")
		br := t.tx.Conn().SendBatch(ctx, b)
		err := br.QueryRow().Scan(dest...)
		var tag pgconn.CommandTag
		if err == nil {
			tag, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return classifyPipeline(err, true)
		}
		if tag.String() != "COMMIT" {
			return pgx.ErrTxCommitRollback // the server answered ROLLBACK
		}
		t.done(true)
		return nil
	}
	if last != nil {
		if err := t.Query(ctx, dest, *last); err != nil {
			return t.Classify(err)
		}
	}
	err := t.tx.Commit(ctx)
	switch {
	case err == nil:
		t.done(true)
		return nil
	case errors.Is(err, pgx.ErrTxClosed):
		return EndedByCaller(t.own)
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return err // the server answered ROLLBACK: nothing committed
	}
	// A lost RELEASE SAVEPOINT kills the caller's transaction: nothing of it
	// can commit.
	return pgerr.Classify(err, t.own)
}

func (t *pgxTx) Rollback(ctx context.Context) error {
	t.closed.close()
	if t.committed || t.release == nil {
		return nil
	}
	err := t.tx.Rollback(ctx)
	if !t.own && t.EndedByCaller() {
		err = nil // the caller's transaction is gone with its savepoint
	}
	t.done(false)
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}

func (t *pgxTx) done(committed bool) {
	t.committed = committed
	if t.release != nil {
		t.release()
		t.release = nil
	}
}

// QueryRow runs stmts on db in one round trip (one implicit transaction on a
// pool or a connection) and scans the last one's row into dest. The error is
// not classified.
func QueryRow(ctx context.Context, db PgxDB, stmts []Stmt, dest ...any) error {
	last := stmts[len(stmts)-1]
	if len(stmts) == 1 {
		return db.QueryRow(ctx, last.SQL, last.Args...).Scan(dest...)
	}
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s.SQL, s.Args...)
	}
	br := db.SendBatch(ctx, b)
	var err error
	for i := 0; i < len(stmts)-1 && err == nil; i++ {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}
