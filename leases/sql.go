package leases

// The statements the client sends. Each is one call of a function installed by
// the migrations, so the Go client and any other SQL client follow the same
// protocol. Durations are sent as microseconds; intervals come back as they
// are (pgx scans them into time.Duration).
const (
	sqlTryAcquire = `SELECT acquired, token, expires_at, remaining
  FROM pgfence.try_acquire($1, $2::bigint * interval '1 microsecond', $3, $4::uuid, $5, $6)`

	sqlRenew = `SELECT expires_at FROM pgfence.renew($1, $2::uuid, $3, $4::bigint * interval '1 microsecond')`

	// sqlRenewAnnounced renews and, in the same statement (so only a renewal
	// that commits), announces the new expiry on changeNotifyChannel, signed
	// (pgfence.announce_renewal; r.token orders it after the renewal).
	sqlRenewAnnounced = `SELECT r.expires_at
  FROM pgfence.renew($1, $2::uuid, $3, $4::bigint * interval '1 microsecond') AS r
 CROSS JOIN LATERAL pgfence.announce_renewal($1, $2::uuid, r.token) AS n`

	// sqlAnnounceKey is the key a watcher checks renewal announcements with.
	sqlAnnounceKey = `SELECT pgfence.announce_key($1)`

	sqlSetHolderInfo = `SELECT pgfence.set_holder_info($1, $2::uuid, $3, $4)`

	sqlRelease = `SELECT released, status FROM pgfence.release($1, $2::uuid, $3, $4)`

	// sqlReleasedBy says how a grant that a release found already released
	// ended: 'released' (with its holder id and token; the reason says
	// whether it had expired) or 'force_released' (an operator).
	sqlReleasedBy = `SELECT event, coalesce(reason, '') FROM pgfence.lease_events
 WHERE key = $1 AND holder = $2::uuid AND token = $3 AND event IN ('released', 'force_released')
 ORDER BY id LIMIT 1`

	sqlForceRelease = `SELECT released, coalesce(holder::text, ''), coalesce(token, 0), was_live FROM pgfence.force_release($1, $2)`

	// sqlAbandonGrant and sqlGrantProbe settle a grant attempt whose reply was
	// lost, in two transactions: the first commits that the attempt is
	// abandoned (it is refused if it still arrives), the second waits for
	// any transaction holding the key's row and reads whether the attempt's
	// holder got the lease.
	sqlAbandonGrant = `SELECT pgfence.abandon_grant($1, $2::uuid)`
	sqlGrantProbe   = `SELECT granted, token, expires_at, live FROM pgfence.grant_probe($1, $2::uuid)`

	sqlStatus = `SELECT ` + statusColumns + ` FROM pgfence.lease_status AS s`

	sqlHistory = `SELECT ` + eventColumns + ` FROM pgfence.lease_events AS e WHERE e.key = $1 ORDER BY e.id DESC LIMIT $2`

	sqlListen = `LISTEN ` + notifyChannel + `; LISTEN ` + grantNotifyChannel + `; LISTEN ` + changeNotifyChannel + `; LISTEN ` + taskNotifyChannel

	// sqlCount counts the rows of pgfence.lease_status by state; immune to
	// search_path (the view's own body was bound when it was created).
	sqlCount = `SELECT pg_catalog.count(*),
       pg_catalog.count(*) FILTER (WHERE live),
       pg_catalog.count(*) FILTER (WHERE NOT live AND released_at IS NULL),
       pg_catalog.count(*) FILTER (WHERE released_at IS NOT NULL)
  FROM pgfence.lease_status`

	sqlPause  = `SELECT pgfence.pause_grants($1, $2)`
	sqlResume = `SELECT pgfence.resume_grants($1, $2)`
	sqlPauses = `SELECT prefix, paused_by, reason, paused_at FROM pgfence.grant_pauses ORDER BY prefix`
)
