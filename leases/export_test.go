package leases

// SetSeenEpoch makes c believe it already saw a grant from timeline epoch.
func SetSeenEpoch(c *Client, epoch int64) { c.seenEpoch.Store(epoch) }

// SeenEpoch is the highest token epoch c has seen.
func SeenEpoch(c *Client) int64 { return c.seenEpoch.Load() }

// ModuleVersion is the version ClientVersion reports for build info bi.
var ModuleVersion = moduleVersion
