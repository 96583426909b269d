package leases

import "time"

// SetSeenEpoch makes c believe it already saw a grant from timeline epoch.
func SetSeenEpoch(c *Client, epoch int64) { c.seenEpoch.Store(epoch) }

// SeenEpoch is the highest token epoch c has seen.
func SeenEpoch(c *Client) int64 { return c.seenEpoch.Load() }

// ModuleVersion is the version ClientVersion reports for build info bi.
var ModuleVersion = moduleVersion

// SetClockOffset shifts the wall clock c reads by d against the database's
// (and against time.Now), as if the client's host clock were off. Call it
// before c is used.
func SetClockOffset(c *Client, d time.Duration) { c.clockOffset = d }

// Delay is how long c's head waiter sleeps after its attempt-th failed try
// while the holder has remaining left (0: unknown), and whether the sleep
// ends at the holder's expiry.
func Delay(c *Client, attempt int, remaining time.Duration) (time.Duration, bool) {
	return c.delay(attempt, remaining)
}

// ListenerDelay is how long c's LISTEN connection waits before its
// attempt-th reconnect.
func ListenerDelay(c *Client, attempt int) time.Duration { return c.listenerDelay(attempt) }

// StopTrustTimer stops the timer that ends l's context when its trust window
// runs out, as if the process had been paused and the timer had not run yet.
func StopTrustTimer(l *Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timer.Stop()
}

// WatchReads is how many reads w has made.
func WatchReads(w *Watcher) int64 { return w.reads.Load() }

// Waiters is how many Acquire calls of c wait for key.
func Waiters(c *Client, key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queues[key])
}

// ClientVersion is what c records with every grant it makes.
func ClientVersion() string { return clientVersion() }

// The channels the SQL functions notify, and the application_name of a
// client's LISTEN connection.
const (
	NotifyChannel           = notifyChannel
	GrantNotifyChannel      = grantNotifyChannel
	ChangeNotifyChannel     = changeNotifyChannel
	ListenerApplicationName = listenerApplicationName
)

// LogEvent is a lease transition or a client state change, as the client
// logs it; LogKind names it.
type (
	LogEvent = event
	LogKind  = eventKind
)

// The kinds of LogEvent.
const (
	LogAcquired      = eventAcquired
	LogRenewed       = eventRenewed
	LogRenewFailed   = eventRenewFailed
	LogReleased      = eventReleased
	LogLost          = eventLost
	LogForceReleased = eventForceReleased
	LogListenerUp    = eventListenerUp
	LogListenerDown  = eventListenerDown
)

// SetOnEvent makes c call f with every transition it logs, synchronously
// from the goroutine that made it. Call it before c is used.
func SetOnEvent(c *Client, f func(LogEvent)) { c.onEvent = f }
