package leases

import (
	"context"
	"log/slog"
	"time"
)

// eventKind names a lease transition or a client state change, logged to
// [Config.Logger].
type eventKind string

const (
	// eventAcquired: a grant committed (Token is the new token).
	eventAcquired eventKind = "acquired"
	// eventRenewed: a renewal committed.
	eventRenewed eventKind = "renewed"
	// eventRenewFailed: a renewal failed without losing the lease (yet).
	eventRenewFailed eventKind = "renew_failed"
	// eventReleased: the holder released the lease (or found it already ended).
	eventReleased eventKind = "released"
	// eventLost: the lease's context ended without a release; Err says why.
	eventLost eventKind = "lost"
	// eventForceReleased: [Client.ForceRelease] ended a grant.
	eventForceReleased eventKind = "force_released"
	// eventListenerUp: the LISTEN connection is (re)connected.
	eventListenerUp eventKind = "listener_up"
	// eventListenerDown: the LISTEN connection failed; waiters poll meanwhile.
	eventListenerDown eventKind = "listener_down"
)

// event describes one transition.
type event struct {
	// Kind says what happened.
	Kind eventKind
	// Key is the lease key; empty for listener events.
	Key string
	// Holder and Token identify the grant concerned.
	Holder string
	Token  int64
	// Duration is the statement's latency for acquired/renewed/released, and
	// the time waited for an acquire.
	Duration time.Duration
	// Err is the cause for lost, renew_failed and listener_down.
	Err error
}

func (c *Client) emit(e event) {
	level := slog.LevelDebug
	switch e.Kind {
	case eventLost, eventListenerDown:
		level = slog.LevelWarn
	case eventRenewFailed, eventForceReleased:
		level = slog.LevelInfo
	}
	if c.log.Enabled(context.Background(), level) {
		attrs := []slog.Attr{slog.String("event", string(e.Kind))}
		if e.Key != "" {
			attrs = append(attrs, slog.String("key", e.Key), slog.String("holder", e.Holder), slog.Int64("token", e.Token))
		}
		if e.Duration > 0 {
			attrs = append(attrs, slog.Duration("duration", e.Duration))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.Any("err", e.Err))
		}
		c.log.LogAttrs(context.Background(), level, "pgfence lease "+string(e.Kind), attrs...)
	}
	if c.onEvent != nil { // tests only
		c.onEvent(e)
	}
}
