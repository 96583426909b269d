package leases

import (
	"context"
	"log/slog"
	"time"
)

// EventKind names a lease transition or a client state change.
type EventKind string

// Event kinds passed to [Config.OnEvent].
const (
	// EventAcquired: a grant committed (Token is the new token).
	EventAcquired EventKind = "acquired"
	// EventRenewed: a renewal committed.
	EventRenewed EventKind = "renewed"
	// EventRenewFailed: a renewal failed without losing the lease (yet).
	EventRenewFailed EventKind = "renew_failed"
	// EventReleased: the holder released the lease (or found it already ended).
	EventReleased EventKind = "released"
	// EventLost: the lease's context ended without a release; Err says why.
	EventLost EventKind = "lost"
	// EventForceReleased: [Client.ForceRelease] ended a grant.
	EventForceReleased EventKind = "force_released"
	// EventListenerUp: the LISTEN connection is (re)connected.
	EventListenerUp EventKind = "listener_up"
	// EventListenerDown: the LISTEN connection failed; waiters poll meanwhile.
	EventListenerDown EventKind = "listener_down"
)

// Event describes one transition, for [Config.OnEvent].
type Event struct {
	// Kind says what happened.
	Kind EventKind
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

func (c *Client) emit(e Event) {
	level := slog.LevelDebug
	switch e.Kind {
	case EventLost, EventListenerDown:
		level = slog.LevelWarn
	case EventRenewFailed, EventForceReleased:
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
	if c.cfg.OnEvent != nil {
		c.cfg.OnEvent(e)
	}
}
