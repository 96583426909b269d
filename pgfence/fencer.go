package pgfence

import (
	"context"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Config configures a [Fencer]. A nil *Config and zero fields use the
// defaults.
type Config struct {
	// Logger receives one event per write; see [Fencer] for the events.
	// Default: discard.
	Logger *slog.Logger
	// MeterProvider makes the pgfence.fence.* instruments. Default: the
	// global provider (otel.GetMeterProvider), a no-op until the application
	// sets one; instruments made before it is set follow it once it is.
	MeterProvider metric.MeterProvider
	// TracerProvider makes the spans of the writes. Default: the global
	// provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
}

// Fencer runs fenced and lease-checked writes and reports them to one
// configuration of logs, metrics and traces. It holds no connection and no
// state besides its instruments: it is safe for concurrent use, and one per
// process is enough. The package-level functions [Write], [Exec],
// [WriteToken], [ExecToken], [WriteLeased], [ExecLeased] and [UpdateRow] use
// a Fencer with the default configuration (no logs; the global OpenTelemetry
// providers).
//
// Log events (message, level):
//
//   - "pgfence: write accepted" at [slog.LevelDebug];
//   - "pgfence: write rejected" at [slog.LevelInfo]: a stale token, a lost
//     lease, a token the lease has not issued, or an unfenced write to a
//     protected table. A rejection is the
//     fence doing its job, not a fault of this process, hence Info, not Warn;
//   - "pgfence: write outcome unknown" at [slog.LevelWarn]: resolve it with
//     [Resolve];
//   - "pgfence: write failed" at [slog.LevelDebug] for other errors, which
//     the caller gets and logs as it sees fit;
//   - "pgfence: recording a rejection failed" at [slog.LevelDebug].
//
// Attributes: pgfence.operation, the resource or lease key and holder, the
// token, the write's operation id, the outcome, error.type and trace_id —
// never SQL arguments, payloads or connection strings.
type Fencer struct {
	log *slog.Logger
	tel *instruments
}

// New returns a Fencer configured by cfg (nil for the defaults). A nil or
// zero *Fencer works as the default one (no logs, the global providers).
func New(cfg *Config) *Fencer {
	if cfg == nil {
		cfg = &Config{}
	}
	f := &Fencer{log: cfg.Logger}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	mp, tp := cfg.MeterProvider, cfg.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	f.tel = newInstruments(mp, tp)
	return f
}

// defaultFencer is the Fencer of the package-level functions. The global
// providers it is made from delegate to the providers the application sets
// later, so it is made once.
var defaultFencer = sync.OnceValue(func() *Fencer { return New(nil) })

// Write is [Fencer.Write] with the default configuration.
func Write(ctx context.Context, db DB, lease Lease, fn func(ctx context.Context, tx pgx.Tx) error) (Receipt, error) {
	return defaultFencer().Write(ctx, db, lease, fn)
}

// Exec is [Fencer.Exec] with the default configuration.
func Exec(ctx context.Context, db DB, lease Lease, sql string, args ...any) (pgconn.CommandTag, error) {
	return defaultFencer().Exec(ctx, db, lease, sql, args...)
}

// WriteToken is [Fencer.WriteToken] with the default configuration.
func WriteToken(ctx context.Context, db DB, resource string, token int64, fn func(ctx context.Context, tx pgx.Tx) error) (Receipt, error) {
	return defaultFencer().WriteToken(ctx, db, resource, token, fn)
}

// ExecToken is [Fencer.ExecToken] with the default configuration.
func ExecToken(ctx context.Context, db DB, resource string, token int64, sql string, args ...any) (pgconn.CommandTag, error) {
	return defaultFencer().ExecToken(ctx, db, resource, token, sql, args...)
}

// WriteLeased is [Fencer.WriteLeased] with the default configuration.
func WriteLeased(ctx context.Context, db DB, lease Lease, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return defaultFencer().WriteLeased(ctx, db, lease, fn)
}

// ExecLeased is [Fencer.ExecLeased] with the default configuration.
func ExecLeased(ctx context.Context, db DB, lease Lease, sql string, args ...any) (pgconn.CommandTag, error) {
	return defaultFencer().ExecLeased(ctx, db, lease, sql, args...)
}

// UpdateRow is [Fencer.UpdateRow] with the default configuration.
func UpdateRow(ctx context.Context, db DB, t Table, id any, token int64, set map[string]any) error {
	return defaultFencer().UpdateRow(ctx, db, t, id, token, set)
}

// observed runs body as the write w on db: the write's span, metrics and log
// event around it (observation only), then, for a rejection, the audit record
// of it in pgfence.fence_rejections (a write of its own on db, see
// [Rejections]).
func (f *Fencer) observed(ctx context.Context, db recorder, w *write, body func(ctx context.Context) error) error {
	if f == nil || f.tel == nil { // a nil or zero Fencer is the default one, as in sqlfence
		f = defaultFencer()
	}
	ctx, done := f.tel.start(ctx, f.log, w)
	returned := false
	defer func() {
		if !returned { // the caller's fn panicked; the panic goes on
			done(errFnPanicked)
		}
	}()
	err := body(ctx)
	returned = true
	r, rejected := done(err)
	if rejected {
		f.recordRejection(ctx, db, w, r)
	}
	return err
}
