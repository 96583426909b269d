package pgfence

import (
	"context"
	"log/slog"
)

type loggerKey struct{}

var discard = slog.New(slog.DiscardHandler)

// ContextWithLogger returns a copy of ctx that carries logger: the package's
// helpers called with it (or a context derived from it) log one event per
// fenced write. The package keeps no logger of its own, so it is quiet by
// default; a nil logger makes it quiet again.
//
// Events (message, level):
//
//   - "pgfence: write accepted" at [slog.LevelDebug];
//   - "pgfence: write rejected" at [slog.LevelInfo]: a stale token, a lost
//     lease or an unfenced write to a protected table. A rejection is the
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
func ContextWithLogger(ctx context.Context, logger *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, logger)
}

// loggerFrom returns ctx's logger, or one that discards everything.
func loggerFrom(ctx context.Context) *slog.Logger {
	if l, _ := ctx.Value(loggerKey{}).(*slog.Logger); l != nil {
		return l
	}
	return discard
}
