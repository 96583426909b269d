-- pgfence leases: the SQL surface of the lease protocol.
--
-- These functions are the one source of truth: the Go package "leases" calls
-- them, and a worker in any other language takes part in the same protocol by
-- calling them with a plain SQL client.
--
--   pgfence.try_acquire(key, ttl, holder_info DEFAULT '', holder DEFAULT NULL)
--       -> (acquired, holder, token, granted_at, expires_at, remaining)
--   pgfence.acquire(key, ttl, holder_info DEFAULT '', holder DEFAULT NULL)
--       -> (holder, token, granted_at, expires_at)            raises PF003 when held
--   pgfence.renew(key, holder, token, ttl)
--       -> (token, expires_at, remaining)                     raises PF002 when lost
--   pgfence.release(key, holder, token, durable DEFAULT true)
--       -> (released, status)    status: released | expired | already_released | not_held
--   pgfence.force_release(key, reason) -> (released, holder, token, was_live)
--   pgfence.prune_lease_events(key DEFAULT NULL, keep DEFAULT 100) -> bigint
--   pgfence.lease_status (view): every lease row with live and remaining,
--       computed by the database clock.
--
-- Rules every function follows:
--   * Every expiry decision uses clock_timestamp(), evaluated after the row lock.
--   * A grant is one INSERT ... ON CONFLICT DO UPDATE ... WHERE statement; the
--     WHERE clause of ON CONFLICT runs after the row lock, so it sees the latest
--     committed row. A renewal locks the row (FOR UPDATE) and then checks. No
--     lease transition is a bare UPDATE ... WHERE <time predicate>: such an
--     UPDATE is not re-checked when a concurrent transaction merely locked the
--     row (FOR SHARE), so it could extend a lease that expired while it waited.
--   * A failed acquire does not write: a plain read decides whether to try the
--     upsert, and a transaction-scoped advisory lock on the key's hash turns
--     away attempts that meet another grant in progress (acquired = false,
--     remaining 0) instead of letting them queue on its row lock, so a hot
--     key's losers cost a read, not a WAL flush.
--   * Grants and renewals force synchronous_commit to at least "on" for their
--     transaction: a grant lost in a crash could hand out its token twice, a lost
--     renewal could make the holder trust an expiry the database forgot.
--   * A release may commit with synchronous_commit = off (durable => false): a
--     release lost in a crash only delays the next holder until the lease
--     expires, and any later durable commit (such as the next grant) flushes it.
--   * A release and a force-release send NOTIFY pgfence_lease_released with the
--     key as payload, so waiters wake up without polling. Expiry sends nothing.
--   * Every transition appends a row to pgfence.lease_events; every 32nd grant of
--     a key prunes its history to the newest 100 events.
--   * Errors: PF008 invalid argument, PF002 lease not held (renew), PF003 lease
--     held by another holder (acquire); messages name the key, holder and token.

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION pgfence.lease_max_ttl() RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT interval '24 hours' $$;
-- +goose StatementEnd

-- lease_check_args raises PF008 unless the key, ttl and holder_info are
-- acceptable (a NULL ttl or holder_info is not checked: the caller has none).
-- +goose StatementBegin
CREATE FUNCTION pgfence.lease_check_args(p_key text, p_ttl interval, p_holder_info text)
RETURNS void LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: lease key must be 1 to 512 bytes, got %',
            coalesce(octet_length(p_key)::text || ' bytes', 'NULL')
            USING ERRCODE = 'PF008';
    END IF;
    IF p_ttl IS NOT NULL AND (p_ttl <= interval '0' OR p_ttl > pgfence.lease_max_ttl()) THEN
        RAISE EXCEPTION 'pgfence: lease ttl must be above 0 and at most %, got %',
            pgfence.lease_max_ttl(), p_ttl
            USING ERRCODE = 'PF008';
    END IF;
    IF p_holder_info IS NOT NULL AND octet_length(p_holder_info) > 1024 THEN
        RAISE EXCEPTION 'pgfence: lease holder_info must be at most 1024 bytes, got %',
            octet_length(p_holder_info)
            USING ERRCODE = 'PF008';
    END IF;
END;
$$;
-- +goose StatementEnd

-- prune_lease_events keeps the newest p_keep events of p_key (of every key when
-- p_key is NULL) and returns how many it deleted.
-- +goose StatementBegin
CREATE FUNCTION pgfence.prune_lease_events(p_key text DEFAULT NULL, p_keep integer DEFAULT 100)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n bigint;
BEGIN
    IF p_keep IS NULL OR p_keep < 0 THEN
        RAISE EXCEPTION 'pgfence: prune_lease_events keep must be >= 0, got %', p_keep
            USING ERRCODE = 'PF008';
    END IF;
    WITH ranked AS (
        SELECT e.id, row_number() OVER (PARTITION BY e.key ORDER BY e.id DESC) AS rn
        FROM pgfence.lease_events e
        WHERE p_key IS NULL OR e.key = p_key
    )
    DELETE FROM pgfence.lease_events e
    USING ranked r
    WHERE e.id = r.id AND r.rn > p_keep;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;
-- +goose StatementEnd

-- try_acquire grants the lease on p_key for p_ttl when nobody holds it, in one
-- statement, with a fresh holder id (p_holder, or a random one) and the next
-- token. When another holder has it, it writes nothing and returns
-- acquired = false with the time that holder has left.
-- +goose StatementBegin
CREATE FUNCTION pgfence.try_acquire(p_key text, p_ttl interval, p_holder_info text DEFAULT '', p_holder uuid DEFAULT NULL)
RETURNS TABLE (acquired boolean, holder uuid, token bigint, granted_at timestamptz, expires_at timestamptz, remaining interval)
LANGUAGE plpgsql VOLATILE AS $$
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
    INSERT INTO pgfence.leases AS l (key, holder, token, granted_at, expires_at, holder_info)
    VALUES (p_key, v_holder, pgfence.next_token(NULL), clock_timestamp(), clock_timestamp() + p_ttl,
            coalesce(p_holder_info, ''))
    ON CONFLICT (key) DO UPDATE
        SET holder      = EXCLUDED.holder,
            token       = pgfence.next_token(l.token),
            granted_at  = clock_timestamp(),
            renewed_at  = NULL,
            expires_at  = clock_timestamp() + p_ttl,
            released_at = NULL,
            holder_info = EXCLUDED.holder_info
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
        INSERT INTO pgfence.lease_events (key, event, holder, token, reason)
        VALUES (p_key, 'taken_over', v_holder, v_token,
                format('lease of holder %s (token %s) expired at %s', cur.holder, cur.token, cur.expires_at));
    ELSE
        INSERT INTO pgfence.lease_events (key, event, holder, token)
        VALUES (p_key, 'acquired', v_holder, v_token);
    END IF;
    IF v_token % 32 = 0 THEN
        PERFORM pgfence.prune_lease_events(p_key, 100);
    END IF;

    RETURN QUERY SELECT true, v_holder, v_token, v_grant, v_exp,
                        greatest(v_exp - clock_timestamp(), interval '0');
END;
$$;
-- +goose StatementEnd

-- acquire is try_acquire that raises PF003 instead of returning acquired = false.
-- +goose StatementBegin
CREATE FUNCTION pgfence.acquire(p_key text, p_ttl interval, p_holder_info text DEFAULT '', p_holder uuid DEFAULT NULL)
RETURNS TABLE (holder uuid, token bigint, granted_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM pgfence.try_acquire(p_key, p_ttl, p_holder_info, p_holder);
    IF NOT r.acquired THEN
        RAISE EXCEPTION 'pgfence: lease % is held by another holder for another %', p_key, r.remaining
            USING ERRCODE = 'PF003',
                  HINT = 'Retry after the remaining time, or LISTEN pgfence_lease_released.';
    END IF;
    RETURN QUERY SELECT r.holder, r.token, r.granted_at, r.expires_at;
END;
$$;
-- +goose StatementEnd

-- renew extends the lease to clock_timestamp() + p_ttl if (and only if) p_holder
-- still holds it with p_token and it has not expired. It locks the row first and
-- checks after the lock. Raises PF002 otherwise.
-- +goose StatementBegin
CREATE FUNCTION pgfence.renew(p_key text, p_holder uuid, p_token bigint, p_ttl interval)
RETURNS TABLE (token bigint, expires_at timestamptz, remaining interval)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    cur   pgfence.leases%ROWTYPE;
    v_exp timestamptz;
BEGIN
    PERFORM pgfence.lease_check_args(p_key, p_ttl, NULL);
    IF p_ttl IS NULL OR p_holder IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION 'pgfence: renew of lease % needs a holder, a token and a ttl', p_key
            USING ERRCODE = 'PF008';
    END IF;

    SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key FOR UPDATE;
    IF cur.key IS NULL OR cur.holder <> p_holder OR cur.token <> p_token THEN
        RAISE EXCEPTION 'pgfence: lease % is not held by holder % with token %', p_key, p_holder, p_token
            USING ERRCODE = 'PF002',
                  DETAIL = CASE WHEN cur.key IS NULL THEN 'The lease does not exist.'
                                ELSE format('The lease was granted again since (token %s).', cur.token) END;
    END IF;
    IF cur.released_at IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: lease % (holder %, token %) was released at %', p_key, p_holder, p_token, cur.released_at
            USING ERRCODE = 'PF002';
    END IF;
    IF cur.expires_at <= clock_timestamp() THEN
        RAISE EXCEPTION 'pgfence: lease % (holder %, token %) expired at %', p_key, p_holder, p_token, cur.expires_at
            USING ERRCODE = 'PF002';
    END IF;

    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    UPDATE pgfence.leases l
       SET renewed_at = greatest(clock_timestamp(), l.granted_at),
           expires_at = clock_timestamp() + p_ttl
     WHERE l.key = p_key
    RETURNING l.expires_at INTO v_exp;

    RETURN QUERY SELECT p_token, v_exp, greatest(v_exp - clock_timestamp(), interval '0');
END;
$$;
-- +goose StatementEnd

-- release ends the grant (p_holder, p_token) of p_key. It never touches another
-- grant and is idempotent; status says what happened:
--   released          this call released the live lease
--   expired           the lease had expired (not yet taken over); it is now released
--   already_released  an earlier release ended this grant; nothing changed
--   not_held          the key was granted to someone else since (or never); nothing changed
-- With p_durable => false the release commits with synchronous_commit = off,
-- unless the calling transaction already wrote something (it is never weakened);
-- note that later writes of the same transaction commit that way too.
-- +goose StatementBegin
CREATE FUNCTION pgfence.release(p_key text, p_holder uuid, p_token bigint, p_durable boolean DEFAULT true)
RETURNS TABLE (released boolean, status text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    cur       pgfence.leases%ROWTYPE;
    v_expired boolean;
BEGIN
    PERFORM pgfence.lease_check_args(p_key, NULL, NULL);
    IF p_holder IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION 'pgfence: release of lease % needs a holder and a token', p_key
            USING ERRCODE = 'PF008';
    END IF;

    IF p_durable IS NOT FALSE THEN
        IF current_setting('synchronous_commit') IN ('off', 'local') THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;
    ELSIF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;

    -- Only identity predicates: holder and token change only when the row is
    -- modified, and a modified row is re-checked after the lock wait.
    UPDATE pgfence.leases l
       SET released_at = greatest(clock_timestamp(), l.granted_at)
     WHERE l.key = p_key AND l.holder = p_holder AND l.token = p_token AND l.released_at IS NULL
    RETURNING l.expires_at <= clock_timestamp() INTO v_expired;

    IF v_expired IS NOT NULL THEN
        INSERT INTO pgfence.lease_events (key, event, holder, token, reason)
        VALUES (p_key, 'released', p_holder, p_token,
                CASE WHEN v_expired THEN 'released after expiry' END);
        PERFORM pg_notify('pgfence_lease_released', p_key);
        RETURN QUERY SELECT true, CASE WHEN v_expired THEN 'expired' ELSE 'released' END;
        RETURN;
    END IF;

    SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key;
    IF cur.key IS NOT NULL AND cur.holder = p_holder AND cur.token = p_token THEN
        RETURN QUERY SELECT false, 'already_released'::text;
    ELSE
        RETURN QUERY SELECT false, 'not_held'::text;
    END IF;
END;
$$;
-- +goose StatementEnd

-- force_release ends whatever grant of p_key is not released yet, whoever holds
-- it, for an operator; p_reason is recorded in the history.
-- +goose StatementBegin
CREATE FUNCTION pgfence.force_release(p_key text, p_reason text)
RETURNS TABLE (released boolean, holder uuid, token bigint, was_live boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_holder uuid;
    v_token  bigint;
    v_live   boolean;
BEGIN
    PERFORM pgfence.lease_check_args(p_key, NULL, NULL);
    IF p_reason IS NULL OR length(p_reason) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgfence: force_release of lease % needs a reason of 1 to 1000 characters', p_key
            USING ERRCODE = 'PF008';
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;

    UPDATE pgfence.leases l
       SET released_at = greatest(clock_timestamp(), l.granted_at)
     WHERE l.key = p_key AND l.released_at IS NULL
    RETURNING l.holder, l.token, l.expires_at > clock_timestamp() INTO v_holder, v_token, v_live;

    IF v_holder IS NULL THEN
        RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, false;
        RETURN;
    END IF;
    INSERT INTO pgfence.lease_events (key, event, holder, token, reason)
    VALUES (p_key, 'force_released', v_holder, v_token, p_reason);
    PERFORM pg_notify('pgfence_lease_released', p_key);
    RETURN QUERY SELECT true, v_holder, v_token, v_live;
END;
$$;
-- +goose StatementEnd

-- lease_status shows every lease row with its state by the database clock.
-- +goose StatementBegin
CREATE VIEW pgfence.lease_status AS
SELECT l.key, l.holder, l.token, l.granted_at, l.renewed_at, l.expires_at, l.released_at, l.holder_info,
       (l.released_at IS NULL AND l.expires_at > clock_timestamp()) AS live,
       CASE WHEN l.released_at IS NULL THEN greatest(l.expires_at - clock_timestamp(), interval '0')
            ELSE interval '0' END AS remaining
FROM pgfence.leases l;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP VIEW pgfence.lease_status;
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.force_release(text, text);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.release(text, uuid, bigint, boolean);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.renew(text, uuid, bigint, interval);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.acquire(text, interval, text, uuid);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.try_acquire(text, interval, text, uuid);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.prune_lease_events(text, integer);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.lease_check_args(text, interval, text);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.lease_max_ttl();
-- +goose StatementEnd
