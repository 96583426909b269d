package leases

import (
	"context"
	"log/slog"
)

// eventKind names a lease transition or a client state change, logged to
// [Config.Logger].
type eventKind string

const (
	eventAcquired      eventKind = "acquired"       // a grant committed
	eventRenewed       eventKind = "renewed"        // a renewal committed
	eventRenewFailed   eventKind = "renew_failed"   // a renewal failed without losing the lease (yet)
	eventReleased      eventKind = "released"       // the holder released the lease (or found it already ended)
	eventLost          eventKind = "lost"           // the lease's context ended without a release; Err says why
	eventForceReleased eventKind = "force_released" // [Client.ForceRelease] ended a grant
	eventListenerUp    eventKind = "listener_up"    // the LISTEN connection is (re)connected
	eventListenerDown  eventKind = "listener_down"  // the LISTEN connection failed; waiters poll meanwhile
)

// event describes one transition: Key, Holder and Token name the grant
// (none for listener events), Err is the cause for lost, renew_failed and
// listener_down.
type event struct {
	Kind   eventKind
	Key    string
	Holder string
	Token  int64
	Err    error
}

func (c *Client) emit(e event) {
	level := slog.LevelDebug
	switch e.Kind {
	case eventLost, eventListenerDown:
		level = slog.LevelWarn
	case eventRenewFailed, eventForceReleased:
		level = slog.LevelInfo
	}
	if c.cfg.Logger.Enabled(context.Background(), level) {
		attrs := []slog.Attr{slog.String("event", string(e.Kind))}
		if e.Key != "" {
			attrs = append(attrs, slog.String("key", e.Key), slog.String("holder", e.Holder), slog.Int64("token", e.Token))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.Any("err", e.Err))
		}
		c.cfg.Logger.LogAttrs(context.Background(), level, "pgfence lease "+string(e.Kind), attrs...)
	}
	if c.onEvent != nil { // tests only
		c.onEvent(e)
	}
}
