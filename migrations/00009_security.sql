-- pgfence security: least privilege, kill switches for rollouts, and the
-- client version of every grant.
--
-- Roles. Two NOLOGIN group roles; grant them to your login roles:
--
--   pgfence_app       takes part in the protocol through the functions only:
--                     try_acquire/acquire/renew/release, the fair queue,
--                     fence/check_lease/fence_probe, record_fence_rejection,
--                     the idempotency claims, and reads of the pgfence tables
--                     and lease_status. It has
--                     no INSERT/UPDATE/DELETE on any pgfence table, so it can
--                     neither mint, move nor lower a token, a fence or the floor.
--   pgfence_operator  everything pgfence_app can, plus force_release,
--                     raise_token_floor, protect/unprotect (of tables it owns),
--                     pause_grants/resume_grants, prune_lease_events,
--                     prune_fence_rejections and idempotency_gc.
--
--   GRANT pgfence_app TO orders_service;      -- a LOGIN role of the application
--   GRANT pgfence_operator TO oncall;         -- people and the CLI
--
-- Roles are cluster-wide, so this migration creates them only if they are
-- absent (the migrating role needs CREATEROLE then, else it stops with a hint)
-- and its Down never drops them: other databases of the cluster may use them,
-- and dropping them would silently remove their members. Down revokes every
-- privilege this migration granted in this database.
--
-- Functions that write pgfence tables run as their owner (SECURITY DEFINER)
-- with search_path pinned to pg_catalog, pg_temp: every pgfence object in
-- their bodies is schema-qualified and every built-in they use (functions,
-- operators, types) lives in pg_catalog, so no object a caller creates can
-- be picked up instead. EXECUTE on every pgfence function is revoked from
-- PUBLIC and granted to the roles above, function by function.
--
-- protect and unprotect stay SECURITY INVOKER on purpose: CREATE TRIGGER and
-- DROP TRIGGER then check the caller's own rights on the table (owner or
-- TRIGGER privilege), so nobody can put a guard on, or take it off, a table
-- they do not own. Business tables should be owned by a migration/owner role,
-- and the application's login role should get DML on them only: then the
-- application can neither drop nor disable the guard trigger.
--
-- Kill switch. pgfence.pause_grants(prefix, reason) stops NEW grants of every
-- key that starts with prefix ('' pauses every key): try_acquire and acquire
-- raise PF011 (grants paused). Current holders keep renewing, releasing and
-- writing with their tokens, so they finish (or are fenced, after an operator
-- force-releases them). pgfence.resume_grants(prefix) lifts it. Both record
-- who (session_user) and why in pgfence.grant_pause_events. A pause applies to
-- grants that start after it commits.
--
-- Client version. try_acquire and acquire take p_client_version (DEFAULT
-- NULL): the Go client passes "pgfence-go/<module version>"; it is stored on
-- the lease row (lease_status.client_version) and on the acquired/taken_over
-- event, so an old client in a mixed-version rollout can be spotted. Raw SQL
-- clients that do not pass it show NULL.
--
-- SQLSTATE: PF011 grants paused for the key's prefix.

-- +goose Up

-- +goose StatementBegin
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgfence_app', 'pgfence_operator'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN
                    NULL; -- created meanwhile by the migration of another database
                WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'pgfence: role % does not exist and role % may not create it', r, current_user
                        USING ERRCODE = '42501',
                              HINT = 'Have a role with CREATEROLE run: CREATE ROLE pgfence_app NOLOGIN; CREATE ROLE pgfence_operator NOLOGIN; then migrate again.';
            END;
        END IF;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- Kill switches: one row per paused key prefix.
-- +goose StatementBegin
CREATE TABLE pgfence.grant_pauses (
    prefix     text        PRIMARY KEY CHECK (octet_length(prefix) <= 512),
    paused_by  text        NOT NULL DEFAULT session_user,
    reason     text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    paused_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- +goose StatementEnd

-- The pause history: who paused or resumed which prefix, when and why.
-- +goose StatementBegin
CREATE TABLE pgfence.grant_pause_events (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    prefix  text        NOT NULL,
    action  text        NOT NULL CHECK (action IN ('paused', 'resumed')),
    actor   text        NOT NULL DEFAULT session_user,
    reason  text        CHECK (reason IS NULL OR length(reason) BETWEEN 1 AND 1000),
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- +goose StatementEnd

ALTER TABLE pgfence.leases ADD COLUMN client_version text;
ALTER TABLE pgfence.lease_events ADD COLUMN client_version text;

-- raise_grants_paused raises PF011 for p_key, naming the longest paused
-- prefix that matches it. try_acquire calls it only when a pause matches.
-- +goose StatementBegin
CREATE FUNCTION pgfence.raise_grants_paused(p_key text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p pgfence.grant_pauses%ROWTYPE;
BEGIN
    SELECT g.* INTO p FROM pgfence.grant_pauses g
     WHERE starts_with(p_key, g.prefix)
     ORDER BY octet_length(g.prefix) DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'pgfence: new grants of lease % are paused (prefix %, by %, since %): %',
            quote_literal(p_key), quote_literal(p.prefix), p.paused_by, p.paused_at, p.reason
        USING ERRCODE = 'PF011',
              DETAIL = format('prefix=%s paused_by=%s', p.prefix, p.paused_by),
              HINT = 'Current holders keep their leases; an operator lifts the pause with pgfence.resume_grants(prefix).';
END;
$$;
-- +goose StatementEnd

-- pause_grants stops new grants of every key that starts with p_prefix ('' is
-- every key) until resume_grants. It returns true when the prefix was not
-- paused yet (pausing it again replaces the reason). Operator only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.pause_grants(p_prefix text, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_was boolean;
BEGIN
    IF p_prefix IS NULL OR octet_length(p_prefix) > 512 THEN
        RAISE EXCEPTION 'pgfence: pause_grants prefix must be 0 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF p_reason IS NULL OR length(p_reason) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgfence: pause_grants needs a reason of 1 to 1000 characters' USING ERRCODE = 'PF008';
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    PERFORM 1 FROM pgfence.grant_pauses g WHERE g.prefix = p_prefix FOR UPDATE;
    v_was := FOUND;
    INSERT INTO pgfence.grant_pauses AS g (prefix, reason) VALUES (p_prefix, p_reason)
        ON CONFLICT (prefix) DO UPDATE SET reason = excluded.reason, paused_by = excluded.paused_by;
    INSERT INTO pgfence.grant_pause_events (prefix, action, reason) VALUES (p_prefix, 'paused', p_reason);
    RETURN NOT v_was;
END;
$$;
-- +goose StatementEnd

-- resume_grants lifts the pause of exactly p_prefix and returns whether there
-- was one. Operator only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.resume_grants(p_prefix text, p_reason text DEFAULT NULL) RETURNS boolean
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

-- try_acquire and acquire get a p_client_version parameter (a new signature,
-- so the old ones are replaced) and check the kill switches.
-- +goose StatementBegin
DROP FUNCTION pgfence.acquire(text, interval, text, uuid);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.try_acquire(text, interval, text, uuid);
-- +goose StatementEnd

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

-- acquire is try_acquire that raises PF003 instead of returning acquired = false.
-- +goose StatementBegin
CREATE FUNCTION pgfence.acquire(p_key text, p_ttl interval, p_holder_info text DEFAULT '', p_holder uuid DEFAULT NULL,
                                p_client_version text DEFAULT NULL)
RETURNS TABLE (holder uuid, token bigint, granted_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM pgfence.try_acquire(p_key, p_ttl, p_holder_info, p_holder, p_client_version);
    IF NOT r.acquired THEN
        RAISE EXCEPTION 'pgfence: lease % is held by another holder for another %', p_key, r.remaining
            USING ERRCODE = 'PF003',
                  HINT = 'Retry after the remaining time, or LISTEN pgfence_lease_released.';
    END IF;
    RETURN QUERY SELECT r.holder, r.token, r.granted_at, r.expires_at;
END;
$$;
-- +goose StatementEnd

-- lease_status shows the client version of the current (or last) grant too.
-- +goose StatementBegin
CREATE OR REPLACE VIEW pgfence.lease_status AS
SELECT l.key, l.holder, l.token, l.granted_at, l.renewed_at, l.expires_at, l.released_at, l.holder_info,
       (l.released_at IS NULL AND l.expires_at > clock_timestamp()) AS live,
       CASE WHEN l.released_at IS NULL THEN greatest(l.expires_at - clock_timestamp(), interval '0')
            ELSE interval '0' END AS remaining,
       l.client_version
FROM pgfence.leases l;
-- +goose StatementEnd

-- fence_probe is pgfence.Resolve's read-back after an unknown commit outcome:
-- it waits for any transaction that holds (or is inserting) the resource's
-- fence row, and returns the newest committed state: writes = 0 means no
-- token was ever accepted. Its probe row is rolled back inside the function,
-- so it changes nothing, and the application role needs no INSERT on fences.
-- +goose StatementBegin
CREATE FUNCTION pgfence.fence_probe(p_resource text)
RETURNS TABLE (token bigint, writes bigint, op uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_token  bigint;
    v_writes bigint;
    v_op     uuid;
BEGIN
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    BEGIN
        INSERT INTO pgfence.fences AS f (resource, token, writes) VALUES (p_resource, 1, 0)
            ON CONFLICT (resource) DO UPDATE SET writes = f.writes
        RETURNING f.token, f.writes, f.op INTO v_token, v_writes, v_op;
        -- Undo the probe: variables keep their values when the block's
        -- subtransaction rolls back.
        RAISE EXCEPTION USING ERRCODE = 'PFZ99';
    EXCEPTION WHEN SQLSTATE 'PFZ99' THEN
        NULL;
    END;
    RETURN QUERY SELECT v_token, v_writes, v_op;
END;
$$;
-- +goose StatementEnd

-- idempotency_gc deletes up to p_batch completed keys whose retention ended
-- (database clock) and returns how many. In-progress keys have no expires_at
-- and are never selected; rows a claim is reusing right now are skipped.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_gc(p_batch integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 THEN
        RAISE EXCEPTION 'pgfence: idempotency_gc batch must be positive, got %', p_batch USING ERRCODE = 'PF008';
    END IF;
    WITH batch AS (
        SELECT k.scope, k.key FROM pgfence.idempotency_keys k
         WHERE k.expires_at <= clock_timestamp()
         ORDER BY k.expires_at
         LIMIT p_batch
           FOR UPDATE SKIP LOCKED)
    DELETE FROM pgfence.idempotency_keys k
     USING batch b
     WHERE k.scope = b.scope AND k.key = b.key AND k.expires_at <= clock_timestamp();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;
-- +goose StatementEnd

-- Functions that write pgfence tables run as their owner, with a pinned
-- search_path. Their bodies are unchanged (they qualify every pgfence name).
ALTER FUNCTION pgfence.renew(text, uuid, bigint, interval) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.release(text, uuid, bigint, boolean) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.force_release(text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.prune_lease_events(text, integer) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.lease_queue_turn(text, uuid, interval) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.lease_queue_leave(text, uuid) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.fence(text, bigint, uuid) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.check_lease(text, uuid, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.guard() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.raise_token_floor(bigint, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.idempotency_claim_atomic(text, text, bytea, interval, interval) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.idempotency_complete_atomic(text, text, bytea, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.idempotency_atomic_completed() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.idempotency_claim(text, text, bytea, interval, interval) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.idempotency_heartbeat(text, text, uuid, interval) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.idempotency_advance(text, text, uuid, text, bytea, interval) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.idempotency_complete(text, text, uuid, bytea, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.idempotency_release(text, text, uuid) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.idempotency_keys_set_trace_id() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
-- Migration 00007's audit of rejected writes: the application records its
-- own rejections (an audit hint, not a protocol state).
ALTER FUNCTION pgfence.record_fence_rejection(text, bigint, bigint, text, text, text, uuid, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.prune_fence_rejections(interval) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Invoker functions that operators call: pinned search_path only. protect and
-- unprotect must stay SECURITY INVOKER (see the header).
ALTER FUNCTION pgfence.protect(regclass, text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.unprotect(regclass) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgfence.max_stored_token() SET search_path = pg_catalog, pg_temp;

-- Privileges. Nothing for PUBLIC; each role gets exactly its list.
REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgfence FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;

GRANT USAGE ON SCHEMA pgfence TO pgfence_app, pgfence_operator;

-- Reads: both roles (the Go clients read lease rows, history, fence state
-- and idempotency results back after lost replies).
GRANT SELECT ON pgfence.leases, pgfence.lease_status, pgfence.lease_events, pgfence.lease_waiters,
                pgfence.fences, pgfence.token_floor, pgfence.idempotency_keys,
                pgfence.grant_pauses, pgfence.grant_pause_events, pgfence.fence_rejections
   TO pgfence_app, pgfence_operator;

-- +goose StatementBegin
DO $$
BEGIN
    -- goose's version table, for `pgfence doctor` run as an operator (it is
    -- absent when another tool applied these files).
    IF pg_catalog.to_regclass('pgfence.goose_db_version') IS NOT NULL THEN
        GRANT SELECT ON pgfence.goose_db_version TO pgfence_operator;
    END IF;
END;
$$;
-- +goose StatementEnd

-- The protocol: both roles.
GRANT EXECUTE ON FUNCTION
    pgfence.try_acquire(text, interval, text, uuid, text),
    pgfence.acquire(text, interval, text, uuid, text),
    pgfence.renew(text, uuid, bigint, interval),
    pgfence.release(text, uuid, bigint, boolean),
    pgfence.lease_queue_turn(text, uuid, interval),
    pgfence.lease_queue_leave(text, uuid),
    pgfence.lease_max_ttl(),
    pgfence.fence(text, bigint, uuid),
    pgfence.check_lease(text, uuid, bigint),
    pgfence.fence_probe(text),
    pgfence.protected_tables(),
    pgfence.current_trace_id(),
    pgfence.idempotency_claim_atomic(text, text, bytea, interval, interval),
    pgfence.idempotency_complete_atomic(text, text, bytea, text, text),
    pgfence.idempotency_claim(text, text, bytea, interval, interval),
    pgfence.idempotency_heartbeat(text, text, uuid, interval),
    pgfence.idempotency_advance(text, text, uuid, text, bytea, interval),
    pgfence.idempotency_complete(text, text, uuid, bytea, text, text),
    pgfence.idempotency_release(text, text, uuid),
    pgfence.record_fence_rejection(text, bigint, bigint, text, text, text, uuid, text)
  TO pgfence_app, pgfence_operator;

-- Operations: the operator role only. CREATE TRIGGER needs EXECUTE on the
-- trigger functions, so protect needs guard and reject_truncate.
GRANT EXECUTE ON FUNCTION
    pgfence.force_release(text, text),
    pgfence.prune_lease_events(text, integer),
    pgfence.prune_fence_rejections(interval),
    pgfence.raise_token_floor(bigint, text),
    pgfence.max_stored_token(),
    pgfence.next_token(bigint),
    pgfence.token_epoch(),
    pgfence.protect(regclass, text, text),
    pgfence.unprotect(regclass),
    pgfence.guard(),
    pgfence.reject_truncate(),
    pgfence.pause_grants(text, text),
    pgfence.resume_grants(text, text),
    pgfence.idempotency_gc(integer)
  TO pgfence_operator;

-- +goose Down

REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM pgfence_app, pgfence_operator;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgfence FROM pgfence_app, pgfence_operator;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM pgfence_app, pgfence_operator;
REVOKE USAGE ON SCHEMA pgfence FROM pgfence_app, pgfence_operator;

ALTER FUNCTION pgfence.max_stored_token() RESET search_path;
ALTER FUNCTION pgfence.unprotect(regclass) RESET search_path;
ALTER FUNCTION pgfence.protect(regclass, text, text) RESET search_path;
ALTER FUNCTION pgfence.prune_fence_rejections(interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.record_fence_rejection(text, bigint, bigint, text, text, text, uuid, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.idempotency_keys_set_trace_id() SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.idempotency_release(text, text, uuid) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.idempotency_complete(text, text, uuid, bytea, text, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.idempotency_advance(text, text, uuid, text, bytea, interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.idempotency_heartbeat(text, text, uuid, interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.idempotency_claim(text, text, bytea, interval, interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.idempotency_atomic_completed() SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.idempotency_complete_atomic(text, text, bytea, text, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.idempotency_claim_atomic(text, text, bytea, interval, interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.raise_token_floor(bigint, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.guard() SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.check_lease(text, uuid, bigint) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.fence(text, bigint, uuid) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.lease_queue_leave(text, uuid) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.lease_queue_turn(text, uuid, interval) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.prune_lease_events(text, integer) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.force_release(text, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.release(text, uuid, bigint, boolean) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgfence.renew(text, uuid, bigint, interval) SECURITY INVOKER RESET search_path;

DROP FUNCTION pgfence.idempotency_gc(integer);
DROP FUNCTION pgfence.fence_probe(text);

-- +goose StatementBegin
DROP VIEW pgfence.lease_status;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE VIEW pgfence.lease_status AS
SELECT l.key, l.holder, l.token, l.granted_at, l.renewed_at, l.expires_at, l.released_at, l.holder_info,
       (l.released_at IS NULL AND l.expires_at > clock_timestamp()) AS live,
       CASE WHEN l.released_at IS NULL THEN greatest(l.expires_at - clock_timestamp(), interval '0')
            ELSE interval '0' END AS remaining
FROM pgfence.leases l;
-- +goose StatementEnd

DROP FUNCTION pgfence.acquire(text, interval, text, uuid, text);
DROP FUNCTION pgfence.try_acquire(text, interval, text, uuid, text);

-- The bodies of migration 00002, restored.
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

DROP FUNCTION pgfence.resume_grants(text, text);
DROP FUNCTION pgfence.pause_grants(text, text);
DROP FUNCTION pgfence.raise_grants_paused(text);
ALTER TABLE pgfence.lease_events DROP COLUMN client_version;
ALTER TABLE pgfence.leases DROP COLUMN client_version;
DROP TABLE pgfence.grant_pause_events;
DROP TABLE pgfence.grant_pauses;

-- Functions get EXECUTE for PUBLIC by default: give back what Up revoked.
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgfence TO PUBLIC;
-- The roles pgfence_app and pgfence_operator stay (see the header).
