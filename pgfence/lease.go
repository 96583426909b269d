package pgfence

import (
	"context"
	"fmt"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Lease is a grant of a pgfence lease: the key it was granted for, the
// holder id of the grant (a UUID in text form) and its fencing token.
// *leases.Lease is one; [LeaseOf] makes one from values read over SQL or
// received from another process.
type Lease interface {
	Key() string
	Holder() string
	Token() int64
}

// LeaseOf returns the [Lease] granted for key to holder with token, for
// grants made outside the leases package (pgfence.try_acquire from SQL, or a
// lease whose values another process sent along). Fenced writes read only
// key and token, so holder may be empty for them; lease-checked writes need
// it.
func LeaseOf(key, holder string, token int64) Lease {
	return grant{key: key, holder: holder, token: token}
}

type grant struct {
	key, holder string
	token       int64
}

func (g grant) Key() string    { return g.key }
func (g grant) Holder() string { return g.holder }
func (g grant) Token() int64   { return g.token }

const sqlCheckLease = `SELECT pgfence.check_lease($1, $2, $3)`

// leaseWrite identifies the write op checked against lease, refusing a nil
// lease (or a nil *leases.Lease in it) with ErrInvalid.
func leaseWrite(op string, lease Lease) (*write, error) {
	if lease == nil {
		return nil, fmt.Errorf("%w: lease is nil", ErrInvalid)
	}
	if v := reflect.ValueOf(lease); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: lease is a nil %T", ErrInvalid, lease)
	}
	w := &write{op: op, resource: lease.Key(), token: lease.Token()}
	if op == opWriteLeased || op == opExecLeased {
		w.holder = lease.Holder()
	}
	return w, nil
}

// validateLease checks the lease of a lease-checked write.
func (w *write) validateLease() error {
	if err := validateName("lease key", w.resource); err != nil {
		return err
	}
	if err := validateToken(w.token); err != nil {
		return err
	}
	if !isUUID(w.holder) {
		return fmt.Errorf("%w: lease holder %q is not a UUID", ErrInvalid, w.holder)
	}
	return nil
}

// Write is [Fencer.WriteToken] for the resource named by the lease's key,
// with the lease's token: the fenced write of the lease's holder, where the
// token cannot be paired with another resource. To fence a resource named
// otherwise, take the lease on that name.
//
// A fenced write accepts the token until a newer token of the key has been
// accepted for the resource: a holder whose lease expired can still write
// until the next holder has written (the fencing-token contract). To refuse
// a holder the moment its lease is lost, use [Fencer.WriteLeased].
func (f *Fencer) Write(ctx context.Context, db DB, lease Lease, fn func(ctx context.Context, tx pgx.Tx) error) (Receipt, error) {
	w, err := leaseWrite(opWrite, lease)
	if err != nil {
		return Receipt{}, err
	}
	return f.WriteToken(ctx, db, w.resource, w.token, fn)
}

// Exec is [Fencer.ExecToken] for the resource named by the lease's key, with
// the lease's token, as [Fencer.Write] is for [Fencer.WriteToken].
func (f *Fencer) Exec(ctx context.Context, db DB, lease Lease, sql string, args ...any) (pgconn.CommandTag, error) {
	w, err := leaseWrite(opExec, lease)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return f.ExecToken(ctx, db, w.resource, w.token, sql, args...)
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
// pgfence.check_lease(), that lease is still live and held by its holder with
// its token, by the database clock. The check takes FOR SHARE on the lease
// row, so a takeover waits until this transaction ends: fn's writes commit
// only while the lease is held. A lost lease returns a *[LeaseNotHeldError]
// (errors.Is [ErrLeaseNotHeld]) and fn is not called.
//
// The lease can still expire between the check and COMMIT, but nobody can take
// it over in between; hold a margin (the leases package's trust window) before
// starting long work. Other errors are as for [Fencer.WriteToken], except a
// COMMIT whose answer is lost: a lease-checked write records no operation id,
// so it returns an error wrapping [ErrOutcomeUnknown], not an
// *[OutcomeUnknownError] for [Resolve]; re-read the business rows fn wrote
// to learn whether it committed.
func (f *Fencer) WriteLeased(ctx context.Context, db DB, lease Lease, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if err := checkDB(db); err != nil {
		return err
	}
	w, err := leaseWrite(opWriteLeased, lease)
	if err != nil {
		return err
	}
	return f.observed(ctx, pgxSession{db}, w, func(ctx context.Context) error {
		return writeLeased(ctx, pgxSession{db}, w, fn)
	})
}

// ExecLeased checks lease as [Fencer.WriteLeased] does and runs one
// statement, in a single round trip and one implicit transaction. Errors are
// as for [Fencer.WriteLeased].
func (f *Fencer) ExecLeased(ctx context.Context, db DB, lease Lease, sql string, args ...any) (tag pgconn.CommandTag, err error) {
	if err := checkDB(db); err != nil {
		return pgconn.CommandTag{}, err
	}
	w, err := leaseWrite(opExecLeased, lease)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	err = f.observed(ctx, pgxSession{db}, w, func(ctx context.Context) error {
		tag, err = execLeased(ctx, pgxSession{db}, w, sql, args)
		return err
	})
	return tag, err
}
