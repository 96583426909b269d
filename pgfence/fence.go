package pgfence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what the helpers run on: a [*pgxpool.Pool], a [*pgx.Conn] or a
// [pgx.Tx]. On a pool or connection each helper runs its own transaction; on a
// Tx it joins the caller's transaction ([pgx.Tx.Begin] is a savepoint there), so
// the fence and the caller's other writes commit or roll back together.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

var (
	_ DB = (*pgxpool.Pool)(nil)
	_ DB = (*pgx.Conn)(nil)
	_ DB = pgx.Tx(nil)
)

// MaxResourceLen is the longest resource name, in bytes (not characters);
// pgfence.fence() enforces the same limit for other clients (PF008).
const MaxResourceLen = 512

// MaxReasonLen is the longest reason of [RaiseTokenFloor], in characters;
// pgfence.raise_token_floor() enforces the same limit.
const MaxReasonLen = 1000

// SQL run by the helpers; the functions are installed by the migrations.
const (
	sqlFence    = `SELECT pgfence.fence($1, $2, $3)`
	sqlAccepted = `SELECT token, writes, op FROM pgfence.fences WHERE resource = $1`
	// sqlProbe waits for any transaction that holds the fence row (or is
	// inserting it) and returns the newest committed state, changing nothing
	// (pgfence.fence_probe undoes its probe row itself, so the application
	// role needs no write privilege on pgfence.fences). writes = 0 means no
	// token was ever accepted.
	sqlProbe = `SELECT token, writes, op FROM pgfence.fence_probe($1)`
	// sqlAbandon gives up a write whose outcome is unknown, by its
	// operation id: from its commit on, pgfence.fence() refuses the write if
	// it still arrives (PF013), so a NotApplied answered after it is final.
	sqlAbandon = `SELECT pgfence.abandon_fence($1, $2)`
)

// OpID identifies one fenced write. It is stored with the accepted token so
// that a write whose commit outcome is unknown can be resolved ([Resolve]).
type OpID [16]byte

// String formats the id as a UUID.
func (id OpID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}

func newOpID() OpID {
	var id OpID
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails (Go 1.24+)
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	return id
}

// Receipt describes an accepted, committed fenced write.
type Receipt struct {
	Resource string
	Token    int64
	Op       OpID
}

// validateResource checks a resource name as every fenced write does.
func validateResource(resource string) error { return validateName("resource", resource) }

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

func validate(resource string, token int64) error {
	if err := validateResource(resource); err != nil {
		return err
	}
	return validateToken(token)
}

// validateToken checks a token as the SQL functions do: 1 to MaxToken.
func validateToken(token int64) error {
	if token <= 0 || token > MaxToken {
		return fmt.Errorf("%w: token must be 1 to %d, got %d", ErrInvalid, MaxToken, token)
	}
	return nil
}

// WriteToken runs fn in a transaction that first presents token for
// resource: pgfence.fence() accepts it iff resource's lease issued it, no
// floor retired it, and no higher token was accepted for resource (equal
// tokens pass), records it, and keeps the fence row locked
// until the transaction ends, so fn's writes commit only together with the
// acceptance.
//
// Tokens count per lease key: compare only tokens of one key. A token must
// come from the lease whose key is resource (or from a key whose tokens alone
// fence resource); [Fencer.Write] takes the lease itself and cannot pair them
// wrongly. Use WriteToken when all you have is the token, such as one that
// came with a request from the lease's holder.
//
// A stale token returns a *[StaleTokenError] (errors.Is [ErrStaleToken]) and fn
// is not called. If fn returns an error the transaction rolls back and that
// error is returned unchanged (pgfence SQLSTATEs raised inside fn are mapped);
// if fn panics, the transaction rolls back and the panic goes on. fn must not
// commit or roll back tx itself (tx.Commit, tx.Rollback, or COMMIT or
// ROLLBACK sent as SQL): WriteToken then returns an error wrapping
// [ErrInvalid], and also [ErrOutcomeUnknown] when the transaction it opened
// itself (or a caller's transaction ended by SQL) may have committed.
// A COMMIT whose answer is lost returns an *[OutcomeUnknownError]; pass it to
// [Resolve].
//
// On a [pgx.Tx], WriteToken runs in a savepoint of the caller's transaction:
// a rejection rolls back only the savepoint, and nothing is durable until the
// caller commits. It costs BEGIN, the fence, fn's statements and COMMIT;
// [Fencer.ExecToken] does a single statement in one round trip.
func (f *Fencer) WriteToken(ctx context.Context, db DB, resource string, token int64, fn func(ctx context.Context, tx pgx.Tx) error) (r Receipt, err error) {
	if err := checkDB(db); err != nil {
		return Receipt{}, err
	}
	w := &write{op: opWrite, resource: resource, token: token}
	err = f.observed(ctx, pgxSession{db}, w, func(ctx context.Context) error {
		r, err = writeFenced(ctx, pgxSession{db}, w, fn)
		return err
	})
	return r, err
}

// unknown wraps an ErrOutcomeUnknown error into an *OutcomeUnknownError.
func unknown(err error, resource string, token int64, op OpID) error {
	if errors.Is(err, ErrOutcomeUnknown) {
		return &OutcomeUnknownError{Resource: resource, Token: token, Op: op, err: err}
	}
	return err
}

// ExecToken presents token for resource and runs one statement (sql with
// args) in a single round trip: both are sent as one pipeline that the server
// runs as one implicit transaction, so the statement commits only if the
// token is accepted. It returns the statement's command tag.
//
// On a [pgx.Tx] both statements join the caller's transaction and a rejection
// aborts it, as any failing statement does; use [Fencer.WriteToken] to
// confine a rejection to a savepoint. Tokens and errors are as for
// [Fencer.WriteToken].
func (f *Fencer) ExecToken(ctx context.Context, db DB, resource string, token int64, sql string, args ...any) (tag pgconn.CommandTag, err error) {
	if err := checkDB(db); err != nil {
		return pgconn.CommandTag{}, err
	}
	w := &write{op: opExec, resource: resource, token: token}
	err = f.observed(ctx, pgxSession{db}, w, func(ctx context.Context) error {
		tag, err = execFenced(ctx, pgxSession{db}, w, sql, args)
		return err
	})
	return tag, err
}

// FenceState is the state of one fenced resource.
type FenceState struct {
	// Token is the highest token accepted for the resource.
	Token int64
	// Writes counts the accepted writes.
	Writes int64
	// Op is the operation id of the last accepted write (zero if it had none).
	Op OpID
}

// Accepted returns the state of resource: the highest token accepted for it,
// or [ErrNotFound] if none was. It reads the last committed state without
// waiting for writers in flight; after an unknown outcome use [Resolve].
func Accepted(ctx context.Context, db DB, resource string) (FenceState, error) {
	if err := checkDB(db); err != nil {
		return FenceState{}, err
	}
	if err := validateResource(resource); err != nil {
		return FenceState{}, err
	}
	var a FenceState
	var op *[16]byte
	err := db.QueryRow(ctx, sqlAccepted, resource).Scan(&a.Token, &a.Writes, &op)
	if errors.Is(err, pgx.ErrNoRows) {
		return FenceState{}, fmt.Errorf("%w: no token accepted for resource %q", ErrNotFound, resource)
	}
	if err != nil {
		return FenceState{}, mapError(err, false)
	}
	if op != nil {
		a.Op = *op
	}
	return a, nil
}

// Outcome is what [Resolve] learned about a write with an unknown outcome.
type Outcome int

const (
	// NotApplied: the write did not commit; it may be retried (with a token
	// that is still current).
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
// and makes the answer final. It runs two statements, each in a transaction
// of its own: pgfence.abandon_fence commits that the write's operation is
// given up, so that from then on the server refuses it if it still arrives
// (held in the network, queued in a pooler, waiting for the fence row lock);
// then pgfence.fence_probe waits for any transaction still holding the
// resource's fence row and compares the accepted token and operation id with
// the write's. [NotApplied] therefore stays true: the write can no longer
// commit, and retrying it (with a token that is still current) applies it
// once. Apart from the abandonment record, Resolve changes nothing.
//
// db must be a pool or a connection, not a [pgx.Tx]: inside a caller's
// transaction the abandonment would not be committed before the probe, and
// the answer could not be final ([ErrInvalid]).
func Resolve(ctx context.Context, db DB, e *OutcomeUnknownError) (Outcome, error) {
	if err := checkDB(db); err != nil {
		return 0, err
	}
	return resolve(ctx, pgxSession{db}, e)
}
