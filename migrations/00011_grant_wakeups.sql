-- Wake-ups that do not stampede: a grant announces itself to the other
-- waiters, and lifting a kill switch wakes waiters at once.
--
-- Every release sends NOTIFY pgfence_lease_released with the key, and every
-- client waiting for that key tries to acquire it: with N waiting clients a
-- release costs N attempts of which one wins. try_acquire gets a parameter
-- p_announce (DEFAULT false); a waiter that has already lost a race for the
-- key passes true, and its grant then sends NOTIFY pgfence_lease_granted with
-- the payload "<lease length in microseconds>:<key>". The Go client spreads
-- the attempts of woken waiters over a short random window that adapts to how
-- often it loses, and a waiter that hears the grant before its turn goes back
-- to sleep until the next release, or until that lease would expire, without
-- sending anything. Uncontended grants pass false and notify nobody: a NOTIFY
-- serialises commits that send one.
--
-- resume_grants now wakes every waiter (NOTIFY pgfence_lease_released with
-- an empty payload) instead of leaving them to notice at their next poll.
--
-- The notifications are hints. The database still decides every grant; a
-- client that misses them falls back to polling.

-- +goose Up

-- +goose StatementBegin
DROP FUNCTION pgfence.try_acquire(text, interval, text, uuid, text);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgfence.try_acquire(p_key text, p_ttl interval, p_holder_info text DEFAULT '', p_holder uuid DEFAULT NULL,
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

REVOKE EXECUTE ON FUNCTION pgfence.try_acquire(text, interval, text, uuid, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.try_acquire(text, interval, text, uuid, text, boolean) TO pgfence_app, pgfence_operator;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.resume_grants(p_prefix text, p_reason text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_prefix IS NULL THEN
        RAISE EXCEPTION 'pgfence: resume_grants needs a prefix' USING ERRCODE = 'PF008';
    END IF;
    IF p_reason IS NOT NULL AND length(p_reason) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgfence: resume_grants reason must be 1 to 1000 characters' USING ERRCODE = 'PF008';
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    DELETE FROM pgfence.grant_pauses g WHERE g.prefix = p_prefix;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO pgfence.grant_pause_events (prefix, action, reason) VALUES (p_prefix, 'resumed', p_reason);
    -- An empty payload wakes every waiter of every client (keys are never
    -- empty); older clients ignore it and notice within their poll interval.
    PERFORM pg_notify('pgfence_lease_released', '');
    RETURN true;
END;
$$;
-- +goose StatementEnd

-- +goose Down

-- +goose StatementBegin
DROP FUNCTION pgfence.try_acquire(text, interval, text, uuid, text, boolean);
-- +goose StatementEnd

-- The bodies of migration 00009, restored.
-- +goose StatementBegin
CREATE FUNCTION pgfence.try_acquire(p_key text, p_ttl interval, p_holder_info text DEFAULT '', p_holder uuid DEFAULT NULL,
                                    p_client_version text DEFAULT NULL)
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

    RETURN QUERY SELECT true, v_holder, v_token, v_grant, v_exp,
                        greatest(v_exp - clock_timestamp(), interval '0');
END;
$$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgfence.try_acquire(text, interval, text, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.try_acquire(text, interval, text, uuid, text) TO pgfence_app, pgfence_operator;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.resume_grants(p_prefix text, p_reason text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_prefix IS NULL THEN
        RAISE EXCEPTION 'pgfence: resume_grants needs a prefix' USING ERRCODE = 'PF008';
    END IF;
    IF p_reason IS NOT NULL AND length(p_reason) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgfence: resume_grants reason must be 1 to 1000 characters' USING ERRCODE = 'PF008';
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    DELETE FROM pgfence.grant_pauses g WHERE g.prefix = p_prefix;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO pgfence.grant_pause_events (prefix, action, reason) VALUES (p_prefix, 'resumed', p_reason);
    RETURN true;
END;
$$;
-- +goose StatementEnd
