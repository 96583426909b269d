package pgfence

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Lease is a grant of the pgfence.leases row Key to Holder with Token, as the
// leases package (or any client of the SQL API) returns it:
//
//	pgfence.Lease{Key: l.Key(), Holder: l.Holder(), Token: l.Token()}
type Lease struct {
	Key string
	// Holder is the grant's holder id, a UUID in text form.
	Holder string
	Token  int64
}

const sqlCheckLease = `SELECT pgfence.check_lease($1, $2, $3)`

func (l Lease) validate() error {
	if err := validateName("lease key", l.Key); err != nil {
		return err
	}
	if l.Token <= 0 {
		return fmt.Errorf("%w: lease token must be positive, got %d", ErrInvalid, l.Token)
	}
	if !isUUID(l.Holder) {
		return fmt.Errorf("%w: lease holder %q is not a UUID", ErrInvalid, l.Holder)
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

// WriteLeased runs fn in a transaction that first checks, with
// pgfence.check_lease(), that lease is still live and held by lease.Holder
// with lease.Token, by the database clock. The check takes FOR SHARE on the
// lease row, so a takeover waits until this transaction ends: fn's writes
// commit only while the lease is held. A lost lease returns a
// *[LeaseNotHeldError] (errors.Is [ErrLeaseNotHeld]) and fn is not called.
//
// The lease can still expire between the check and COMMIT, but nobody can take
// it over in between; hold a margin (the leases package's trust window) before
// starting long work. Other errors are as for [Write], except a COMMIT whose
// answer is lost: a lease-checked write records no operation id, so it
// returns an error wrapping [ErrOutcomeUnknown], not an
// *[OutcomeUnknownError] for [Resolve]; re-read the business rows fn wrote
// to learn whether it committed.
func WriteLeased(ctx context.Context, db DB, lease Lease, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	if err := checkDB(db); err != nil {
		return err
	}
	ctx, done := startWrite(ctx, db, &write{op: opWriteLeased, resource: lease.Key, token: lease.Token, holder: lease.Holder}, leaseAttrs(lease)...)
	defer func() { done(err) }()
	if err := lease.validate(); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: fn is nil", ErrInvalid)
	}
	tx, release, err := begin(ctx, db)
	if err != nil {
		return err
	}
	defer release()
	returned := false
	defer endOnPanic(ctx, tx, &returned, &err)
	if _, err := tx.Exec(ctx, sqlCheckLease, lease.Key, lease.Holder, lease.Token); err != nil {
		return rollback(ctx, tx, mapError(err, false))
	}
	ferr := fn(ctx, tx)
	returned = true
	if ferr != nil {
		return rollback(ctx, tx, mapFnError(tx, ferr))
	}
	if endedByFn(tx) {
		return rollback(ctx, tx, fnEndedTx(true))
	}
	if err := tx.Commit(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxClosed) {
			return fnEndedTx(ownCommit(db))
		}
		return mapError(err, ownCommit(db))
	}
	return nil
}

// ExecLeased checks lease as [WriteLeased] does and runs one statement, in a
// single round trip and one implicit transaction. Errors are as for
// [WriteLeased].
func ExecLeased(ctx context.Context, db DB, lease Lease, sql string, args ...any) (_ pgconn.CommandTag, err error) {
	if err := checkDB(db); err != nil {
		return pgconn.CommandTag{}, err
	}
	ctx, done := startWrite(ctx, db, &write{op: opExecLeased, resource: lease.Key, token: lease.Token, holder: lease.Holder}, leaseAttrs(lease)...)
	defer func() { done(err) }()
	if err := lease.validate(); err != nil {
		return pgconn.CommandTag{}, err
	}
	conn, release, err := acquire(ctx, db)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer release()
	b := &pgx.Batch{}
	b.Queue(sqlCheckLease, lease.Key, lease.Holder, lease.Token)
	b.Queue(sql, args...)
	tag, err := execBatch(ctx, conn, b)
	if err != nil {
		return tag, mapError(err, ownCommit(db))
	}
	return tag, nil
}
