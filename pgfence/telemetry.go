package pgfence

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/telemetry"
)

// InstrumentationName is the name of this package's OpenTelemetry meter and
// tracer.
const InstrumentationName = "github.com/pgfence/pgfence/pgfence"

// Operations (the pgfence.operation attribute and the span name suffix).
const (
	opWrite       = "write"
	opExec        = "exec"
	opWriteLeased = "write_leased"
	opExecLeased  = "exec_leased"
	opUpdateRow   = "update_row"
)

// Outcomes (the pgfence.outcome attribute).
const (
	outcomeAccepted     = "accepted"
	outcomeStaleToken   = "stale_token"
	outcomeLeaseNotHeld = "lease_not_held"
	outcomeNotIssued    = "token_not_issued"
	outcomeUnfenced     = "unfenced"
	outcomeUnknown      = "unknown"
	outcomeError        = "error"
)

const (
	attrResource = attribute.Key("pgfence.fence.resource")
	attrToken    = attribute.Key("pgfence.fence.token")
	attrOp       = attribute.Key("pgfence.fence.op")
	attrAccepted = attribute.Key("pgfence.fence.accepted_token")
	attrLeaseKey = attribute.Key("pgfence.lease.key")
	attrHolder   = attribute.Key("pgfence.lease.holder")
	attrLeaseTok = attribute.Key("pgfence.lease.token")
	attrReason   = attribute.Key("pgfence.lease.reason")
	attrTable    = attribute.Key("db.collection.name")
)

// spanNames and outcomeSets are built once: every write would otherwise
// concatenate its span name and sort its metric attributes, even with the
// default no-op providers.
var (
	spanNames   = map[string]string{}
	outcomeSets = map[[2]string]attribute.Set{}
)

func init() {
	for _, op := range []string{opWrite, opExec, opWriteLeased, opExecLeased, opUpdateRow} {
		spanNames[op] = "pgfence.fence." + op
		for _, outcome := range []string{outcomeAccepted, outcomeStaleToken, outcomeLeaseNotHeld, outcomeNotIssued, outcomeUnfenced, outcomeUnknown, outcomeError} {
			outcomeSets[[2]string{op, outcome}] = attribute.NewSet(telemetry.Operation.String(op), telemetry.Outcome.String(outcome))
		}
	}
}

// instruments are a Fencer's tracer and instruments.
type instruments struct {
	tracer   trace.Tracer
	writes   metric.Int64Counter
	duration metric.Float64Histogram
}

func newInstruments(mp metric.MeterProvider, tp trace.TracerProvider) *instruments {
	m := mp.Meter(InstrumentationName)
	report := func(err error) { otel.Handle(err) }
	return &instruments{
		tracer: tp.Tracer(InstrumentationName),
		writes: telemetry.Counter(m, "pgfence.fence.writes", "{write}",
			"Fenced and lease-checked writes by pgfence.operation and outcome: accepted, stale_token, lease_not_held, token_not_issued, unfenced, unknown, error.", report),
		duration: telemetry.Seconds(m, "pgfence.fence.duration",
			"Duration of fenced and lease-checked writes, by pgfence.operation and outcome.", report),
	}
}

// write identifies one fenced or lease-checked write for its span, log
// events and rejection record.
type write struct {
	op       string // opWrite, opExec, …
	resource string // the fence resource or lease key ("" for UpdateRow: the error names it)
	token    int64  // the presented token
	holder   string // the lease holder (lease-checked writes)
	table    string // the table of an UpdateRow
	id       OpID   // the write's operation id, once drawn
}

// logAttrs are the attributes of one write's log events.
type logAttrs []any

func (w *write) logAttrs(ctx context.Context) logAttrs {
	a := logAttrs{"pgfence.operation", w.op}
	if w.holder != "" {
		a = append(a, "pgfence.lease.key", w.resource, "pgfence.lease.holder", w.holder, "pgfence.lease.token", w.token)
	} else {
		if w.resource != "" {
			a = append(a, "pgfence.fence.resource", w.resource)
		}
		a = append(a, "pgfence.fence.token", w.token)
	}
	if w.id != (OpID{}) {
		a = append(a, "pgfence.fence.op", w.id.String())
	}
	if id := telemetry.TraceID(ctx); id != "" {
		a = append(a, "trace_id", id)
	}
	return a
}

// attrs are the span attributes that identify w: the resource and token, or
// the lease key, holder and token, or the table and token.
func (w *write) attrs() []attribute.KeyValue {
	switch {
	case w.holder != "":
		return []attribute.KeyValue{attrLeaseKey.String(w.resource), attrHolder.String(w.holder), attrLeaseTok.Int64(w.token)}
	case w.table != "":
		return []attribute.KeyValue{attrToken.Int64(w.token), attrTable.String(w.table)}
	}
	return []attribute.KeyValue{attrResource.String(w.resource), attrToken.Int64(w.token)}
}

// start starts the span of the write w; the returned function ends it,
// records the outcome in the metrics and in log, and returns the rejection
// the outcome is, if it is one (its audit record is the caller's step). It
// only observes: it sends nothing to the database.
func (t *instruments) start(ctx context.Context, log *slog.Logger, w *write) (context.Context, func(error) (Rejection, bool)) {
	start := time.Now()
	op := w.op
	ctx, span := t.tracer.Start(ctx, spanNames[op], trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(w.attrs(), telemetry.DBSystem, telemetry.Operation.String(op))...))
	return ctx, func(err error) (Rejection, bool) {
		outcome := outcomeAccepted
		if err != nil {
			outcome = writeOutcome(err, span)
		}
		if w.id != (OpID{}) && span.IsRecording() {
			span.SetAttributes(attrOp.String(w.id.String()))
		}
		set := metric.WithAttributeSet(outcomeSets[[2]string{op, outcome}])
		mctx := context.WithoutCancel(ctx)
		t.writes.Add(mctx, 1, set)
		t.duration.Record(mctx, time.Since(start).Seconds(), set)
		span.SetAttributes(telemetry.Outcome.String(outcome))
		telemetry.End(span, err)

		var (
			r        Rejection
			rejected bool
		)
		switch outcome {
		case outcomeAccepted:
			// The common case: no attributes are built for a disabled level.
			if log.Enabled(ctx, slog.LevelDebug) {
				log.DebugContext(ctx, "pgfence: write accepted", w.logAttrs(ctx)...)
			}
		case outcomeStaleToken, outcomeLeaseNotHeld, outcomeNotIssued, outcomeUnfenced:
			la := append(w.logAttrs(ctx), "pgfence.outcome", outcome)
			r, rejected = rejectionOf(err, w)
			if rejected {
				la = append(la, "pgfence.fence.accepted_token", r.AcceptedToken)
				if r.LeaseReason != "" {
					la = append(la, "pgfence.lease.reason", r.LeaseReason)
				}
				if w.resource == "" {
					la = append(la, "pgfence.fence.resource", r.Resource)
				}
			}
			log.InfoContext(ctx, "pgfence: write rejected", la...)
		case outcomeUnknown:
			log.WarnContext(ctx, "pgfence: write outcome unknown", append(w.logAttrs(ctx), "error.type", telemetry.ErrorTypeOf(err))...)
		default:
			if log.Enabled(ctx, slog.LevelDebug) {
				log.DebugContext(ctx, "pgfence: write failed", append(w.logAttrs(ctx), "error.type", telemetry.ErrorTypeOf(err))...)
			}
		}
		return r, rejected
	}
}

// writeOutcome classifies a failed write for its span, metrics and log, and
// adds the rejection event to span. (Apart from the accepted path, so that
// the accepted path allocates no error targets.)
func writeOutcome(err error, span trace.Span) string {
	var (
		stale *StaleTokenError
		lost  *LeaseNotHeldError
	)
	switch {
	case errors.As(err, &stale):
		span.AddEvent("pgfence.rejected", trace.WithAttributes(attrAccepted.Int64(stale.Accepted)))
		return outcomeStaleToken
	case errors.As(err, &lost):
		span.AddEvent("pgfence.rejected", trace.WithAttributes(attrReason.String(lost.Reason), attrLeaseTok.Int64(lost.Current)))
		return outcomeLeaseNotHeld
	case errors.Is(err, ErrStaleToken):
		return outcomeStaleToken
	case errors.Is(err, ErrLeaseNotHeld):
		return outcomeLeaseNotHeld
	case errors.Is(err, ErrTokenNotIssued):
		return outcomeNotIssued
	case errors.Is(err, ErrUnfencedWrite):
		return outcomeUnfenced
	case errors.Is(err, ErrOutcomeUnknown):
		return outcomeUnknown
	}
	return outcomeError
}
