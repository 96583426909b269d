-- try_acquire's contention filter no longer lets any connected role block
-- a key.
--
-- try_acquire skips a free key whose transaction-scoped advisory lock (a
-- hash of the key) is taken, taking it as a sign that another transaction
-- is granting the key right now. Advisory locks have no privileges: any role
-- that can connect could hold that lock and make the key look held for as
-- long as it liked. Now a taken advisory lock counts only when a grant is
-- really under way, which needs a write to pgfence.leases that only the
-- pgfence roles can make: the key's row is locked (FOR UPDATE SKIP LOCKED,
-- so the check never waits) or, for a key's first grant, the backend that
-- holds the advisory lock holds ROW EXCLUSIVE on pgfence.leases (pg_locks).
-- Otherwise try_acquire goes on to the upsert, which decides as before. The
-- extra check runs only when the advisory lock is taken: an uncontended
-- grant costs what it did.
--
-- CREATE OR REPLACE keeps the function's owner and privileges and restates
-- SECURITY DEFINER and search_path as migration 00011 set them. Down restores
-- 00011's body verbatim.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.try_acquire(p_key text, p_ttl interval, p_holder_info text DEFAULT '', p_holder uuid DEFAULT NULL,
                                    p_client_version text DEFAULT NULL, p_announce boolean DEFAULT false)
RETURNS TABLE (acquired boolean, holder uuid, token bigint, granted_at timestamptz, expires_at timestamptz, remaining interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    cur      pgfence.leases%ROWTYPE;
    v_holder uuid := coalesce(p_holder, gen_random_uuid());
    v_token  bigint;
    v_grant  timestamptz;
    v_exp    timestamptz;
    v_lock   bigint := hashtextextended('pgfence.lease:' || p_key, 0);
    v_busy   boolean;
BEGIN
    PERFORM pgfence.lease_check_args(p_key, p_ttl, coalesce(p_holder_info, ''));
    IF p_ttl IS NULL THEN
        RAISE EXCEPTION 'pgfence: lease ttl must not be NULL' USING ERRCODE = 'PF008';
    END IF;
    IF octet_length(p_client_version) > 128 THEN
        RAISE EXCEPTION 'pgfence: client_version must be at most 128 bytes, got %', octet_length(p_client_version)
            USING ERRCODE = 'PF008';
    END IF;

    -- Kill switch: a paused prefix refuses new grants (PF011). An empty table
    -- costs one scan of an empty heap.
    IF EXISTS (SELECT 1 FROM pgfence.grant_pauses g WHERE starts_with(p_key, g.prefix)) THEN
        PERFORM pgfence.raise_grants_paused(p_key);
    END IF;

    -- The cheap check: a plain read, no lock, no write.
    SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key;
    IF cur.key IS NOT NULL AND cur.released_at IS NULL AND cur.expires_at > clock_timestamp() THEN
        RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, NULL::timestamptz, cur.expires_at,
                            greatest(cur.expires_at - clock_timestamp(), interval '0');
        RETURN;
    END IF;
    IF cur.key IS NOT NULL AND cur.holder = v_holder THEN
        RAISE EXCEPTION 'pgfence: holder % was already used for lease % (token %); every grant needs a fresh holder id',
            v_holder, p_key, cur.token
            USING ERRCODE = 'PF008';
    END IF;

    -- Contention filter, not the authority: when another transaction is
    -- granting this key right now, report it as held (remaining unknown, 0)
    -- instead of queueing on its row lock and writing a failed upsert. The
    -- transaction-scoped advisory lock (a 64-bit hash of the key) lives in
    -- memory only and is released at commit, so it is safe behind PgBouncer in
    -- transaction mode. The upsert below still decides.
    --
    -- Any role that can connect can take that advisory lock, so it alone
    -- does not mean a grant is under way. A granting transaction also writes
    -- pgfence.leases right after taking it, which only the pgfence roles can
    -- do: when the key has a row, the grant holds that row's lock (checked
    -- with SKIP LOCKED, which never waits); a first grant, with no row to
    -- lock, holds ROW EXCLUSIVE on the table in the backend that holds the
    -- advisory lock (checked in pg_locks, only on this path). Otherwise the
    -- advisory lock's holder is not granting and the upsert goes ahead.
    IF NOT pg_try_advisory_xact_lock(v_lock) THEN
        IF cur.key IS NOT NULL THEN
            PERFORM 1 FROM pgfence.leases l WHERE l.key = p_key FOR UPDATE SKIP LOCKED;
            v_busy := NOT FOUND;
        ELSE
            WITH locks AS MATERIALIZED (
                SELECT k.pid, k.locktype, k.database, k.classid, k.objid, k.objsubid, k.relation, k.mode, k.granted
                  FROM pg_locks k
            )
            SELECT EXISTS (
                SELECT 1 FROM locks a JOIN locks r ON r.pid = a.pid
                 WHERE a.locktype = 'advisory' AND a.granted AND a.objsubid = 1
                   AND a.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                   AND a.classid = ((v_lock >> 32) & 4294967295)::oid AND a.objid = (v_lock & 4294967295)::oid
                   AND r.locktype = 'relation' AND r.granted AND r.relation = 'pgfence.leases'::regclass
                   AND r.mode = 'RowExclusiveLock'
            ) INTO v_busy;
        END IF;
        IF v_busy THEN
            RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, NULL::timestamptz, NULL::timestamptz, interval '0';
            RETURN;
        END IF;
    END IF;

    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;

    -- The grant. ON CONFLICT's WHERE is evaluated on the locked, latest row.
    INSERT INTO pgfence.leases AS l (key, holder, token, granted_at, expires_at, holder_info, client_version)
    VALUES (p_key, v_holder, pgfence.next_token(NULL), clock_timestamp(), clock_timestamp() + p_ttl,
            coalesce(p_holder_info, ''), p_client_version)
    ON CONFLICT (key) DO UPDATE
        SET holder         = EXCLUDED.holder,
            token          = pgfence.next_token(l.token),
            granted_at     = clock_timestamp(),
            renewed_at     = NULL,
            expires_at     = clock_timestamp() + p_ttl,
            released_at    = NULL,
            holder_info    = EXCLUDED.holder_info,
            client_version = EXCLUDED.client_version
        WHERE l.released_at IS NOT NULL OR l.expires_at <= clock_timestamp()
    RETURNING l.token, l.granted_at, l.expires_at INTO v_token, v_grant, v_exp;

    IF v_token IS NULL THEN
        -- Someone else won between the read and the upsert.
        SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key;
        RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, NULL::timestamptz, cur.expires_at,
                            greatest(cur.expires_at - clock_timestamp(), interval '0');
        RETURN;
    END IF;

    -- The read above tells which grant we replaced (exact unless that grant
    -- changed between the read and the upsert, which only affects the label).
    IF cur.key IS NOT NULL AND cur.released_at IS NULL THEN
        INSERT INTO pgfence.lease_events (key, event, holder, token, reason, client_version)
        VALUES (p_key, 'taken_over', v_holder, v_token,
                format('lease of holder %s (token %s) expired at %s', cur.holder, cur.token, cur.expires_at),
                p_client_version);
    ELSE
        INSERT INTO pgfence.lease_events (key, event, holder, token, client_version)
        VALUES (p_key, 'acquired', v_holder, v_token, p_client_version);
    END IF;
    IF v_token % 32 = 0 THEN
        PERFORM pgfence.prune_lease_events(p_key, 100);
    END IF;

    IF p_announce THEN
        -- Waiters in other clients that were woken by the same release hold
        -- back their attempts when they hear this: payload "<lease
        -- microseconds>:<key>".
        PERFORM pg_notify('pgfence_lease_granted',
                          ((extract(epoch FROM v_exp - v_grant) * 1000000)::bigint)::text || ':' || p_key);
    END IF;

    RETURN QUERY SELECT true, v_holder, v_token, v_grant, v_exp,
                        greatest(v_exp - clock_timestamp(), interval '0');
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.try_acquire(p_key text, p_ttl interval, p_holder_info text DEFAULT '', p_holder uuid DEFAULT NULL,
                                    p_client_version text DEFAULT NULL, p_announce boolean DEFAULT false)
RETURNS TABLE (acquired boolean, holder uuid, token bigint, granted_at timestamptz, expires_at timestamptz, remaining interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    cur      pgfence.leases%ROWTYPE;
    v_holder uuid := coalesce(p_holder, gen_random_uuid());
    v_token  bigint;
    v_grant  timestamptz;
    v_exp    timestamptz;
BEGIN
    PERFORM pgfence.lease_check_args(p_key, p_ttl, coalesce(p_holder_info, ''));
    IF p_ttl IS NULL THEN
        RAISE EXCEPTION 'pgfence: lease ttl must not be NULL' USING ERRCODE = 'PF008';
    END IF;
    IF octet_length(p_client_version) > 128 THEN
        RAISE EXCEPTION 'pgfence: client_version must be at most 128 bytes, got %', octet_length(p_client_version)
            USING ERRCODE = 'PF008';
    END IF;

    -- Kill switch: a paused prefix refuses new grants (PF011). An empty table
    -- costs one scan of an empty heap.
    IF EXISTS (SELECT 1 FROM pgfence.grant_pauses g WHERE starts_with(p_key, g.prefix)) THEN
        PERFORM pgfence.raise_grants_paused(p_key);
    END IF;

    -- The cheap check: a plain read, no lock, no write.
    SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key;
    IF cur.key IS NOT NULL AND cur.released_at IS NULL AND cur.expires_at > clock_timestamp() THEN
        RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, NULL::timestamptz, cur.expires_at,
                            greatest(cur.expires_at - clock_timestamp(), interval '0');
        RETURN;
    END IF;
    IF cur.key IS NOT NULL AND cur.holder = v_holder THEN
        RAISE EXCEPTION 'pgfence: holder % was already used for lease % (token %); every grant needs a fresh holder id',
            v_holder, p_key, cur.token
            USING ERRCODE = 'PF008';
    END IF;

    -- Contention filter, not the authority: when another transaction is
    -- granting this key right now, report it as held (remaining unknown, 0)
    -- instead of queueing on its row lock and writing a failed upsert. The
    -- transaction-scoped advisory lock (a 64-bit hash of the key) lives in
    -- memory only and is released at commit, so it is safe behind PgBouncer in
    -- transaction mode. The upsert below still decides.
    IF NOT pg_try_advisory_xact_lock(hashtextextended('pgfence.lease:' || p_key, 0)) THEN
        RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, NULL::timestamptz, NULL::timestamptz, interval '0';
        RETURN;
    END IF;

    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;

    -- The grant. ON CONFLICT's WHERE is evaluated on the locked, latest row.
    INSERT INTO pgfence.leases AS l (key, holder, token, granted_at, expires_at, holder_info, client_version)
    VALUES (p_key, v_holder, pgfence.next_token(NULL), clock_timestamp(), clock_timestamp() + p_ttl,
            coalesce(p_holder_info, ''), p_client_version)
    ON CONFLICT (key) DO UPDATE
        SET holder         = EXCLUDED.holder,
            token          = pgfence.next_token(l.token),
            granted_at     = clock_timestamp(),
            renewed_at     = NULL,
            expires_at     = clock_timestamp() + p_ttl,
            released_at    = NULL,
            holder_info    = EXCLUDED.holder_info,
            client_version = EXCLUDED.client_version
        WHERE l.released_at IS NOT NULL OR l.expires_at <= clock_timestamp()
    RETURNING l.token, l.granted_at, l.expires_at INTO v_token, v_grant, v_exp;

    IF v_token IS NULL THEN
        -- Someone else won between the read and the upsert.
        SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key;
        RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, NULL::timestamptz, cur.expires_at,
                            greatest(cur.expires_at - clock_timestamp(), interval '0');
        RETURN;
    END IF;

    -- The read above tells which grant we replaced (exact unless that grant
    -- changed between the read and the upsert, which only affects the label).
    IF cur.key IS NOT NULL AND cur.released_at IS NULL THEN
        INSERT INTO pgfence.lease_events (key, event, holder, token, reason, client_version)
        VALUES (p_key, 'taken_over', v_holder, v_token,
                format('lease of holder %s (token %s) expired at %s', cur.holder, cur.token, cur.expires_at),
                p_client_version);
    ELSE
        INSERT INTO pgfence.lease_events (key, event, holder, token, client_version)
        VALUES (p_key, 'acquired', v_holder, v_token, p_client_version);
    END IF;
    IF v_token % 32 = 0 THEN
        PERFORM pgfence.prune_lease_events(p_key, 100);
    END IF;

    IF p_announce THEN
        -- Waiters in other clients that were woken by the same release hold
        -- back their attempts when they hear this: payload "<lease
        -- microseconds>:<key>".
        PERFORM pg_notify('pgfence_lease_granted',
                          ((extract(epoch FROM v_exp - v_grant) * 1000000)::bigint)::text || ':' || p_key);
    END IF;

    RETURN QUERY SELECT true, v_holder, v_token, v_grant, v_exp,
                        greatest(v_exp - clock_timestamp(), interval '0');
END;
$$;
-- +goose StatementEnd
