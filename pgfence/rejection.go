package pgfence

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/driver"
	"github.com/pgfence/pgfence/internal/telemetry"
)

// Rejection is one rejected fenced or lease-checked write, as stored in
// pgfence.fence_rejections.
type Rejection struct {
	ID int64
	// Resource is the fenced resource (for a lease-checked write: the lease
	// key).
	Resource string
	// PresentedToken is the writer's token.
	PresentedToken int64
	// AcceptedToken is the token that beat it (for a lease: the current
	// holder's token after a takeover); 0 if unknown.
	AcceptedToken int64
	// Reason is "stale_token", "lease_not_held" or "token_not_issued".
	Reason string
	// LeaseReason is why the lease was not held ("missing", "taken_over",
	// "released", "expired"), empty for a stale token.
	LeaseReason string
	// Operation is the helper that was refused: write, exec, write_leased or
	// exec_leased (empty when another client recorded it).
	Operation string
	// Op is the refused write's operation id (zero when it had none).
	Op OpID
	// TraceID is the trace of the refused call, if it was traced.
	TraceID string
	// At is when the rejection was recorded (database clock).
	At time.Time
}

// recordTimeout bounds the statement that records a rejection: a rejected
// caller never waits longer than this for its audit row.
const recordTimeout = time.Second

const (
	sqlRecordRejection = `SELECT 1 FROM pgfence.record_fence_rejection($1, $2, $3, $4, $5, $6, $7, $8)`
	sqlRejections      = `SELECT id, resource, presented_token, coalesce(accepted_token, 0), reason,
       coalesce(lease_reason, ''), coalesce(operation, ''), ` + sqlOp + `, coalesce(trace_id, ''), at
  FROM pgfence.fence_rejections WHERE resource = $1 ORDER BY at DESC, id DESC LIMIT $2`
)

// Rejections returns the newest recorded rejections of resource (newest
// first), at most limit of them (0: 20; at most 1000). Rows are kept
// for 7 days.
//
// [Write] and [Exec] record a rejection (one extra statement, only on a
// rejection) when they ran in their own transaction: on a pool or a
// connection. Inside a caller's transaction the rejection aborts or rolls
// back with the caller's work, so it is recorded only in the span and the
// pgfence.fence.operations metric. The record is best effort: it commits with
// synchronous_commit off and a failure to record never changes the write's
// error.
func Rejections(ctx context.Context, db DB, resource string, limit int) ([]Rejection, error) {
	if err := driver.NilHandle(db); err != nil {
		return nil, err
	}
	// A name no write could use is the caller's mistake, not an empty
	// history (and the server would refuse invalid UTF-8 with 22021).
	if err := validateName("resource", resource); err != nil {
		return nil, err
	}
	return list(ctx, db, sqlRejections, resource, limit, 20, 1000, func(row pgx.CollectableRow) (Rejection, error) {
		var r Rejection
		err := row.Scan(&r.ID, &r.Resource, &r.PresentedToken, &r.AcceptedToken, &r.Reason,
			&r.LeaseReason, &r.Operation, &r.Op, &r.TraceID, &r.At)
		return r, err
	})
}

// rejectionOf returns the audit row of err, an error of the write w, when it
// is a rejection.
func rejectionOf(err error, w *aWrite) (Rejection, bool) {
	var (
		stale     *StaleTokenError
		lost      *LeaseLostError
		notIssued *TokenNotIssuedError
	)
	r := Rejection{Resource: w.resource, PresentedToken: w.token, Operation: w.op, Op: w.id}
	switch {
	case errors.As(err, &stale):
		r.Reason = outcomeStaleToken
		r.AcceptedToken = stale.Accepted
	case errors.As(err, &lost):
		r.Reason = outcomeLeaseNotHeld
		r.LeaseReason = lost.Reason
		r.AcceptedToken = lost.Current
	case errors.As(err, &notIssued):
		r.Reason = outcomeNotIssued
		r.AcceptedToken = notIssued.Issued
	default:
		return Rejection{}, false
	}
	return r, true
}

// record stores r in pgfence.fence_rejections, best effort: skipped in the
// caller's transaction (aborted, or rolled back with the caller's work) or
// once ctx has ended, and bounded by recordTimeout.
func record[T any](ctx context.Context, h driver.Handle[T], r Rejection) {
	if h.InTx() || ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	var op, traceID, leaseReason any
	if r.Op != (OpID{}) {
		op = r.Op.String()
	}
	if id := telemetry.TraceID(ctx); id != "" {
		traceID = id
	}
	if r.LeaseReason != "" {
		leaseReason = r.LeaseReason
	}
	_ = h.QueryRow(ctx, sqlRecordRejection, r.Resource, r.PresentedToken, r.AcceptedToken, r.Reason,
		leaseReason, r.Operation, op, traceID).Scan(new(int))
}
