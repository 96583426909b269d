package pgfence

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/internal/pgerr"
)

// DB is what the helpers run on with pgx: a *pgxpool.Pool, a *pgx.Conn, or
// the caller's [pgx.Tx]. On a pool or a connection a helper runs its own
// transaction; on a Tx it joins the caller's ([pgx.Tx.Begin] is a savepoint
// there), so the fence and the caller's other writes commit or roll back
// together.
type DB = driver.PgxDB

// SQLDB is what the helpers run on with database/sql (lib/pq, pgx's stdlib
// driver, and sqlx, sqlc, GORM or bun over them): a *sql.DB (or a type that
// embeds one), a *sql.Conn, or the caller's *sql.Tx, with the same meaning
// as [DB]. An ORM's transaction is passed as the *sql.Tx it wraps (sqlx and
// bun: tx.Tx; GORM: tx.Statement.ConnPool.(*sql.Tx)); any other type is
// refused with [ErrInvalid].
type SQLDB = driver.SQLDB

// MaxResourceLen is the longest resource name (and lease key), in bytes;
// pgfence.fence() enforces the same limit for other clients (PF008).
const MaxResourceLen = 512

// Lease is a grant of a pgfence lease: the key it was granted for, the
// holder id of the grant (a UUID in text form) and its fencing token.
// *leases.Lease is one; [LeaseOf] makes one from values read over SQL or
// received from another process.
type Lease interface {
	Key() string
	Holder() string
	Token() int64
}

// LeaseOf returns the [Lease] granted for key to holder with token: for a
// grant made outside package leases (pgfence.try_acquire from SQL), or one
// whose values another process sent along. A fenced write reads only key and
// token, so holder may be empty (a bare token for the resource key); a
// lease-checked one ([Checked]) needs it.
func LeaseOf(key, holder string, token int64) Lease { return grant{key, holder, token} }

type grant struct {
	key, holder string
	token       int64
}

func (g grant) Key() string    { return g.key }
func (g grant) Holder() string { return g.holder }
func (g grant) Token() int64   { return g.token }

// Checked returns lease for a lease-checked write: instead of comparing its
// token with the resource's accepted one, the write checks that the lease
// is still live and held by its holder with its token, by the database
// clock (pgfence.check_lease), and holds the lease row (FOR SHARE) until it
// commits, so no takeover commits in between. Where the lease row is in the
// same database as the data, this refuses a holder the moment its lease is
// lost, not only once a newer holder has written. A lost lease is a
// *[LeaseLostError]. A lease-checked write records no operation id: after
// [ErrOutcomeUnknown], re-read what it wrote.
func Checked(lease Lease) Lease { return checked{lease} }

type checked struct{ Lease }

// OpID identifies one fenced write. It is stored with the accepted token so
// that a write whose commit outcome is unknown can be resolved ([Resolve]).
type OpID [16]byte

// String formats the id as a UUID.
func (id OpID) String() string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:])
}

func newOpID() OpID {
	var id OpID
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails (Go 1.24+)
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	return id
}

// sqlOp reads a nullable op column as an OpID: the zero id for none.
const sqlOp = `coalesce(op, '00000000-0000-0000-0000-000000000000')`

// Receipt describes an accepted, committed fenced write.
type Receipt struct {
	Resource string
	Token    int64
	// Op is the write's operation id (zero for a lease-checked write).
	Op OpID
}

// SQL of the writes; the functions are installed by the migrations.
const (
	sqlFence      = `SELECT pgfence.fence($1, $2, $3)`
	sqlCheckLease = `SELECT pgfence.check_lease($1, $2, $3)`
	// sqlAbandon gives up a write whose outcome is unknown, by its operation
	// id: from its commit on, pgfence.fence() refuses the write if it still
	// arrives (PF013), so a NotApplied answered after it is final.
	sqlAbandon = `SELECT pgfence.abandon_fence($1, $2)`
	// sqlProbe waits for any transaction that holds the fence row (or is
	// inserting it) and returns the newest committed state, changing
	// nothing; writes = 0 means no token was ever accepted.
	sqlProbe = `SELECT token, writes, op FROM pgfence.fence_probe($1)`
)

// Write runs fn in a transaction that first presents the lease's token for
// the resource its key names: pgfence.fence() accepts it iff that lease
// issued it, no floor retired it and no higher token was accepted for the
// resource (equal tokens pass), records it and keeps the resource's fence
// row locked until the transaction ends, so fn's writes commit only together
// with the acceptance. A fenced write accepts the token until a newer token
// of the key has been accepted: a holder whose lease expired can still write
// until the next holder has written (the fencing-token contract). To refuse
// a holder the moment its lease is lost, write with [Checked](lease).
//
// A rejected token returns a *[StaleTokenError] or *[TokenNotIssuedError]
// and fn is not called. If fn returns an error the transaction rolls back
// and that error is returned (an error of fn's own statements is mapped as
// [MapError] does, any other unchanged); if fn panics, it rolls back and the
// panic goes on. fn must not commit or roll back tx (with tx.Commit,
// tx.Rollback, or COMMIT or ROLLBACK sent as SQL): Write then cannot know
// the outcome and returns an error wrapping [ErrInvalid] (and
// [ErrOutcomeUnknown] on its own transaction). A COMMIT whose answer is
// lost returns an *[OutcomeUnknownError]: pass it to [Resolve].
//
// On a [pgx.Tx], Write runs in a savepoint of the caller's transaction: a
// rejection rolls back only the savepoint, and nothing is durable until the
// caller commits. It costs BEGIN, the fence, fn's statements and COMMIT;
// [Exec] does a single statement in one round trip.
func Write(ctx context.Context, db DB, lease Lease, fn func(ctx context.Context, tx pgx.Tx) error) (Receipt, error) {
	h, err := driver.Pgx(db)
	if err != nil {
		return Receipt{}, err
	}
	return write(ctx, h, lease, fn)
}

// WriteSQL is [Write] on database/sql: on a *sql.DB or a *sql.Conn it runs
// its own transaction, on a *sql.Tx a savepoint of the caller's, and fn is
// given that *sql.Tx. fn must do its writes through tx.
func WriteSQL(ctx context.Context, db SQLDB, lease Lease, fn func(ctx context.Context, tx *sql.Tx) error) (Receipt, error) {
	h, err := driver.SQL(db)
	if err != nil {
		return Receipt{}, err
	}
	return write(ctx, h, lease, fn)
}

// Exec presents the lease's token for the resource its key names, as [Write]
// does, and runs one statement (sql with args), which commits only if the
// token is accepted; it returns the rows the statement affected. The fence
// and the statement are sent as one pipeline, one round trip and one
// implicit transaction. On a [pgx.Tx] both join the caller's transaction
// and a rejection aborts it, as any failing statement does; use [Write] to
// confine a rejection to a savepoint. Errors are as for [Write].
func Exec(ctx context.Context, db DB, lease Lease, sql string, args ...any) (int64, error) {
	h, err := driver.Pgx(db)
	if err != nil {
		return 0, err
	}
	return exec(ctx, h, lease, sql, args)
}

// ExecSQL is [Exec] on database/sql. With pgx's database/sql driver on a
// *sql.DB or a *sql.Conn the fence and the statement are one pipeline, as
// with [Exec]; with other drivers (lib/pq) they run in a transaction of
// their own: BEGIN, the fence, the statement, COMMIT.
func ExecSQL(ctx context.Context, db SQLDB, lease Lease, sql string, args ...any) (int64, error) {
	h, err := driver.SQL(db)
	if err != nil {
		return 0, err
	}
	return exec(ctx, h, lease, sql, args)
}

// aWrite is one write: its lease, checked or fenced, and the statement that
// presents it.
type aWrite struct {
	op       string // operation, for telemetry and the rejection record
	resource string // the resource, and lease key
	token    int64
	holder   string // lease-checked writes
	id       OpID   // fenced writes
}

// newWrite checks lease (refusing a nil one, or a nil *leases.Lease in it)
// and returns its write.
func newWrite(op string, lease Lease) (*aWrite, error) {
	c, isChecked := lease.(checked)
	if isChecked {
		lease = c.Lease
	}
	if lease == nil {
		return nil, fmt.Errorf("%w: lease is nil", ErrInvalid)
	}
	if v := reflect.ValueOf(lease); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: lease is a nil %T", ErrInvalid, lease)
	}
	w := &aWrite{op: op, resource: lease.Key(), token: lease.Token()}
	if err := validateName("resource", w.resource); err != nil {
		return nil, err
	}
	if w.token <= 0 {
		return nil, fmt.Errorf("%w: token must be positive, got %d", ErrInvalid, w.token)
	}
	if isChecked {
		w.op += "_leased"
		w.holder = lease.Holder()
		if !isUUID(w.holder) {
			return nil, fmt.Errorf("%w: lease holder %q is not a UUID", ErrInvalid, w.holder)
		}
	} else {
		w.id = newOpID()
	}
	return w, nil
}

// stmt is the statement that presents the write's token or checks its lease.
func (w *aWrite) stmt() driver.Stmt {
	if w.holder != "" {
		return driver.Stmt{SQL: sqlCheckLease, Args: []any{w.resource, w.holder, w.token}}
	}
	return driver.Stmt{SQL: sqlFence, Args: []any{w.resource, w.token, w.id.String()}}
}

// failed maps err, an error of the write: the server's details, and an
// unknown outcome of a fenced write into an *OutcomeUnknownError.
func (w *aWrite) failed(err error) error {
	err = detail(err)
	if w.holder == "" && errors.Is(err, ErrOutcomeUnknown) {
		return &OutcomeUnknownError{Resource: w.resource, Token: w.token, Op: w.id, err: err}
	}
	return err
}

func write[T any](ctx context.Context, h driver.Handle[T], lease Lease, fn func(context.Context, T) error) (Receipt, error) {
	w, err := newWrite(opWrite, lease)
	if err != nil {
		return Receipt{}, err
	}
	if fn == nil {
		return Receipt{}, fmt.Errorf("%w: fn is nil", ErrInvalid)
	}
	err = observe(ctx, h, w, func(ctx context.Context) (err error) {
		tx, err := h.Begin(ctx, false)
		if err != nil {
			return err
		}
		returned := false
		defer func() {
			if !returned { // fn panicked: roll back while the panic goes on
				_ = driver.Abort(ctx, tx, nil)
			}
		}()
		if err := tx.Exec(ctx, driver.Traced(ctx, w.stmt())...); err != nil {
			returned = true
			return driver.Abort(ctx, tx, w.failed(tx.Classify(err)))
		}
		ferr := fn(ctx, tx.Handle())
		returned = true
		switch {
		case ferr != nil:
			return driver.Abort(ctx, tx, detail(tx.Classify(ferr)))
		case tx.EndedByCaller():
			// The connection is outside any transaction: fn ended the
			// write's own, or the caller's whole one; either may have
			// committed.
			return w.failed(driver.Abort(ctx, tx, driver.EndedByCaller(true)))
		}
		if err := tx.Commit(ctx, nil); err != nil {
			return w.failed(driver.Abort(ctx, tx, err))
		}
		return nil
	})
	if err != nil {
		return Receipt{}, err
	}
	return Receipt{Resource: w.resource, Token: w.token, Op: w.id}, nil
}

func exec[T any](ctx context.Context, h driver.Handle[T], lease Lease, sql string, args []any) (n int64, err error) {
	w, err := newWrite(opExec, lease)
	if err != nil {
		return 0, err
	}
	err = observe(ctx, h, w, func(ctx context.Context) error {
		n, err = h.Pipeline(ctx, driver.Traced(ctx, w.stmt(), driver.Stmt{SQL: sql, Args: args})...)
		if err != nil {
			return w.failed(err)
		}
		return nil
	})
	return n, err
}

// Outcome is what [Resolve] learned about a write with an unknown outcome.
type Outcome int

const (
	// NotApplied: the write did not commit, and no longer can; it may be
	// retried (with a token that is still current).
	NotApplied Outcome = iota + 1
	// Applied: the write committed.
	Applied
	// Superseded: a later write was accepted for the resource; the write may
	// have committed before it, and its effect, if any, was overwritten in
	// token order. Read the business data if the difference matters.
	Superseded
)

func (o Outcome) String() string {
	switch o {
	case NotApplied:
		return "not applied"
	case Applied:
		return "applied"
	case Superseded:
		return "superseded"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Resolve tells whether the write behind an *[OutcomeUnknownError] committed,
// and makes the answer final. It runs two statements, each committing on its
// own: pgfence.abandon_fence records that the write's operation is given up,
// so that from then on the server refuses it if it still arrives (held in
// the network, queued in a pooler, waiting for the fence row's lock); then
// pgfence.fence_probe waits for any transaction still holding the resource's
// fence row and compares the accepted token and operation id with the
// write's. [NotApplied] therefore stays true: retrying the write (with a
// token that is still current) applies it once. Apart from the abandonment
// record, Resolve changes nothing, so an error of its own (the database
// unavailable, say) is safe to retry.
//
// db must be a pool or a connection, not a transaction: inside a caller's
// transaction the abandonment would not be committed before the probe
// ([ErrInvalid]).
func Resolve(ctx context.Context, db DB, e *OutcomeUnknownError) (Outcome, error) {
	h, err := driver.Pgx(db)
	if err != nil {
		return 0, err
	}
	return resolve(ctx, h, e)
}

// ResolveSQL is [Resolve] on database/sql: db must be a *sql.DB or a
// *sql.Conn.
func ResolveSQL(ctx context.Context, db SQLDB, e *OutcomeUnknownError) (Outcome, error) {
	h, err := driver.SQL(db)
	if err != nil {
		return 0, err
	}
	return resolve(ctx, h, e)
}

func resolve[T any](ctx context.Context, h driver.Handle[T], e *OutcomeUnknownError) (Outcome, error) {
	switch {
	case e == nil:
		return 0, fmt.Errorf("%w: nil *OutcomeUnknownError", ErrInvalid)
	case h.InTx():
		return 0, fmt.Errorf("%w: Resolve needs a pool or a connection, not a transaction: its abandonment must commit before it probes", ErrInvalid)
	case e.Op == (OpID{}):
		return 0, fmt.Errorf("%w: the write has no operation id (a lease-checked write: re-read what it wrote)", ErrInvalid)
	}
	if err := validateName("resource", e.Resource); err != nil {
		return 0, err
	}
	var abandoned bool
	if err := h.Read(ctx, sqlAbandon, e.Resource, e.Op.String()).Scan(&abandoned); err != nil {
		return 0, err
	}
	var (
		token, writes int64
		op            sql.NullString
	)
	if err := h.Read(ctx, sqlProbe, e.Resource).Scan(&token, &writes, &op); err != nil {
		return 0, err
	}
	switch {
	case writes == 0 || token < e.Token:
		return NotApplied, nil
	case token == e.Token && op.Valid && op.String == e.Op.String():
		return Applied, nil
	default:
		return Superseded, nil
	}
}

// validateName checks a resource or lease key: 1 to MaxResourceLen bytes of
// UTF-8 without NUL, as the SQL functions require.
func validateName(what, s string) error {
	if len(s) == 0 || len(s) > MaxResourceLen {
		return fmt.Errorf("%w: %s must be 1 to %d bytes, got %d", ErrInvalid, what, MaxResourceLen, len(s))
	}
	if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s must be valid UTF-8 without NUL bytes", ErrInvalid, what)
	}
	return nil
}

// isUUID reports whether s is a UUID in a form PostgreSQL's uuid input
// accepts: 32 hex digits, optionally in braces, with at most one dash after
// any group of four digits (8-4-4-4-12 is the usual one).
func isUUID(s string) bool {
	if strings.HasPrefix(s, "{") {
		if !strings.HasSuffix(s, "}") {
			return false
		}
		s = s[1 : len(s)-1]
	}
	n := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '-':
			if n == 0 || n%4 != 0 || n == 32 || s[i-1] == '-' {
				return false
			}
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
			n++
		default:
			return false
		}
	}
	return n == 32
}

// read maps the error of a statement that changes nothing: a connection lost
// after it was sent is unavailable, not an unknown outcome.
func read(err error) error { return detail(pgerr.Classify(err, false)) }

// run runs one statement of an operator helper on db and scans its row: on a
// pool or a connection it commits on its own, so a connection lost after it
// was sent leaves its outcome unknown.
func run(ctx context.Context, db DB, sql string, args []any, dest ...any) error {
	h, err := driver.Pgx(db)
	if err != nil {
		return err
	}
	return detail(h.QueryRow(ctx, sql, args...).Scan(dest...))
}
