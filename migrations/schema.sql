-- The catalog of schema pgfence as migrating an empty database produces it:
-- pg_dump --schema-only --schema=pgfence --no-owner, without the lines that
-- vary from one run to the next (version banner, SET, \restrict). Generated
-- by a test that fails when the migrations no longer produce it; regenerate:
--   go test ./migrations -run '^TestSchemaFile$' -update
-- Written from PostgreSQL 15 by pg_dump 15.

--
-- PostgreSQL database dump
--

--
-- Name: pgfence; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA pgfence;

--
-- Name: holder_info; Type: DOMAIN; Schema: pgfence; Owner: -
--

CREATE DOMAIN pgfence.holder_info AS text
	CONSTRAINT holder_info_check CHECK ((octet_length(VALUE) <= 1024));

--
-- Name: key_name; Type: DOMAIN; Schema: pgfence; Owner: -
--

CREATE DOMAIN pgfence.key_name AS text
	CONSTRAINT key_name_check CHECK (((octet_length(VALUE) >= 1) AND (octet_length(VALUE) <= 512)));

--
-- Name: lease_event_kind; Type: DOMAIN; Schema: pgfence; Owner: -
--

CREATE DOMAIN pgfence.lease_event_kind AS text
	CONSTRAINT lease_event_kind_check CHECK ((VALUE = ANY (ARRAY['acquired'::text, 'taken_over'::text, 'released'::text, 'force_released'::text, 'expired'::text, 'info_changed'::text])));

--
-- Name: lease_reason; Type: DOMAIN; Schema: pgfence; Owner: -
--

CREATE DOMAIN pgfence.lease_reason AS text
	CONSTRAINT lease_reason_check CHECK (((length(VALUE) >= 1) AND (length(VALUE) <= 1000)));

--
-- Name: token_value; Type: DOMAIN; Schema: pgfence; Owner: -
--

CREATE DOMAIN pgfence.token_value AS bigint
	CONSTRAINT token_value_check CHECK ((VALUE > 0));

--
-- Name: write_count; Type: DOMAIN; Schema: pgfence; Owner: -
--

CREATE DOMAIN pgfence.write_count AS bigint
	CONSTRAINT write_count_check CHECK ((VALUE >= 0));

--
-- Name: abandon_fence(text, uuid); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.abandon_fence(p_resource text, p_op uuid) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgfence.require_primary();
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.require_granted('resource', p_resource);
    RETURN pgfence.abandon_request('fence', p_resource, p_op);
END;
$$;

--
-- Name: abandon_grant(text, uuid); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.abandon_grant(p_key text, p_holder uuid) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.lease_check_args(p_key, NULL, NULL);
    PERFORM pgfence.require_granted('lease', p_key);
    RETURN pgfence.abandon_request('grant', p_key, p_holder);
END;
$$;

--
-- Name: abandon_request(text, text, uuid); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.abandon_request(p_kind text, p_name text, p_id uuid) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_new integer;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_id IS NULL THEN
        RAISE EXCEPTION 'pgfence: the request id to abandon must not be NULL' USING ERRCODE = 'PF008';
    END IF;
    -- The probe that follows must see this row whatever the session's
    -- default: a request refused only until a crash would not be refused.
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    DELETE FROM pgfence.abandoned_requests a WHERE a.abandoned_at < clock_timestamp() - interval '7 days';
    INSERT INTO pgfence.abandoned_requests (id, kind, name) VALUES (p_id, p_kind, p_name)
        ON CONFLICT (id, kind, name) DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    RETURN v_new > 0;
END;
$$;

--
-- Name: acquire(text, interval, text, uuid, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.acquire(p_key text, p_ttl interval, p_holder_info text DEFAULT ''::text, p_holder uuid DEFAULT NULL::uuid, p_client_version text DEFAULT NULL::text) RETURNS TABLE(holder uuid, token bigint, granted_at timestamp with time zone, expires_at timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM pgfence.try_acquire(p_key, p_ttl, p_holder_info, p_holder, p_client_version);
    IF NOT r.acquired AND r.expires_at IS NULL THEN
        -- try_acquire's contention filter: another transaction is granting
        -- the key right now (it may still roll back).
        RAISE EXCEPTION 'pgfence: lease % is being granted to another holder right now', p_key
            USING ERRCODE = 'PF003',
                  HINT = 'Retry shortly, or LISTEN pgfence_lease_released.';
    ELSIF NOT r.acquired THEN
        RAISE EXCEPTION 'pgfence: lease % is held by another holder for another %', p_key, r.remaining
            USING ERRCODE = 'PF003',
                  HINT = 'Retry after the remaining time, or LISTEN pgfence_lease_released.';
    END IF;
    RETURN QUERY SELECT r.holder, r.token, r.granted_at, r.expires_at;
END;
$$;

--
-- Name: acting_role(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.acting_role() RETURNS name
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT
         CASE
             WHEN (current_setting('role'::text) = 'none'::text) THEN SESSION_USER
             ELSE (current_setting('role'::text))::name
         END AS current_setting;
END;

--
-- Name: advance_retention(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.advance_retention() RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_next bigint;
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM set_config('synchronous_commit', 'on', true);
    SELECT greatest(f.retention, f.floor, (SELECT max(l.token) FROM pgfence.leases l)) INTO v_next
      FROM pgfence.token_floor f FOR UPDATE;
    IF v_next > 4611686018427387904 THEN
        RAISE EXCEPTION 'pgfence: the retention floor may not pass 4611686018427387904 (2^62), the highest token granted is %', v_next
            USING ERRCODE = 'PF008',
                  HINT = 'Tokens this high come from a floor raised near the end of the range; the retention floor cannot follow them.';
    END IF;
    UPDATE pgfence.token_floor SET retention = v_next, retention_at = clock_timestamp();
    RETURN v_next;
END;
$$;

--
-- Name: announce_key(text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.announce_key(p_key text) RETURNS bytea
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.lease_check_args(p_key, NULL, NULL);
    PERFORM pgfence.require_granted('lease', p_key);
    RETURN sha256((SELECT s.secret FROM pgfence.announce_secret s) || sha256(convert_to(p_key, 'UTF8')));
END;
$$;

--
-- Name: announce_renewal(text, uuid, bigint); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.announce_renewal(p_key text, p_holder uuid, p_token bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_expires timestamptz;
    v_now     timestamptz;
    v_micros  text;
    v_msg     text;
    v_key     bytea;
    v_tag     bytea;
BEGIN
    -- announce_key checks the server, the key and the grant first.
    v_key := pgfence.announce_key(p_key);
    SELECT l.expires_at INTO v_expires FROM pgfence.leases l
     WHERE l.key = p_key COLLATE pg_catalog."default" AND l.holder = p_holder AND l.token = p_token AND l.released_at IS NULL;
    v_now := clock_timestamp();
    IF v_expires IS NULL OR v_expires <= v_now THEN
        RETURN false;
    END IF;
    v_micros := ((extract(epoch FROM v_expires) * 1000000)::bigint)::text;
    v_msg := p_token::text || ':' || v_micros || ':' || p_key;
    v_tag := sha256(v_key || sha256(convert_to(v_msg, 'UTF8')));
    -- 'renewed:<remaining µs>:<token>:<expiry µs>:<tag>:<key>': the key last,
    -- since it may hold colons.
    PERFORM pg_notify('pgfence_lease_changed',
        'renewed:' || ((extract(epoch FROM v_expires - v_now) * 1000000)::bigint)::text || ':'
        || p_token::text || ':' || v_micros || ':' || encode(v_tag, 'hex') || ':' || p_key);
    RETURN true;
END;
$$;

--
-- Name: check_lease(text, uuid, bigint); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.check_lease(key text, holder uuid, token bigint) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    l pgfence.leases%ROWTYPE;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF check_lease.key IS NULL OR octet_length(check_lease.key) NOT BETWEEN 1 AND 512 OR check_lease.holder IS NULL THEN
        RAISE EXCEPTION 'pgfence: check_lease needs a key of 1 to 512 bytes and a holder' USING ERRCODE = 'PF008';
    END IF;
    IF check_lease.token IS NULL OR check_lease.token <= 0 OR check_lease.token > 6917529027641081856 THEN
        PERFORM pgfence.check_token(check_lease.token);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('lease', check_lease.key);
    END IF;
    SELECT * INTO l FROM pgfence.leases WHERE key = check_lease.key COLLATE pg_catalog."default" FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: lease % is not held: no such lease', quote_literal(check_lease.key)
            USING ERRCODE = 'PF002', DETAIL = format('reason=missing key=%s', check_lease.key);
    END IF;
    IF l.holder <> check_lease.holder OR l.token <> check_lease.token THEN
        RAISE EXCEPTION 'pgfence: lease % is not held by % with token %: now holder % token %',
                quote_literal(check_lease.key), check_lease.holder, check_lease.token, l.holder, l.token
            USING ERRCODE = 'PF002', DETAIL = format('reason=taken_over token=%s key=%s', l.token, check_lease.key);
    END IF;
    IF l.released_at IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: lease % with token % was released at %', quote_literal(check_lease.key), l.token, l.released_at
            USING ERRCODE = 'PF002', DETAIL = format('reason=released key=%s', check_lease.key);
    END IF;
    IF l.expires_at <= clock_timestamp() THEN
        RAISE EXCEPTION 'pgfence: lease % with token % expired at %', quote_literal(check_lease.key), l.token, l.expires_at
            USING ERRCODE = 'PF002', DETAIL = format('reason=expired key=%s', check_lease.key);
    END IF;
END;
$$;

--
-- Name: check_token(bigint); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.check_token(p_token bigint) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF p_token IS NULL OR p_token <= 0 OR p_token > 6917529027641081856 THEN
        RAISE EXCEPTION 'pgfence: token must be 1 to 6917529027641081856, got %', coalesce(p_token::text, 'NULL')
            USING ERRCODE = 'PF008';
    END IF;
END;
$$;

--
-- Name: current_trace_id(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.current_trace_id() RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $_$
    SELECT CASE WHEN current_setting('pgfence.trace_id', true) ~ '^[0-9a-f]{32}$'
                 AND current_setting('pgfence.trace_id', true) <> '00000000000000000000000000000000'
                THEN current_setting('pgfence.trace_id', true) END
$_$;

--
-- Name: fence(text, bigint, uuid); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.fence(resource text, token bigint, op uuid DEFAULT NULL::uuid) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    accepted  bigint;
    issued    bigint;
    retired   bigint;
    retention bigint;
    trace     text;
    done    boolean := false;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF fence.resource IS NULL OR octet_length(fence.resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF fence.token IS NULL OR fence.token <= 0 OR fence.token > 6917529027641081856 THEN
        PERFORM pgfence.check_token(fence.token);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('resource', fence.resource);
    END IF;
    -- The token must come from the lease named by the resource, and its grant
    -- must have committed (or be this transaction's own): the lease row holds
    -- the newest token the key issued. A token above it is from a grant that
    -- has not committed, that rolled back (its number is issued again), that
    -- a failover lost, or from another key's lease: counted per key, it says
    -- nothing about this resource. Tokens at or below the floor are retired
    -- (raise_token_floor): their rows may have been pruned, so nothing else
    -- would remember them. At or below the retention floor only the newest
    -- token of its key is taken: an older one was superseded by a later
    -- grant, and the fence row that would have refused it may have been
    -- pruned (advance_retention). The newest token is never stale: no later
    -- one exists to have written.
    --
    -- The common case first: the resource's fence row holds this token
    -- already, above both floors. The lease was checked when the row took
    -- it, and still holds: a key's newest token never goes down, and
    -- prune_retired deletes a lease row only once its newest token is at or
    -- below a floor (and so every token the key issued is). Under READ
    -- COMMITTED a row changed by a concurrent writer is waited for and the
    -- WHERE is re-checked on its newest version, so a higher token committed
    -- meanwhile is never overwritten. The row stays locked until our
    -- transaction ends.
    SELECT f.floor, f.retention INTO retired, retention FROM pgfence.token_floor f;
    -- An accepted token must survive a crash as long as the write it guards.
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    -- The trace of the accepted write (see pgfence.current_trace_id), NULL
    -- when the transaction names none.
    IF current_setting('pgfence.trace_id', true) <> '' THEN
        trace := pgfence.current_trace_id();
    END IF;
    IF fence.token > retired AND fence.token > retention THEN
        UPDATE pgfence.fences AS f
           SET accepted_at = clock_timestamp(), writes = f.writes + 1,
               op = fence.op, fenced_xid = pg_current_xact_id(), trace_id = trace
         WHERE f.resource = fence.resource COLLATE pg_catalog."default" AND f.token = fence.token;
        done := FOUND;
    END IF;
    IF NOT done THEN
        SELECT l.token INTO issued FROM pgfence.leases l WHERE l.key = fence.resource COLLATE pg_catalog."default";
    END IF;
    IF NOT done AND (issued IS NULL OR NOT (issued >= fence.token AND fence.token > retired AND (fence.token > retention OR fence.token = issued))) THEN
        IF issued IS NULL OR issued < fence.token THEN
            RAISE EXCEPTION 'pgfence: token % was not issued by lease %', fence.token, quote_literal(fence.resource)
                USING ERRCODE = 'PF012',
                      DETAIL = format('issued=%s presented=%s resource=%s', coalesce(issued, 0), fence.token, fence.resource),
                      HINT = CASE WHEN issued IS NULL
                                  THEN 'The key has no lease row: no lease of it was granted, or its ended lease was pruned (prune_retired). Fence a resource with a token of the lease whose key is the resource, acquired anew.'
                                  ELSE 'Use the token after its grant committed, of the lease whose key is the resource.' END;
        END IF;
        IF fence.token <= retired THEN
            RAISE EXCEPTION 'pgfence: stale token % for resource %: tokens up to the floor % are retired', fence.token, quote_literal(fence.resource), retired
                USING ERRCODE = 'PF001',
                      DETAIL = format('accepted=%s presented=%s resource=%s', retired, fence.token, fence.resource),
                      HINT = 'The token floor was raised above this token: acquire the lease again.';
        END IF;
        RAISE EXCEPTION 'pgfence: stale token % for resource %: the lease has issued % since, and superseded tokens up to % are retired', fence.token, quote_literal(fence.resource), issued, retention
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', issued, fence.token, fence.resource),
                  HINT = 'A later grant superseded this token: this holder lost its lease and must acquire it again.';
    END IF;
    -- The resource fenced before with this token, when the fast path above
    -- did not try (the token is its key's newest, at or below the retention
    -- floor), then with a lower one.
    IF NOT done AND NOT (fence.token > retired AND fence.token > retention) THEN
        UPDATE pgfence.fences AS f
           SET accepted_at = clock_timestamp(), writes = f.writes + 1,
               op = fence.op, fenced_xid = pg_current_xact_id(), trace_id = trace
         WHERE f.resource = fence.resource COLLATE pg_catalog."default" AND f.token = fence.token;
        done := FOUND;
    END IF;
    IF NOT done THEN
        UPDATE pgfence.fences AS f
           SET token = fence.token, accepted_at = clock_timestamp(), writes = f.writes + 1,
               op = fence.op, fenced_xid = pg_current_xact_id(), trace_id = trace
         WHERE f.resource = fence.resource COLLATE pg_catalog."default" AND f.token < fence.token;
        done := FOUND;
    END IF;
    IF done THEN
        -- The row is ours now; a write whose client abandoned it must not
        -- commit (checked in a statement of its own: a snapshot taken after
        -- the lock). See pgfence.abandoned_requests.
        IF fence.op IS NOT NULL THEN
            PERFORM FROM pgfence.abandoned_requests ab
             WHERE ab.id = fence.op AND ab.kind = 'fence' AND ab.name = fence.resource COLLATE pg_catalog."default";
            IF FOUND THEN
                PERFORM pgfence.raise_if_abandoned('fence', fence.resource, fence.op);
            END IF;
        END IF;
        RETURN fence.token;
    END IF;
    -- Stale, a first write, or a row our UPDATE could not see yet (a
    -- concurrent first writer). A committed higher token is final (tokens
    -- never decrease): reject it without waiting for anyone's row lock.
    SELECT f.token INTO accepted FROM pgfence.fences f WHERE f.resource = fence.resource COLLATE pg_catalog."default";
    IF FOUND AND accepted > fence.token THEN
        RAISE EXCEPTION 'pgfence: stale token % for resource %: token % was accepted', fence.token, quote_literal(fence.resource), accepted
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', accepted, fence.token, fence.resource),
                  HINT = 'A newer holder has written this resource; this writer lost its lease and must not write.';
    END IF;
    -- Otherwise ON CONFLICT waits for a concurrent first writer and evaluates
    -- its WHERE on the newest version after the row lock: one statement
    -- decides, no retry loop.
    INSERT INTO pgfence.fences AS f (resource, token, op, trace_id)
    VALUES (fence.resource, fence.token, fence.op, trace)
    ON CONFLICT (resource) DO UPDATE
       SET token = excluded.token, accepted_at = clock_timestamp(), writes = f.writes + 1,
           op = excluded.op, fenced_xid = pg_current_xact_id(), trace_id = excluded.trace_id
     WHERE f.token <= excluded.token;
    IF FOUND THEN
        IF fence.op IS NOT NULL THEN
            PERFORM FROM pgfence.abandoned_requests ab
             WHERE ab.id = fence.op AND ab.kind = 'fence' AND ab.name = fence.resource COLLATE pg_catalog."default";
            IF FOUND THEN
                PERFORM pgfence.raise_if_abandoned('fence', fence.resource, fence.op);
            END IF;
        END IF;
        RETURN fence.token;
    END IF;
    -- Stale: a higher token committed while we waited. The row is locked by
    -- us now and this read (a new snapshot) sees it.
    SELECT f.token INTO accepted FROM pgfence.fences f WHERE f.resource = fence.resource COLLATE pg_catalog."default";
    RAISE EXCEPTION 'pgfence: stale token % for resource %: token % was accepted', fence.token, quote_literal(fence.resource), accepted
        USING ERRCODE = 'PF001',
              DETAIL = format('accepted=%s presented=%s resource=%s', accepted, fence.token, fence.resource),
              HINT = 'A newer holder has written this resource; this writer lost its lease and must not write.';
END;
$$;

--
-- Name: fence_probe(text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.fence_probe(p_resource text) RETURNS TABLE(token bigint, writes bigint, op uuid)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_token  bigint;
    v_writes bigint;
    v_op     uuid;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.require_granted('resource', p_resource);
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

--
-- Name: fences_before_update(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.fences_before_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.resource <> OLD.resource THEN
        RAISE EXCEPTION 'pgfence: the fence of resource % may not be moved to resource %', OLD.resource, NEW.resource
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', OLD.token, NEW.token, OLD.resource);
    END IF;
    IF NEW.token < OLD.token THEN
        -- The one exception is an operator's lower_fence, which records the
        -- change in pgfence.fence_resets in the same transaction first.
        -- (A separate IF: one expression with the EXISTS would be planned
        -- again for every row, its cheapest plan depending on the tokens.)
        IF EXISTS (SELECT 1 FROM pgfence.fence_resets r
                    WHERE r.resource = OLD.resource AND r.xid = pg_current_xact_id() AND r.to_token = NEW.token) THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'pgfence: token for resource % may not be lowered from % to %', OLD.resource, OLD.token, NEW.token
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', OLD.token, NEW.token, OLD.resource);
    END IF;
    RETURN NEW;
END;
$$;

--
-- Name: force_release(text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.force_release(p_key text, p_reason text) RETURNS TABLE(released boolean, holder uuid, token bigint, was_live boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_holder uuid;
    v_token  bigint;
    v_live   boolean;
BEGIN
    PERFORM pgfence.require_primary();
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
     WHERE l.key = p_key COLLATE pg_catalog."default" AND l.released_at IS NULL
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

--
-- Name: grant_prefix(regrole, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.grant_prefix(p_role regrole, p_prefix text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_new integer;
    o     record;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_role IS NULL OR p_prefix IS NULL OR octet_length(p_prefix) > 512 THEN
        RAISE EXCEPTION 'pgfence: grant_prefix needs a role and a prefix of at most 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    INSERT INTO pgfence.prefix_grants (grantee, prefix) VALUES (p_role, p_prefix) ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    FOR o IN SELECT g.grantee, g.prefix FROM pgfence.prefix_grants g
              WHERE g.grantee <> p_role
                AND (starts_with(g.prefix, p_prefix COLLATE pg_catalog."default") OR starts_with(p_prefix COLLATE pg_catalog."default", g.prefix))
              ORDER BY g.grantee::text, g.prefix LOOP
        RAISE WARNING 'pgfence: prefix % of role % overlaps prefix % of role %: both roles may use the names that start with %',
                quote_literal(p_prefix), p_role, quote_literal(o.prefix), o.grantee,
                quote_literal(CASE WHEN octet_length(o.prefix) > octet_length(p_prefix) THEN o.prefix ELSE p_prefix END)
            USING DETAIL = format('role=%s prefix=%s overlapping_role=%s overlapping_prefix=%s', p_role, p_prefix, o.grantee, o.prefix),
                  HINT = 'If the names are not meant to be shared, revoke the grant (pgfence.revoke_prefix) and grant prefixes that end with a separator and do not start one another (''stock:'', ''orders:'').';
    END LOOP;
    RETURN v_new > 0;
END;
$$;

--
-- Name: grant_probe(text, uuid); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.grant_probe(p_key text, p_holder uuid) RETURNS TABLE(granted boolean, token bigint, granted_at timestamp with time zone, expires_at timestamp with time zone, live boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    cur pgfence.leases%ROWTYPE;
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.lease_check_args(p_key, NULL, NULL);
    PERFORM pgfence.require_granted('lease', p_key);
    IF p_holder IS NULL THEN
        RAISE EXCEPTION 'pgfence: grant_probe needs a holder' USING ERRCODE = 'PF008';
    END IF;
    BEGIN
        -- Waits for an in-flight grant of the key: its update of the row, or
        -- its insert of the key's first row.
        INSERT INTO pgfence.leases AS l (key, holder, token, granted_at, expires_at, released_at)
        VALUES (p_key, p_holder, 1, clock_timestamp(), clock_timestamp(), clock_timestamp())
        ON CONFLICT (key) DO UPDATE SET key = l.key;
        RAISE EXCEPTION USING ERRCODE = 'PFZ99';
    EXCEPTION WHEN SQLSTATE 'PFZ99' THEN
        NULL;
    END;
    -- A new snapshot: every grant that held the row has ended.
    SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key COLLATE pg_catalog."default";
    IF cur.key IS NULL OR cur.holder <> p_holder THEN
        RETURN QUERY SELECT false, NULL::bigint, NULL::timestamptz, NULL::timestamptz, false;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, cur.token::bigint, cur.granted_at, cur.expires_at,
                        cur.released_at IS NULL AND cur.expires_at > clock_timestamp();
END;
$$;

--
-- Name: guard(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    may_read     boolean := false;
    old_resource text;
    new_resource text;
    res          text;
    fenced       boolean;
BEGIN
    -- A table that came below a protected one after protect (a partition
    -- has this trigger as a clone of its parent's) has no TRUNCATE guard
    -- unless pgfence_guard_new_tables gave it one: every write into it is
    -- refused until it has, so no fenced row lands where TRUNCATE could
    -- remove it without a token. TG_ARGV[2] lists the tables protect
    -- guarded; only another one costs a look at the catalog.
    IF TG_NARGS < 3 OR position(',' || TG_RELID::oid::text || ',' IN TG_ARGV[2]) = 0 THEN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger x
                        WHERE x.tgrelid = TG_RELID AND x.tgname = 'pgfence_guard_truncate' AND x.tgenabled <> 'D') THEN
            RAISE EXCEPTION 'pgfence: % came below a protected table after it was protected, and TRUNCATE of it is not refused: no write to it is accepted', TG_RELID::regclass
                USING ERRCODE = 'PF006',
                      HINT = 'Protect the table it belongs to again (pgfence.protect); with the event trigger pgfence_guard_new_tables, which the migrations install when run as a superuser, new partitions and children are guarded when created.';
        END IF;
    END IF;
    -- Checked one after the other: naming pgfence.fences needs USAGE first.
    IF has_schema_privilege('pgfence', 'USAGE') THEN
        may_read := has_table_privilege('pgfence.fences', 'SELECT');
    END IF;
    IF TG_OP <> 'INSERT' THEN
        old_resource := TG_ARGV[1] || (to_jsonb(OLD) ->> TG_ARGV[0]);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        new_resource := TG_ARGV[1] || (to_jsonb(NEW) ->> TG_ARGV[0]);
    END IF;
    -- The old row's resource, then the new row's if it is another one (an
    -- INSERT, or a row moved to another resource).
    FOREACH res IN ARRAY CASE
            WHEN TG_OP = 'INSERT' THEN ARRAY[new_resource]
            WHEN TG_OP = 'DELETE' OR new_resource IS NOT DISTINCT FROM old_resource THEN ARRAY[old_resource]
            ELSE ARRAY[old_resource, new_resource]
        END
    LOOP
        fenced := false;
        IF may_read AND res IS NOT NULL THEN
            fenced := EXISTS (SELECT 1 FROM pgfence.fences f
                               WHERE f.resource = res AND f.fenced_xid = pg_current_xact_id());
        END IF;
        IF NOT fenced THEN
            IF res IS NULL THEN
                RAISE EXCEPTION 'pgfence: unfenced write to %: the row has no resource', TG_RELID::regclass
                    USING ERRCODE = 'PF006';
            END IF;
            RAISE EXCEPTION 'pgfence: unfenced write to % for resource %: this transaction presented no accepted token', TG_RELID::regclass, quote_literal(res)
                USING ERRCODE = 'PF006',
                      DETAIL = format('resource=%s', res),
                      HINT = 'Call pgfence.fence(resource, token) in the same transaction before writing.';
        END IF;
    END LOOP;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;

--
-- Name: guard_new_tables(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.guard_new_tables() RETURNS event_trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    anc regclass;
    col text;
    pre text;
BEGIN
    FOR anc IN
        WITH RECURSIVE touched(relid) AS (
            SELECT c.objid FROM pg_event_trigger_ddl_commands() c WHERE c.classid = 'pg_class'::regclass
            UNION
            SELECT i.inhrelid FROM touched t JOIN pg_inherits i ON i.inhparent = t.relid
        ), above(relid, anc) AS (
            SELECT t.relid, i.inhparent FROM touched t JOIN pg_inherits i ON i.inhrelid = t.relid
            UNION
            SELECT a.relid, i.inhparent FROM above a JOIN pg_inherits i ON i.inhrelid = a.anc
        )
        SELECT DISTINCT a.anc::regclass
          FROM above a JOIN pg_class c ON c.oid = a.relid
         WHERE c.relkind IN ('r', 'p')
           AND NOT EXISTS (SELECT 1 FROM pg_trigger x WHERE x.tgrelid = a.relid AND x.tgname = 'pgfence_guard_truncate')
           AND EXISTS (SELECT 1 FROM pg_trigger x WHERE x.tgrelid = a.anc AND x.tgname = 'pgfence_guard' AND x.tgparentid = 0)
           AND EXISTS (SELECT 1 FROM pg_trigger x WHERE x.tgrelid = a.anc AND x.tgname = 'pgfence_guard_truncate')
    LOOP
        SELECT p.resource_column, p.prefix INTO col, pre FROM pgfence.protected_tables() p WHERE p.relation = anc;
        PERFORM pgfence.protect(anc, col, pre);
    END LOOP;
END;
$$;

--
-- Name: idempotency_advance(text, text, uuid, text, bytea, interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_advance(p_scope text, p_key text, p_owner uuid, p_recovery_point text, p_recovery_data bytea, p_lease interval) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.idempotency_check_name(p_scope, p_key);
    PERFORM pgfence.require_granted('idempotency scope', p_scope);
    PERFORM pgfence.idempotency_durable();
    IF p_lease IS NULL OR p_lease < interval '1 millisecond' OR p_lease > interval '24 hours' THEN
        RAISE EXCEPTION 'pgfence: idempotency lease must be 1 ms to 24 hours, got %', p_lease USING ERRCODE = 'PF008';
    END IF;
    IF p_recovery_point IS NULL OR octet_length(p_recovery_point) > 256 THEN
        RAISE EXCEPTION 'pgfence: idempotency recovery point must be at most 256 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF octet_length(p_recovery_data) > 1048576 THEN
        RAISE EXCEPTION 'pgfence: idempotency recovery data must be at most 1 MiB' USING ERRCODE = 'PF008';
    END IF;
    UPDATE pgfence.idempotency_keys k
       SET recovery_point = p_recovery_point, recovery_data = p_recovery_data,
           lease_expires_at = clock_timestamp() + p_lease, updated_at = clock_timestamp()
     WHERE k.scope = p_scope COLLATE pg_catalog."default" AND k.key = p_key COLLATE pg_catalog."default" AND k.owner = p_owner
       AND k.mode = 'leased' AND k.status = 'in_progress'
    RETURNING k.lease_expires_at INTO v_expires;
    IF NOT FOUND THEN
        PERFORM pgfence.idempotency_not_owner(p_scope, p_key, p_owner);
    END IF;
    RETURN v_expires;
END;
$$;

--
-- Name: idempotency_atomic_completed(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_atomic_completed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF NEW.mode <> 'atomic' OR NEW.status <> 'in_progress' THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM pgfence.idempotency_keys k
                WHERE k.scope = NEW.scope AND k.key = NEW.key
                  AND k.mode = 'atomic' AND k.status = 'in_progress') THEN
        RAISE EXCEPTION 'pgfence: atomic idempotency claim %/% was not completed in its transaction', NEW.scope, NEW.key
            USING ERRCODE = 'PF008',
                  HINT = 'Call pgfence.idempotency_complete_atomic before COMMIT, or roll back.';
    END IF;
    RETURN NULL;
END;
$$;

--
-- Name: idempotency_check_args(text, text, bytea, interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_check_args(p_scope text, p_key text, p_fingerprint bytea, p_retention interval) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    PERFORM pgfence.idempotency_check_name(p_scope, p_key);
    IF p_fingerprint IS NULL OR octet_length(p_fingerprint) NOT BETWEEN 16 AND 64 THEN
        RAISE EXCEPTION 'pgfence: idempotency fingerprint must be 16 to 64 bytes (a hash of the request)' USING ERRCODE = 'PF008';
    END IF;
    IF p_retention IS NULL OR p_retention <= interval '0' OR p_retention > interval '366 days' THEN
        RAISE EXCEPTION 'pgfence: idempotency retention must be above 0 and at most 366 days, got %', p_retention USING ERRCODE = 'PF008';
    END IF;
END;
$$;

--
-- Name: idempotency_check_name(text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_check_name(p_scope text, p_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF p_scope IS NULL OR octet_length(p_scope) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: idempotency scope must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: idempotency key must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
END;
$$;

--
-- Name: idempotency_check_result(bytea, text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_check_result(p_result bytea, p_failure_code text, p_failure_message text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF octet_length(p_result) > 16777216 THEN
        RAISE EXCEPTION 'pgfence: idempotency result must be at most 16 MiB' USING ERRCODE = 'PF008';
    END IF;
    IF octet_length(p_failure_code) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'pgfence: idempotency failure code must be 1 to 128 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF octet_length(p_failure_message) > 4096 THEN
        RAISE EXCEPTION 'pgfence: idempotency failure message must be at most 4096 bytes' USING ERRCODE = 'PF008';
    END IF;
END;
$$;

--
-- Name: idempotency_claim(text, text, bytea, interval, interval, interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_claim(p_scope text, p_key text, p_fingerprint bytea, p_lease interval, p_retention interval, p_wait interval DEFAULT '00:00:05'::interval) RETURNS TABLE(outcome text, owner uuid, epoch bigint, lease_expires_at timestamp with time zone, recovery_point text, recovery_data bytea, status text, result bytea, failure_code text, failure_message text, expires_at timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    -- takes what set_config and pg_notify return: an assignment is evaluated
    -- as a simple expression, a PERFORM as a query through the executor
    v_set    text;
    r         pgfence.idempotency_keys%ROWTYPE;
    v_old     text;
    v_claimed boolean;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_scope IS NULL OR octet_length(p_scope) NOT BETWEEN 1 AND 512 OR p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512
       OR p_fingerprint IS NULL OR octet_length(p_fingerprint) NOT BETWEEN 16 AND 64
       OR p_retention IS NULL OR p_retention <= interval '0' OR p_retention > interval '366 days' THEN
        PERFORM pgfence.idempotency_check_args(p_scope, p_key, p_fingerprint, p_retention);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('idempotency scope', p_scope);
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        v_set := set_config('synchronous_commit', 'on', true);
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pgfence.idempotency_require_read_committed();
    END IF;
    IF p_lease IS NULL OR p_lease < interval '1 millisecond' OR p_lease > interval '24 hours' THEN
        RAISE EXCEPTION 'pgfence: idempotency lease must be 1 ms to 24 hours, got %', p_lease USING ERRCODE = 'PF008';
    END IF;
    IF p_wait IS NULL OR p_wait < interval '1 millisecond' OR p_wait > interval '2147483647 milliseconds' THEN
        RAISE EXCEPTION 'pgfence: idempotency wait must be 1ms to 2147483647ms (lock_timeout''s range), got %', p_wait
            USING ERRCODE = 'PF008';
    END IF;
    FOR i IN 1..5 LOOP
        -- Cheap read first: a replay or a refusal writes nothing.
        SELECT * INTO r FROM pgfence.idempotency_keys k WHERE k.scope = p_scope COLLATE pg_catalog."default" AND k.key = p_key COLLATE pg_catalog."default";
        IF FOUND AND NOT (r.status <> 'in_progress' AND r.expires_at <= clock_timestamp()) THEN
            IF r.fingerprint <> p_fingerprint THEN
                RAISE EXCEPTION 'pgfence: idempotency key %/% was used with a different request', p_scope, p_key
                    USING ERRCODE = 'PF004',
                          HINT = 'A key names one business intent; use a new key for a different request.';
            END IF;
            IF r.status <> 'in_progress' THEN
                RETURN QUERY SELECT 'replayed'::text, NULL::uuid, r.epoch, NULL::timestamptz, r.recovery_point,
                                    NULL::bytea, r.status, r.result, r.failure_code, r.failure_message, r.expires_at;
                RETURN;
            END IF;
            IF r.mode = 'atomic' OR r.lease_expires_at > clock_timestamp() THEN
                RAISE EXCEPTION 'pgfence: idempotency key %/% is in progress', p_scope, p_key
                    USING ERRCODE = 'PF007',
                          DETAIL = CASE WHEN r.mode = 'leased'
                                        THEN format('The lease expires in %s.', r.lease_expires_at - clock_timestamp())
                                        ELSE 'This transaction holds an atomic claim on it.' END,
                          HINT = 'Retry after the lease expires, or wait for the owner to complete.';
            END IF;
            -- A leased claim whose lease expired: take it over below.
        END IF;
        -- The row may be locked by a transaction that has not committed yet:
        -- the owner completing, failing or heartbeating inside its own
        -- transaction, or another claim's insert. Wait for it at most p_wait,
        -- then report the key in progress (PF007) instead of blocking the
        -- duplicate for as long as that transaction lasts.
        BEGIN
            v_old := current_setting('lock_timeout');
            v_set := set_config('lock_timeout', ceil(extract(epoch FROM p_wait) * 1000)::bigint || 'ms', true);
            INSERT INTO pgfence.idempotency_keys AS k
                   (scope, key, fingerprint, mode, status, owner, epoch, lease_expires_at, retention,
                    created_at, updated_at)
            VALUES (p_scope, p_key, p_fingerprint, 'leased', 'in_progress', gen_random_uuid(), 1,
                    clock_timestamp() + p_lease, p_retention, clock_timestamp(), clock_timestamp())
            ON CONFLICT (scope, key) DO UPDATE
               SET fingerprint = excluded.fingerprint, mode = 'leased', status = 'in_progress',
                   owner = excluded.owner, epoch = k.epoch + 1, trace_id = excluded.trace_id,
                   lease_expires_at = clock_timestamp() + p_lease,
                   -- a takeover resumes from the recovery point; a reused expired key starts afresh
                   recovery_point = CASE WHEN k.status = 'in_progress' THEN k.recovery_point ELSE '' END,
                   recovery_data = CASE WHEN k.status = 'in_progress' THEN k.recovery_data END,
                   result = NULL, failure_code = NULL, failure_message = NULL,
                   retention = excluded.retention,
                   created_at = CASE WHEN k.status = 'in_progress' THEN k.created_at ELSE excluded.created_at END,
                   updated_at = excluded.updated_at, completed_at = NULL, expires_at = NULL
             WHERE (k.status = 'in_progress' AND k.mode = 'leased' AND k.fingerprint = excluded.fingerprint
                    AND k.lease_expires_at <= clock_timestamp())
                OR (k.status <> 'in_progress' AND k.expires_at <= clock_timestamp())
            RETURNING k.* INTO r;
            v_claimed := FOUND;
            v_set := set_config('lock_timeout', v_old, true);
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'pgfence: idempotency key %/% is in progress', p_scope, p_key
                USING ERRCODE = 'PF007',
                      DETAIL = format('Another transaction held the key''s row for longer than %s.', p_wait),
                      HINT = 'Retry shortly: the transaction that holds it is completing or claiming the key.';
        END;
        IF v_claimed THEN
            RETURN QUERY SELECT 'new'::text, r.owner, r.epoch, r.lease_expires_at, r.recovery_point,
                                r.recovery_data, r.status, NULL::bytea, NULL::text, NULL::text, NULL::timestamptz;
            RETURN;
        END IF;
        -- Someone else changed the row first: read it again with a new snapshot.
    END LOOP;
    RAISE EXCEPTION 'pgfence: idempotency key %/% is in progress (contended)', p_scope, p_key
        USING ERRCODE = 'PF007';
END;
$$;

--
-- Name: idempotency_claim_atomic(text, text, bytea, interval, interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_claim_atomic(p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval) RETURNS TABLE(outcome text, status text, result bytea, failure_code text, failure_message text, expires_at timestamp with time zone, retry_after interval)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    -- takes what set_config and pg_notify return: an assignment is evaluated
    -- as a simple expression, a PERFORM as a query through the executor
    v_set    text;
    r         pgfence.idempotency_keys%ROWTYPE;
    v_claimed boolean;
    v_old     text;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_scope IS NULL OR octet_length(p_scope) NOT BETWEEN 1 AND 512 OR p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512
       OR p_fingerprint IS NULL OR octet_length(p_fingerprint) NOT BETWEEN 16 AND 64
       OR p_retention IS NULL OR p_retention <= interval '0' OR p_retention > interval '366 days' THEN
        PERFORM pgfence.idempotency_check_args(p_scope, p_key, p_fingerprint, p_retention);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('idempotency scope', p_scope);
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        v_set := set_config('synchronous_commit', 'on', true);
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pgfence.idempotency_require_read_committed();
    END IF;
    IF p_wait IS NULL OR p_wait < interval '1 millisecond' OR p_wait > interval '2147483647 milliseconds' THEN
        RAISE EXCEPTION 'pgfence: idempotency wait must be 1 ms to 2147483647 ms (lock_timeout''s largest value), got %', p_wait USING ERRCODE = 'PF008';
    END IF;
    FOR i IN 1..5 LOOP
        -- Cheap read first: a replay or a refusal writes nothing.
        SELECT * INTO r FROM pgfence.idempotency_keys k WHERE k.scope = p_scope COLLATE pg_catalog."default" AND k.key = p_key COLLATE pg_catalog."default";
        IF FOUND AND NOT (r.status <> 'in_progress' AND r.expires_at <= clock_timestamp()) THEN
            IF r.fingerprint <> p_fingerprint THEN
                RETURN QUERY SELECT 'mismatch'::text, NULL::text, NULL::bytea, NULL::text, NULL::text,
                                    NULL::timestamptz, NULL::interval;
                RETURN;
            END IF;
            IF r.status <> 'in_progress' THEN
                RETURN QUERY SELECT 'replayed'::text, r.status, r.result, r.failure_code, r.failure_message,
                                    r.expires_at, NULL::interval;
                RETURN;
            END IF;
            -- An atomic row in progress that we can see is this transaction's own
            -- claim (a committed one cannot exist); a leased row is someone's lease.
            RETURN QUERY SELECT 'in_progress'::text, r.status, NULL::bytea, NULL::text, NULL::text, NULL::timestamptz,
                                CASE WHEN r.mode = 'leased'
                                     THEN greatest(r.lease_expires_at - clock_timestamp(), interval '0') END;
            RETURN;
        END IF;
        -- Absent or expired: claim it. A concurrent uncommitted claim makes the
        -- INSERT wait for that transaction, at most p_wait.
        BEGIN
            v_old := current_setting('lock_timeout');
            v_set := set_config('lock_timeout', ceil(extract(epoch FROM p_wait) * 1000)::bigint || 'ms', true);
            v_claimed := false;
            INSERT INTO pgfence.idempotency_keys AS k
                   (scope, key, fingerprint, mode, status, epoch, retention, created_at, updated_at)
            VALUES (p_scope, p_key, p_fingerprint, 'atomic', 'in_progress', 1, p_retention,
                    clock_timestamp(), clock_timestamp())
            ON CONFLICT (scope, key) DO UPDATE
               SET fingerprint = excluded.fingerprint, mode = 'atomic', status = 'in_progress',
                   owner = NULL, epoch = k.epoch + 1, trace_id = excluded.trace_id, lease_expires_at = NULL,
                   recovery_point = '', recovery_data = NULL, result = NULL,
                   failure_code = NULL, failure_message = NULL, retention = excluded.retention,
                   created_at = excluded.created_at, updated_at = excluded.updated_at,
                   completed_at = NULL, expires_at = NULL
             WHERE k.status <> 'in_progress' AND k.expires_at <= clock_timestamp()
            RETURNING true INTO v_claimed;
            v_set := set_config('lock_timeout', v_old, true);
        EXCEPTION WHEN lock_not_available THEN
            RETURN QUERY SELECT 'in_progress'::text, 'in_progress'::text, NULL::bytea, NULL::text, NULL::text,
                                NULL::timestamptz, NULL::interval;
            RETURN;
        END;
        IF v_claimed THEN
            RETURN QUERY SELECT 'new'::text, 'in_progress'::text, NULL::bytea, NULL::text, NULL::text,
                                NULL::timestamptz, NULL::interval;
            RETURN;
        END IF;
        -- The conflicting row committed and is live: read it with a new snapshot.
    END LOOP;
    RETURN QUERY SELECT 'in_progress'::text, NULL::text, NULL::bytea, NULL::text, NULL::text,
                        NULL::timestamptz, NULL::interval;
END;
$$;

--
-- Name: idempotency_claim_atomic_new(text, text, bytea, interval, interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_claim_atomic_new(p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_outcome text;
    v_retry   interval;
BEGIN
    SELECT c.outcome, c.retry_after INTO v_outcome, v_retry
      FROM pgfence.idempotency_claim_atomic(p_scope, p_key, p_fingerprint, p_wait, p_retention) c;
    IF v_outcome = 'new' THEN
        RETURN;
    ELSIF v_outcome = 'mismatch' THEN
        RAISE EXCEPTION 'pgfence: idempotency key %/% was used with a different request', p_scope, p_key
            USING ERRCODE = 'PF004',
                  HINT = 'A key names one business intent; use a new key for a different request.';
    ELSIF v_outcome = 'replayed' THEN
        RAISE EXCEPTION 'pgfence: idempotency key %/% already has a stored answer', p_scope, p_key
            USING ERRCODE = 'PF015',
                  HINT = 'Roll back, and read the answer with pgfence.idempotency_claim_atomic (outcome replayed).';
    END IF;
    RAISE EXCEPTION 'pgfence: idempotency key %/% is in progress', p_scope, p_key
        USING ERRCODE = 'PF007',
              DETAIL = CASE WHEN v_retry IS NOT NULL THEN format('The lease expires in %s.', v_retry)
                            ELSE format('Another transaction held the key for longer than %s.', p_wait) END,
              HINT = 'Retry shortly.';
END;
$$;

--
-- Name: idempotency_complete(text, text, uuid, bytea, text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_complete(p_scope text, p_key text, p_owner uuid, p_result bytea, p_failure_code text DEFAULT NULL::text, p_failure_message text DEFAULT NULL::text) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_scope IS NULL OR octet_length(p_scope) NOT BETWEEN 1 AND 512 OR p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 THEN
        PERFORM pgfence.idempotency_check_name(p_scope, p_key);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('idempotency scope', p_scope);
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    IF octet_length(p_result) > 16777216 OR octet_length(p_failure_code) NOT BETWEEN 1 AND 128 OR octet_length(p_failure_message) > 4096 THEN
        PERFORM pgfence.idempotency_check_result(p_result, p_failure_code, p_failure_message);
    END IF;
    UPDATE pgfence.idempotency_keys k
       SET status = CASE WHEN p_failure_code IS NULL THEN 'succeeded' ELSE 'failed' END,
           result = CASE WHEN p_failure_code IS NULL THEN coalesce(p_result, '') ELSE p_result END,
           failure_code = p_failure_code,
           failure_message = CASE WHEN p_failure_code IS NULL THEN NULL ELSE coalesce(p_failure_message, '') END,
           owner = NULL, lease_expires_at = NULL,
           completed_at = clock_timestamp(), updated_at = clock_timestamp(),
           expires_at = clock_timestamp() + k.retention
     WHERE k.scope = p_scope COLLATE pg_catalog."default" AND k.key = p_key COLLATE pg_catalog."default" AND k.owner = p_owner
       AND k.mode = 'leased' AND k.status = 'in_progress'
    RETURNING k.expires_at INTO v_expires;
    IF NOT FOUND THEN
        PERFORM pgfence.idempotency_not_owner(p_scope, p_key, p_owner);
    END IF;
    RETURN v_expires;
END;
$$;

--
-- Name: idempotency_complete_atomic(text, text, bytea, text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_complete_atomic(p_scope text, p_key text, p_result bytea, p_failure_code text DEFAULT NULL::text, p_failure_message text DEFAULT NULL::text) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_scope IS NULL OR octet_length(p_scope) NOT BETWEEN 1 AND 512 OR p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 THEN
        PERFORM pgfence.idempotency_check_name(p_scope, p_key);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('idempotency scope', p_scope);
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    IF octet_length(p_result) > 16777216 OR octet_length(p_failure_code) NOT BETWEEN 1 AND 128 OR octet_length(p_failure_message) > 4096 THEN
        PERFORM pgfence.idempotency_check_result(p_result, p_failure_code, p_failure_message);
    END IF;
    UPDATE pgfence.idempotency_keys k
       SET status = CASE WHEN p_failure_code IS NULL THEN 'succeeded' ELSE 'failed' END,
           result = CASE WHEN p_failure_code IS NULL THEN coalesce(p_result, '') ELSE p_result END,
           failure_code = p_failure_code,
           failure_message = CASE WHEN p_failure_code IS NULL THEN NULL ELSE coalesce(p_failure_message, '') END,
           completed_at = clock_timestamp(),
           updated_at = clock_timestamp(),
           expires_at = clock_timestamp() + k.retention
     WHERE k.scope = p_scope COLLATE pg_catalog."default" AND k.key = p_key COLLATE pg_catalog."default" AND k.mode = 'atomic' AND k.status = 'in_progress'
    RETURNING k.expires_at INTO v_expires;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: this transaction holds no atomic claim on idempotency key %/%', p_scope, p_key
            USING ERRCODE = 'PF002';
    END IF;
    RETURN v_expires;
END;
$$;

--
-- Name: idempotency_durable(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_durable() RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END;
$$;

--
-- Name: idempotency_gc(integer); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_gc(p_batch integer) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM pgfence.require_primary();
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

--
-- Name: idempotency_heartbeat(text, text, uuid, interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_heartbeat(p_scope text, p_key text, p_owner uuid, p_lease interval) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_scope IS NULL OR octet_length(p_scope) NOT BETWEEN 1 AND 512 OR p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 THEN
        PERFORM pgfence.idempotency_check_name(p_scope, p_key);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('idempotency scope', p_scope);
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    IF p_lease IS NULL OR p_lease < interval '1 millisecond' OR p_lease > interval '24 hours' THEN
        RAISE EXCEPTION 'pgfence: idempotency lease must be 1 ms to 24 hours, got %', p_lease USING ERRCODE = 'PF008';
    END IF;
    UPDATE pgfence.idempotency_keys k
       SET lease_expires_at = clock_timestamp() + p_lease, updated_at = clock_timestamp()
     WHERE k.scope = p_scope COLLATE pg_catalog."default" AND k.key = p_key COLLATE pg_catalog."default" AND k.owner = p_owner
       AND k.mode = 'leased' AND k.status = 'in_progress'
    RETURNING k.lease_expires_at INTO v_expires;
    IF NOT FOUND THEN
        PERFORM pgfence.idempotency_not_owner(p_scope, p_key, p_owner);
    END IF;
    RETURN v_expires;
END;
$$;

--
-- Name: idempotency_keys; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.idempotency_keys (
    scope text NOT NULL,
    key text NOT NULL,
    fingerprint bytea NOT NULL,
    mode text NOT NULL,
    status text NOT NULL,
    owner uuid,
    epoch bigint DEFAULT 1 NOT NULL,
    lease_expires_at timestamp with time zone,
    recovery_point text DEFAULT ''::text NOT NULL,
    recovery_data bytea,
    result bytea,
    failure_code text,
    failure_message text,
    retention interval NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    completed_at timestamp with time zone,
    expires_at timestamp with time zone,
    trace_id text DEFAULT pgfence.current_trace_id()
);

--
-- Name: idempotency_key_valid(pgfence.idempotency_keys); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_key_valid(k pgfence.idempotency_keys) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    RETURN octet_length(k.scope) BETWEEN 1 AND 512 AND octet_length(k.key) BETWEEN 1 AND 512
       AND octet_length(k.fingerprint) BETWEEN 16 AND 64 AND k.epoch >= 1
       AND CASE k.status
        WHEN 'in_progress' THEN k.completed_at IS NULL AND k.expires_at IS NULL AND k.result IS NULL AND k.failure_code IS NULL
             AND CASE k.mode WHEN 'atomic' THEN k.owner IS NULL AND k.lease_expires_at IS NULL AND k.recovery_data IS NULL
                             WHEN 'leased' THEN k.lease_expires_at IS NOT NULL
                             ELSE false END
        WHEN 'succeeded' THEN coalesce(k.expires_at > k.completed_at, false) AND k.result IS NOT NULL AND k.failure_code IS NULL
             AND k.failure_message IS NULL AND k.owner IS NULL AND k.lease_expires_at IS NULL AND k.mode IN ('atomic', 'leased')
        WHEN 'failed' THEN coalesce(k.expires_at > k.completed_at, false) AND k.failure_code IS NOT NULL
             AND k.owner IS NULL AND k.lease_expires_at IS NULL AND k.mode IN ('atomic', 'leased')
        ELSE false END;
END;
$$;

--
-- Name: idempotency_not_owner(text, text, uuid); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_not_owner(p_scope text, p_key text, p_owner uuid) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'pgfence: % is not the current owner of idempotency key %/%', p_owner, p_scope, p_key
        USING ERRCODE = 'PF002',
              DETAIL = 'The lease expired and another attempt took the key over, the claim was released, or the key is completed.';
END;
$$;

--
-- Name: idempotency_release(text, text, uuid); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_release(p_scope text, p_key text, p_owner uuid) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.idempotency_check_name(p_scope, p_key);
    PERFORM pgfence.require_granted('idempotency scope', p_scope);
    PERFORM pgfence.idempotency_durable();
    UPDATE pgfence.idempotency_keys k
       SET owner = NULL, lease_expires_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE k.scope = p_scope COLLATE pg_catalog."default" AND k.key = p_key COLLATE pg_catalog."default" AND k.owner = p_owner
       AND k.mode = 'leased' AND k.status = 'in_progress';
    IF NOT FOUND THEN
        PERFORM pgfence.idempotency_not_owner(p_scope, p_key, p_owner);
    END IF;
END;
$$;

--
-- Name: idempotency_require_read_committed(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.idempotency_require_read_committed() RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfence: idempotency keys need READ COMMITTED, this transaction runs in %',
                upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'PF010',
                  HINT = 'Run the claim in a READ COMMITTED transaction (BEGIN ISOLATION LEVEL READ COMMITTED).';
    END IF;
END;
$$;

--
-- Name: job_check_args(text, uuid, bigint, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.job_check_args(p_key text, p_holder uuid, p_token bigint, p_slot text) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgfence.lease_check_args(p_key, NULL, NULL);
    IF p_slot IS NULL OR pg_catalog.octet_length(p_slot) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'pgfence: a job slot must be 1 to 256 bytes, got %',
            coalesce(pg_catalog.octet_length(p_slot)::text || ' bytes', 'NULL')
            USING ERRCODE = 'PF008';
    END IF;
    IF p_holder IS NULL THEN
        RAISE EXCEPTION 'pgfence: job slot % of % needs a holder', p_slot, p_key USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.check_token(p_token);
END;
$$;

--
-- Name: job_slot_begin(text, uuid, bigint, text, boolean); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.job_slot_begin(p_key text, p_holder uuid, p_token bigint, p_slot text, p_restart boolean DEFAULT false) RETURNS TABLE(completed boolean, runs integer, checkpoint text, previous_token bigint, started_at timestamp with time zone, completed_at timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    cur  pgfence.job_slots%ROWTYPE;
    prev bigint;
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.job_check_args(p_key, p_holder, p_token, p_slot);
    PERFORM pgfence.require_granted('lease', p_key);
    PERFORM pgfence.require_lease(p_key, p_holder, p_token);
    IF pg_catalog.current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;

    INSERT INTO pgfence.job_slots AS s (key, slot, holder, token, runs, started_at, run_at)
    VALUES (p_key, p_slot, p_holder, p_token, 1, pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp())
    ON CONFLICT (key, slot) DO NOTHING
    RETURNING s.* INTO cur;
    IF FOUND THEN
        DELETE FROM pgfence.job_slots s
         WHERE s.key = p_key COLLATE pg_catalog."default"
           AND (s.started_at, s.slot) < (SELECT o.started_at, o.slot FROM pgfence.job_slots o WHERE o.key = p_key COLLATE pg_catalog."default"
                                          ORDER BY o.started_at DESC, o.slot DESC OFFSET 999 LIMIT 1);
        RETURN QUERY SELECT false, 1, NULL::text, NULL::bigint, cur.started_at, NULL::timestamptz;
        RETURN;
    END IF;

    SELECT s.* INTO cur FROM pgfence.job_slots s WHERE s.key = p_key COLLATE pg_catalog."default" AND s.slot = p_slot FOR UPDATE;
    IF cur.completed_at IS NOT NULL OR (cur.token = p_token AND cur.runs > 0) THEN
        RETURN QUERY SELECT cur.completed_at IS NOT NULL, cur.runs, cur.checkpoint,
                            CASE WHEN cur.completed_at IS NOT NULL THEN cur.token END, cur.started_at, cur.completed_at;
        RETURN;
    END IF;
    prev := cur.token;
    UPDATE pgfence.job_slots s
       SET holder = p_holder, token = p_token, runs = s.runs + 1, run_at = pg_catalog.clock_timestamp(),
           checkpoint = CASE WHEN p_restart THEN NULL ELSE s.checkpoint END,
           saved_at = CASE WHEN p_restart THEN NULL ELSE s.saved_at END
     WHERE s.key = p_key COLLATE pg_catalog."default" AND s.slot = p_slot
    RETURNING s.* INTO cur;
    RETURN QUERY SELECT false, cur.runs, cur.checkpoint, CASE WHEN cur.runs > 1 THEN prev END, cur.started_at, NULL::timestamptz;
END;
$$;

--
-- Name: job_slot_complete(text, uuid, bigint, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.job_slot_complete(p_key text, p_holder uuid, p_token bigint, p_slot text) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_at timestamptz;
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.job_check_args(p_key, p_holder, p_token, p_slot);
    PERFORM pgfence.require_granted('lease', p_key);
    PERFORM pgfence.require_lease(p_key, p_holder, p_token);
    IF pg_catalog.current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    UPDATE pgfence.job_slots s SET completed_at = pg_catalog.clock_timestamp()
     WHERE s.key = p_key COLLATE pg_catalog."default" AND s.slot = p_slot AND s.token = p_token AND s.completed_at IS NULL AND s.runs > 0
    RETURNING s.completed_at INTO v_at;
    IF v_at IS NULL THEN
        SELECT s.completed_at INTO v_at FROM pgfence.job_slots s
         WHERE s.key = p_key COLLATE pg_catalog."default" AND s.slot = p_slot AND s.token = p_token AND s.completed_at IS NOT NULL;
        IF v_at IS NULL THEN
            PERFORM pgfence.raise_not_slot_run(p_key, p_slot, p_token);
        END IF;
    END IF;
    RETURN v_at;
END;
$$;

--
-- Name: job_slot_missed(text, uuid, bigint, timestamp with time zone, interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.job_slot_missed(p_key text, p_holder uuid, p_token bigint, p_before timestamp with time zone, p_period interval) RETURNS text[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET "TimeZone" TO 'UTC'
    AS $_$
DECLARE
    v_newest text;
    v_missed text[];
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.job_check_args(p_key, p_holder, p_token, 'period'); -- the key, holder and token
    IF p_before IS NULL OR p_period IS NULL OR p_period < interval '1 second' THEN
        RAISE EXCEPTION 'pgfence: job_slot_missed needs a period start and a period of at least 1 second, got % and %',
            coalesce(p_before::text, 'NULL'), coalesce(p_period::text, 'NULL') USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.require_granted('lease', p_key);
    PERFORM pgfence.require_lease(p_key, p_holder, p_token);
    SELECT pg_catalog.max(s.slot COLLATE "C") INTO v_newest FROM pgfence.job_slots s
     WHERE s.key = p_key COLLATE pg_catalog."default" AND s.slot ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$'
       AND s.slot COLLATE "C" < pg_catalog.to_char(p_before, 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
    SELECT pg_catalog.array_agg(m.slot ORDER BY m.slot COLLATE "C") INTO v_missed
      FROM (SELECT pg_catalog.to_char(p_before - p_period * k, 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS slot
              FROM pg_catalog.generate_series(1, 999) AS k) m
     WHERE m.slot COLLATE "C" > v_newest;
    INSERT INTO pgfence.job_slots (key, slot, holder, token, runs, started_at, run_at)
    SELECT p_key, m.slot, p_holder, p_token, 0, pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp()
      FROM pg_catalog.unnest(v_missed) AS m(slot)
    ON CONFLICT (key, slot) DO NOTHING;
    RETURN coalesce(v_missed, '{}');
END;
$_$;

--
-- Name: job_slot_save(text, uuid, bigint, text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.job_slot_save(p_key text, p_holder uuid, p_token bigint, p_slot text, p_checkpoint text) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_at timestamptz;
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.job_check_args(p_key, p_holder, p_token, p_slot);
    IF p_checkpoint IS NOT NULL AND pg_catalog.octet_length(p_checkpoint) > 65536 THEN
        RAISE EXCEPTION 'pgfence: a job checkpoint must be at most 65536 bytes, got %', pg_catalog.octet_length(p_checkpoint)
            USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.require_granted('lease', p_key);
    PERFORM pgfence.require_lease(p_key, p_holder, p_token);
    IF pg_catalog.current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    UPDATE pgfence.job_slots s SET checkpoint = p_checkpoint, saved_at = pg_catalog.clock_timestamp()
     WHERE s.key = p_key COLLATE pg_catalog."default" AND s.slot = p_slot AND s.token = p_token AND s.completed_at IS NULL AND s.runs > 0
    RETURNING s.saved_at INTO v_at;
    IF v_at IS NULL THEN
        PERFORM pgfence.raise_not_slot_run(p_key, p_slot, p_token);
    END IF;
    RETURN v_at;
END;
$$;

--
-- Name: lease_check_args(text, interval, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.lease_check_args(p_key text, p_ttl interval, p_holder_info text) RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: lease key must be 1 to 512 bytes, got %',
            coalesce(octet_length(p_key)::text || ' bytes', 'NULL')
            USING ERRCODE = 'PF008';
    END IF;
    IF p_ttl IS NOT NULL AND (p_ttl < interval '1 millisecond' OR p_ttl > pgfence.lease_max_ttl()) THEN
        RAISE EXCEPTION 'pgfence: lease ttl must be 1 ms to %, got %',
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

--
-- Name: lease_max_ttl(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.lease_max_ttl() RETURNS interval
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT interval '24 hours' $$;

--
-- Name: lease_queue_leave(text, uuid); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.lease_queue_leave(p_key text, p_waiter uuid) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgfence.require_primary();
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 OR p_waiter IS NULL THEN
        RAISE EXCEPTION 'pgfence: lease_queue_leave needs a key (1 to 512 bytes) and a waiter id' USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.require_granted('lease', p_key);
    DELETE FROM pgfence.lease_waiters w WHERE w.key = p_key COLLATE pg_catalog."default" AND w.waiter = p_waiter;
    RETURN FOUND;
END;
$$;

--
-- Name: lease_queue_turn(text, uuid, interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.lease_queue_turn(p_key text, p_waiter uuid, p_patience interval) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    my_enqueued timestamptz;
    ahead       bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 OR p_waiter IS NULL
       OR p_patience IS NULL OR p_patience <= interval '0' OR p_patience > 2 * pgfence.lease_max_ttl() + interval '1 minute' THEN
        RAISE EXCEPTION 'pgfence: lease_queue_turn needs a key (1 to 512 bytes), a waiter id and a patience above 0 and at most %',
                2 * pgfence.lease_max_ttl() + interval '1 minute'
            USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.require_granted('lease', p_key);
    -- Queue positions need no durability: losing them in a crash costs
    -- fairness only.
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM pgfence.lease_waiters w WHERE w.key = p_key COLLATE pg_catalog."default" AND w.expires_at <= clock_timestamp();
    INSERT INTO pgfence.lease_waiters AS w (key, waiter, expires_at)
    VALUES (p_key, p_waiter, clock_timestamp() + p_patience)
    ON CONFLICT (key, waiter) DO UPDATE SET expires_at = clock_timestamp() + p_patience
    RETURNING w.enqueued_at INTO my_enqueued;
    SELECT count(*) INTO ahead
      FROM pgfence.lease_waiters w
     WHERE w.key = p_key COLLATE pg_catalog."default" AND w.expires_at > clock_timestamp()
       AND (w.enqueued_at, w.waiter) < (my_enqueued, p_waiter);
    RETURN ahead;
END;
$$;

--
-- Name: leases; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.leases (
    key pgfence.key_name NOT NULL,
    holder uuid NOT NULL,
    token pgfence.token_value NOT NULL,
    granted_at timestamp with time zone NOT NULL,
    renewed_at timestamp with time zone,
    expires_at timestamp with time zone NOT NULL,
    released_at timestamp with time zone,
    holder_info pgfence.holder_info DEFAULT ''::text NOT NULL,
    client_version text
)
WITH (fillfactor='80');

--
-- Name: lease_row_valid(pgfence.leases); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.lease_row_valid(l pgfence.leases) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    RETURN l.expires_at >= l.granted_at
       AND (l.renewed_at IS NULL OR l.renewed_at >= l.granted_at)
       AND (l.released_at IS NULL OR l.released_at >= l.granted_at);
END;
$$;

--
-- Name: lower_fence(text, bigint, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.lower_fence(p_resource text, p_token bigint, p_reason text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_old bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.check_token(p_token);
    IF p_reason IS NULL OR length(p_reason) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgfence: lower_fence needs a reason of 1 to 1000 characters' USING ERRCODE = 'PF008';
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    SELECT f.token INTO v_old FROM pgfence.fences f WHERE f.resource = p_resource COLLATE pg_catalog."default" FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: no token was accepted for resource %', quote_literal(p_resource)
            USING ERRCODE = 'PF008';
    END IF;
    IF p_token >= v_old THEN
        RAISE EXCEPTION 'pgfence: lower_fence: token % is not below the accepted token % of %', p_token, v_old, quote_literal(p_resource)
            USING ERRCODE = 'PF008';
    END IF;
    INSERT INTO pgfence.fence_resets (resource, from_token, to_token, reason) VALUES (p_resource, v_old, p_token, p_reason);
    UPDATE pgfence.fences f SET token = p_token, trace_id = pgfence.current_trace_id()
     WHERE f.resource = p_resource COLLATE pg_catalog."default";
    RETURN v_old;
END;
$$;

--
-- Name: max_stored_token(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.max_stored_token() RETURNS bigint
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT greatest((SELECT max(token) FROM pgfence.fences),
                    (SELECT max(token) FROM pgfence.leases),
                    (SELECT max(token) FROM pgfence.lease_events),
                    (SELECT greatest(floor, retention) FROM pgfence.token_floor),
                    0);
$$;

--
-- Name: max_token(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.max_token() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 6917529027641081856::bigint $$;

--
-- Name: may_use(text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.may_use(p_name text) RETURNS boolean
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_role name := pgfence.acting_role();
BEGIN
    -- current_user is this function's owner, the schema's owner: it (and
    -- so a superuser) may use every name.
    IF pg_has_role(v_role, current_user, 'USAGE') THEN
        RETURN true;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pgfence.prefix_grants g
                    WHERE starts_with(p_name COLLATE pg_catalog."default", g.prefix) AND pg_has_role(v_role, g.grantee, 'USAGE'));
END;
$$;

--
-- Name: may_use_under(text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.may_use_under(p_prefix text) RETURNS boolean
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_role name := pgfence.acting_role();
BEGIN
    IF pg_has_role(v_role, current_user, 'USAGE') THEN
        RETURN true;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pgfence.prefix_grants g
                    WHERE (starts_with(p_prefix COLLATE pg_catalog."default", g.prefix) OR starts_with(g.prefix, p_prefix COLLATE pg_catalog."default"))
                      AND pg_has_role(v_role, g.grantee, 'USAGE'));
END;
$$;

--
-- Name: next_token(bigint); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.next_token(previous bigint) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_floor bigint;
    v_next  bigint;
BEGIN
    SELECT greatest(f.floor, f.retention) INTO v_floor FROM pgfence.token_floor f;
    v_next := greatest(coalesce(previous, 0) + 1, (pgfence.token_epoch() << 40) + 1, v_floor + 1);
    IF v_next > pgfence.max_token() THEN
        RAISE EXCEPTION 'pgfence: the next token % would exceed the largest token %', v_next, pgfence.max_token()
            USING ERRCODE = 'PF008';
    END IF;
    RETURN v_next;
END;
$$;

--
-- Name: pause_grants(text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.pause_grants(p_prefix text, p_reason text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_was boolean;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_prefix IS NULL OR octet_length(p_prefix) > 512 THEN
        RAISE EXCEPTION 'pgfence: pause_grants prefix must be 0 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF p_reason IS NULL OR length(p_reason) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgfence: pause_grants needs a reason of 1 to 1000 characters' USING ERRCODE = 'PF008';
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    PERFORM 1 FROM pgfence.grant_pauses g WHERE g.prefix = p_prefix COLLATE pg_catalog."default" FOR UPDATE;
    v_was := FOUND;
    INSERT INTO pgfence.grant_pauses AS g (prefix, reason) VALUES (p_prefix, p_reason)
        ON CONFLICT (prefix) DO UPDATE SET reason = excluded.reason, paused_by = excluded.paused_by;
    INSERT INTO pgfence.grant_pause_events (prefix, action, reason) VALUES (p_prefix, 'paused', p_reason);
    RETURN NOT v_was;
END;
$$;

--
-- Name: protect(regclass, text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.protect(relation regclass, resource_column text, prefix text DEFAULT ''::text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    child   regclass;
    guarded text;
BEGIN
    IF relation IS NULL OR resource_column IS NULL OR prefix IS NULL OR octet_length(prefix) > 512 THEN
        RAISE EXCEPTION 'pgfence: protect: relation, resource_column and a prefix of at most 512 bytes are required' USING ERRCODE = 'PF008';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a
                    WHERE a.attrelid = relation AND a.attname = resource_column AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'pgfence: protect: % has no column %', relation, quote_ident(resource_column) USING ERRCODE = 'PF008';
    END IF;
    -- The resource is the column's text. A timestamptz, float or interval
    -- prints differently under each session's TimeZone, extra_float_digits or
    -- IntervalStyle, so one row would be several resources, fenced apart.
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                    WHERE a.attrelid = relation AND a.attname = resource_column AND a.attnum > 0 AND NOT a.attisdropped
                      AND (CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END)
                          IN ('text'::regtype, 'varchar'::regtype, 'int2'::regtype,
                              'int4'::regtype, 'int8'::regtype, 'uuid'::regtype)) THEN
        RAISE EXCEPTION 'pgfence: protect: column % of % must be text, varchar, smallint, integer, bigint or uuid (or a domain over one)',
                quote_ident(resource_column), relation
            USING ERRCODE = 'PF008',
                  HINT = 'The guard names a row''s resource by the column''s text: char(n) pads it, numeric keeps its scale, and timestamptz, float or interval print by session settings, so one row would be several resources. Fence a text or integer key column.';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
                WHERE a.attrelid = relation AND a.attname = resource_column AND NOT c.collisdeterministic) THEN
        RAISE EXCEPTION 'pgfence: protect: column % of % has a nondeterministic collation',
                quote_ident(resource_column), relation
            USING ERRCODE = 'PF008',
                  HINT = 'Equal keys of such a collation have several texts (''ALICE'' and ''Alice''), so one row would be several resources. Use a deterministic collation, or fence a normalised key column.';
    END IF;
    -- The tables it guards: relation and every table below it, listed in
    -- the row guard's arguments (see guard).
    WITH RECURSIVE tree(relid) AS (
        SELECT relation::oid
        UNION
        SELECT i.inhrelid FROM tree t JOIN pg_inherits i ON i.inhparent = t.relid
    )
    SELECT ',' || string_agg(t.relid::text, ',') || ',' INTO guarded
      FROM tree t JOIN pg_class c ON c.oid = t.relid WHERE c.relkind IN ('r', 'p');
    -- The row guard runs AFTER the row is written, at the end of the
    -- statement, on the row as stored: after every BEFORE trigger (one that
    -- changed the resource column ran after a BEFORE guard, and moved the
    -- row past the check) and after generated columns are computed (a BEFORE
    -- guard saw NULL in them). Raising there undoes the statement.
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', relation);
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', relation);
    EXECUTE format('CREATE TRIGGER pgfence_guard AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.guard(%L, %L, %L)',
                   relation, resource_column, prefix, guarded);
    EXECUTE format('CREATE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION pgfence.reject_truncate()',
                   relation);
    -- Every table below it. A partition gets the row guard from its parent
    -- (PostgreSQL clones row triggers) but TRUNCATE of the partition itself
    -- skips the parent's statement trigger; an inheritance child gets no
    -- trigger at all.
    FOR child IN
        WITH RECURSIVE tree(relid) AS (
            SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = relation
            UNION
            SELECT i.inhrelid FROM tree t JOIN pg_inherits i ON i.inhparent = t.relid
        )
        SELECT t.relid::regclass FROM tree t JOIN pg_class c ON c.oid = t.relid WHERE c.relkind IN ('r', 'p')
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_trigger x
                        WHERE x.tgrelid = child AND x.tgname = 'pgfence_guard' AND x.tgparentid <> 0) THEN
            EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', child);
            EXECUTE format('CREATE TRIGGER pgfence_guard AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.guard(%L, %L, %L)',
                           child, resource_column, prefix, guarded);
        END IF;
        EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', child);
        EXECUTE format('CREATE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION pgfence.reject_truncate()',
                       child);
    END LOOP;
END;
$$;

--
-- Name: protected_tables(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.protected_tables() RETURNS TABLE(relation regclass, resource_column text, prefix text)
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT t.tgrelid::regclass,
           convert_from(substring(t.tgargs FROM 1 FOR greatest(a.sep1 - 1, 0)), current_setting('server_encoding')),
           convert_from(substring(a.rest FROM 1 FOR greatest(position('\x00'::bytea IN a.rest) - 1, 0)), current_setting('server_encoding'))
      FROM pg_catalog.pg_trigger t
     CROSS JOIN LATERAL (SELECT position('\x00'::bytea IN t.tgargs) AS sep1,
                                substring(t.tgargs FROM position('\x00'::bytea IN t.tgargs) + 1) AS rest) a
     WHERE t.tgname = 'pgfence_guard' AND t.tgfoid = 'pgfence.guard()'::regprocedure
       AND (has_table_privilege(t.tgrelid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
            OR pg_has_role('pgfence_operator', 'USAGE')
            OR pg_has_role((SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgfence'), 'USAGE'))
     ORDER BY t.tgrelid::regclass::text;
$$;

--
-- Name: prune_fence_rejections(interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.prune_fence_rejections(p_max_age interval DEFAULT '7 days'::interval) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_deleted bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_max_age IS NULL OR p_max_age < interval '0' THEN
        RAISE EXCEPTION 'pgfence: prune_fence_rejections max_age must be >= 0, got %', p_max_age
            USING ERRCODE = 'PF008';
    END IF;
    WITH oldest AS (
        SELECT r.id, r.at FROM pgfence.fence_rejections r ORDER BY r.id LIMIT 1000)
    DELETE FROM pgfence.fence_rejections r
     USING oldest o
     WHERE r.id = o.id AND o.at < clock_timestamp() - p_max_age;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END;
$$;

--
-- Name: prune_lease_events(text, integer); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.prune_lease_events(p_key text DEFAULT NULL::text, p_keep integer DEFAULT 100) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n bigint;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_keep IS NULL OR p_keep < 0 THEN
        RAISE EXCEPTION 'pgfence: prune_lease_events keep must be >= 0, got %', p_keep
            USING ERRCODE = 'PF008';
    END IF;
    IF p_key IS NOT NULL THEN
        PERFORM pgfence.lease_check_args(p_key, NULL, NULL);
    END IF;
    IF p_key IS NULL THEN
        WITH ranked AS (
            SELECT e.id, row_number() OVER (PARTITION BY e.key ORDER BY e.id DESC) AS rn
            FROM pgfence.lease_events e
        )
        DELETE FROM pgfence.lease_events e
        USING ranked r
        WHERE e.id = r.id AND r.rn > p_keep;
    ELSIF p_keep = 0 THEN
        DELETE FROM pgfence.lease_events e WHERE e.key = p_key COLLATE pg_catalog."default";
    ELSE
        -- One key (every 32nd grant prunes its own key): the events older
        -- than its p_keep-th newest, found from the newest end of the
        -- (key, id) index, whatever the size of the table.
        DELETE FROM pgfence.lease_events e
         WHERE e.key = p_key COLLATE pg_catalog."default"
           AND e.id < (SELECT x.id FROM pgfence.lease_events x WHERE x.key = p_key COLLATE pg_catalog."default"
                        ORDER BY x.id DESC OFFSET p_keep - 1 LIMIT 1);
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

--
-- Name: prune_retired(integer); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.prune_retired(p_batch integer DEFAULT 1000) RETURNS TABLE(leases bigint, events bigint, fences bigint, waiters bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_floor   bigint;
    v_retired bigint;
    v_leases  bigint;
    v_events  bigint;
    v_fences  bigint;
    v_waiters bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'pgfence: prune_retired batch must be 1 to 100000, got %', p_batch USING ERRCODE = 'PF008';
    END IF;
    SELECT f.floor, greatest(f.floor, f.retention) INTO v_floor, v_retired FROM pgfence.token_floor f;
    WITH gone AS (
        DELETE FROM pgfence.leases l
         WHERE l.key IN (SELECT x.key FROM pgfence.leases x
                          WHERE x.token <= v_retired
                            AND least(x.released_at, x.expires_at) <= clock_timestamp()
                                - CASE WHEN x.token <= v_floor THEN interval '0' ELSE interval '1 hour' END
                          LIMIT p_batch FOR UPDATE SKIP LOCKED)
        RETURNING l.key)
    SELECT count(*) INTO v_leases FROM gone;
    WITH gone AS (
        DELETE FROM pgfence.lease_events e
         WHERE e.id IN (SELECT x.id FROM pgfence.lease_events x
                         WHERE x.token <= v_retired AND NOT EXISTS (SELECT 1 FROM pgfence.leases l WHERE l.key = x.key)
                         LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) INTO v_events FROM gone;
    WITH gone AS (
        DELETE FROM pgfence.fences f
         WHERE f.resource IN (SELECT x.resource FROM pgfence.fences x
                               WHERE x.token <= v_retired
                                 AND (x.token <= v_floor OR x.accepted_at <= clock_timestamp() - interval '1 hour')
                               LIMIT p_batch FOR UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*) INTO v_fences FROM gone;
    WITH gone AS (
        DELETE FROM pgfence.lease_waiters w
         WHERE (w.key, w.waiter) IN (SELECT x.key, x.waiter FROM pgfence.lease_waiters x
                                      WHERE x.expires_at <= clock_timestamp() LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) INTO v_waiters FROM gone;
    RETURN QUERY SELECT v_leases, v_events, v_fences, v_waiters;
END;
$$;

--
-- Name: prune_tasks(interval, integer); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.prune_tasks(p_older_than interval, p_batch integer DEFAULT 1000) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_n bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_older_than IS NULL OR p_older_than < interval '0' OR p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'pgfence: prune_tasks needs an age of at least 0 and a batch from 1 to 100000' USING ERRCODE = 'PF008';
    END IF;
    DELETE FROM pgfence.tasks t WHERE t.id IN (
        SELECT x.id FROM pgfence.tasks x
         WHERE x.state IN ('done', 'failed', 'skipped') AND x.finished_at < clock_timestamp() - p_older_than
           AND NOT EXISTS (SELECT 1 FROM pgfence.task_keys k WHERE k.blocked_by = x.id)
         LIMIT p_batch);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

--
-- Name: raise_grants_paused(text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.raise_grants_paused(p_key text) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    p pgfence.grant_pauses%ROWTYPE;
BEGIN
    SELECT g.* INTO p FROM pgfence.grant_pauses g
     WHERE starts_with(p_key COLLATE pg_catalog."default", g.prefix)
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

--
-- Name: raise_if_abandoned(text, text, uuid); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.raise_if_abandoned(p_kind text, p_name text, p_id uuid) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    a pgfence.abandoned_requests%ROWTYPE;
BEGIN
    SELECT r.* INTO a FROM pgfence.abandoned_requests r
     WHERE r.id = p_id AND r.kind = p_kind AND r.name = p_name COLLATE pg_catalog."default";
    IF FOUND THEN
        RAISE EXCEPTION 'pgfence: % % of % was abandoned by its client at % and is refused', p_kind, p_id, quote_literal(p_name), a.abandoned_at
            USING ERRCODE = 'PF013',
                  DETAIL = format('id=%s abandoned_at=%s', p_id, a.abandoned_at),
                  HINT = 'Its client lost the reply and was told it did not happen; it arrived late.';
    END IF;
END;
$$;

--
-- Name: raise_not_slot_run(text, text, bigint); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.raise_not_slot_run(p_key text, p_slot text, p_token bigint) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s pgfence.job_slots%ROWTYPE;
BEGIN
    SELECT x.* INTO s FROM pgfence.job_slots x WHERE x.key = p_key COLLATE pg_catalog."default" AND x.slot = p_slot;
    IF NOT FOUND OR s.runs = 0 THEN
        RAISE EXCEPTION 'pgfence: slot % of job % was never begun', pg_catalog.quote_literal(p_slot), pg_catalog.quote_literal(p_key)
            USING ERRCODE = 'PF002', DETAIL = pg_catalog.format('reason=slot_not_begun key=%s', p_key);
    ELSIF s.completed_at IS NOT NULL AND s.token = p_token THEN
        RAISE EXCEPTION 'pgfence: slot % of job % was already completed at % by this run (token %)',
                pg_catalog.quote_literal(p_slot), pg_catalog.quote_literal(p_key), s.completed_at, p_token
            USING ERRCODE = 'PF002', DETAIL = pg_catalog.format('reason=slot_completed token=%s key=%s', s.token, p_key),
                  HINT = 'A completed slot takes no more checkpoints.';
    ELSIF s.completed_at IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: slot % of job % was completed at % by the run of token %, not %',
                pg_catalog.quote_literal(p_slot), pg_catalog.quote_literal(p_key), s.completed_at, s.token, p_token
            USING ERRCODE = 'PF002', DETAIL = pg_catalog.format('reason=slot_completed token=%s key=%s', s.token, p_key);
    ELSE
        -- The lease's current token (the callers checked it) is newer than the
        -- slot's: an earlier grant's run was left unfinished.
        RAISE EXCEPTION 'pgfence: slot % of job % was begun by the run of token %, not by this one (token %)',
                pg_catalog.quote_literal(p_slot), pg_catalog.quote_literal(p_key), s.token, p_token
            USING ERRCODE = 'PF002', DETAIL = pg_catalog.format('reason=slot_taken_over token=%s key=%s', s.token, p_key),
                  HINT = 'Call pgfence.job_slot_begin to take the unfinished run over.';
    END IF;
END;
$$;

--
-- Name: raise_token_floor(bigint, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.raise_token_floor(new_floor bigint, reason text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    old_floor bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF new_floor IS NULL OR new_floor < 0 OR new_floor > 4611686018427387904 THEN
        RAISE EXCEPTION 'pgfence: new_floor must be 0 to 4611686018427387904 (2^62), got %', coalesce(new_floor::text, 'NULL')
            USING ERRCODE = 'PF008';
    END IF;
    IF reason IS NULL OR length(reason) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgfence: reason must be 1 to 1000 characters' USING ERRCODE = 'PF008';
    END IF;
    PERFORM set_config('synchronous_commit', 'on', true);
    SELECT f.floor INTO old_floor FROM pgfence.token_floor f FOR UPDATE;
    IF new_floor < old_floor THEN
        RAISE EXCEPTION 'pgfence: the token floor is % and may only be raised, not lowered to %', old_floor, new_floor
            USING ERRCODE = 'PF009', DETAIL = format('floor=%s presented=%s', old_floor, new_floor);
    END IF;
    IF new_floor > old_floor THEN
        UPDATE pgfence.token_floor SET floor = new_floor, raised_at = clock_timestamp(), reason = raise_token_floor.reason;
    END IF;
    RETURN old_floor;
END;
$$;

--
-- Name: record_fence_rejection(text, bigint, bigint, text, text, text, uuid, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.record_fence_rejection(p_resource text, p_presented_token bigint, p_accepted_token bigint, p_reason text, p_lease_reason text DEFAULT NULL::text, p_operation text DEFAULT NULL::text, p_op uuid DEFAULT NULL::uuid, p_trace_id text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    v_id bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 OR p_presented_token IS NULL
       OR p_reason IS NULL OR p_reason NOT IN ('stale_token', 'lease_not_held', 'token_not_issued') THEN
        RAISE EXCEPTION 'pgfence: record_fence_rejection needs a resource, the presented token and a reason (stale_token, lease_not_held or token_not_issued)'
            USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.require_granted('resource', p_resource);
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    INSERT INTO pgfence.fence_rejections
           (resource, presented_token, accepted_token, reason, lease_reason, operation, op, trace_id)
    VALUES (left(p_resource, 1024), p_presented_token, nullif(p_accepted_token, 0), p_reason,
            CASE WHEN p_lease_reason IN ('missing', 'taken_over', 'released', 'expired') THEN p_lease_reason END,
            left(p_operation, 64), p_op,
            CASE WHEN p_trace_id ~ '^[0-9a-f]{32}$' AND p_trace_id <> '00000000000000000000000000000000'
                 THEN p_trace_id ELSE pgfence.current_trace_id() END)
    RETURNING id INTO v_id;
    IF v_id % 128 = 0 THEN
        PERFORM pgfence.prune_fence_rejections();
    END IF;
END;
$_$;

--
-- Name: reject_fence_change(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.reject_fence_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.token <= (SELECT greatest(f.floor, f.retention) FROM pgfence.token_floor f) THEN
            RETURN OLD;
        END IF;
    ELSIF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'pgfence: token for resource % may not be lowered from % to %', OLD.resource, OLD.token, NEW.token
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', OLD.token, NEW.token, OLD.resource);
    END IF;
    RAISE EXCEPTION 'pgfence: accepted tokens may not be deleted (%)', TG_OP
        USING ERRCODE = 'PF001',
              HINT = 'Fence rows are the memory of the highest accepted token; deleting them would let stale writers in.';
END;
$$;

--
-- Name: reject_truncate(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.reject_truncate() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'pgfence: TRUNCATE of protected table %.% is not fenced', TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'PF006',
              HINT = 'Unprotect the table first (pgfence.unprotect).';
END;
$$;

--
-- Name: release(text, uuid, bigint, boolean); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.release(p_key text, p_holder uuid, p_token bigint, p_durable boolean DEFAULT true) RETURNS TABLE(released boolean, status text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    -- takes what set_config and pg_notify return: an assignment is evaluated
    -- as a simple expression, a PERFORM as a query through the executor
    v_set    text;
    cur       pgfence.leases%ROWTYPE;
    v_expired boolean;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 THEN
        PERFORM pgfence.lease_check_args(p_key, NULL, NULL);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('lease', p_key);
    END IF;
    IF p_holder IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION 'pgfence: release of lease % needs a holder and a token', p_key
            USING ERRCODE = 'PF008';
    END IF;
    IF p_token IS NULL OR p_token <= 0 OR p_token > 6917529027641081856 THEN
        PERFORM pgfence.check_token(p_token);
    END IF;

    IF p_durable IS NOT FALSE THEN
        IF current_setting('synchronous_commit') IN ('off', 'local') THEN
            v_set := set_config('synchronous_commit', 'on', true);
        END IF;
    ELSIF pg_current_xact_id_if_assigned() IS NULL THEN
        v_set := set_config('synchronous_commit', 'off', true);
    END IF;

    -- Only identity predicates: holder and token change only when the row is
    -- modified, and a modified row is re-checked after the lock wait.
    UPDATE pgfence.leases l
       SET released_at = greatest(clock_timestamp(), l.granted_at)
     WHERE l.key = p_key COLLATE pg_catalog."default" AND l.holder = p_holder AND l.token = p_token AND l.released_at IS NULL
    RETURNING l.expires_at <= clock_timestamp() INTO v_expired;

    IF v_expired IS NOT NULL THEN
        INSERT INTO pgfence.lease_events (key, event, holder, token, reason)
        VALUES (p_key, 'released', p_holder, p_token,
                CASE WHEN v_expired THEN 'released after expiry' END);
        v_set := pg_notify('pgfence_lease_released', p_key);
        RETURN QUERY SELECT true, CASE WHEN v_expired THEN 'expired' ELSE 'released' END;
        RETURN;
    END IF;

    SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key COLLATE pg_catalog."default";
    IF cur.key IS NOT NULL AND cur.holder = p_holder AND cur.token = p_token THEN
        RETURN QUERY SELECT false, 'already_released'::text;
    ELSE
        RETURN QUERY SELECT false, 'not_held'::text;
    END IF;
END;
$$;

--
-- Name: renew(text, uuid, bigint, interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.renew(p_key text, p_holder uuid, p_token bigint, p_ttl interval) RETURNS TABLE(token bigint, expires_at timestamp with time zone, remaining interval)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    cur   pgfence.leases%ROWTYPE;
    v_exp timestamptz;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512
       OR p_ttl < interval '1 millisecond' OR p_ttl > pgfence.lease_max_ttl() THEN
        PERFORM pgfence.lease_check_args(p_key, p_ttl, NULL);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('lease', p_key);
    END IF;
    IF p_ttl IS NULL OR p_holder IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION 'pgfence: renew of lease % needs a holder, a token and a ttl', p_key
            USING ERRCODE = 'PF008';
    END IF;
    IF p_token IS NULL OR p_token <= 0 OR p_token > 6917529027641081856 THEN
        PERFORM pgfence.check_token(p_token);
    END IF;

    SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key COLLATE pg_catalog."default" FOR UPDATE;
    IF cur.key IS NULL OR cur.holder <> p_holder OR cur.token <> p_token THEN
        RAISE EXCEPTION 'pgfence: lease % is not held by holder % with token %', p_key, p_holder, p_token
            USING ERRCODE = 'PF002',
                  DETAIL = CASE WHEN cur.key IS NULL THEN 'The lease does not exist.'
                                WHEN cur.token > p_token THEN format('The lease was granted again since (token %s).', cur.token)
                                WHEN cur.token = p_token THEN format('Grant %s of this lease belongs to another holder.', cur.token)
                                ELSE format('The lease never issued token %s (its newest is %s).', p_token, cur.token) END;
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
     WHERE l.key = p_key COLLATE pg_catalog."default"
    RETURNING l.expires_at INTO v_exp;

    RETURN QUERY SELECT p_token, v_exp, greatest(v_exp - clock_timestamp(), interval '0');
END;
$$;

--
-- Name: require_granted(text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.require_granted(p_what text, p_name text) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- A missing name is the argument checks' to refuse (PF008).
    IF p_name IS NOT NULL AND NOT pgfence.may_use(p_name) THEN
        RAISE EXCEPTION 'pgfence: role % may not use % %: no prefix of it is granted to the role', pgfence.acting_role(), p_what, quote_literal(p_name)
            USING ERRCODE = 'PF014',
                  DETAIL = format('role=%s name=%s', pgfence.acting_role(), p_name),
                  HINT = 'An operator grants a role the prefixes it may use: SELECT pgfence.grant_prefix(role, prefix).';
    END IF;
END;
$$;

--
-- Name: require_lease(text, uuid, bigint, boolean); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.require_lease(p_key text, p_holder uuid, p_token bigint, p_for_update boolean DEFAULT false) RETURNS pgfence.leases
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    l pgfence.leases%ROWTYPE;
BEGIN
    IF p_for_update THEN
        SELECT * INTO l FROM pgfence.leases x WHERE x.key = p_key COLLATE pg_catalog."default" FOR UPDATE;
    ELSE
        SELECT * INTO l FROM pgfence.leases x WHERE x.key = p_key COLLATE pg_catalog."default" FOR SHARE;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: lease % is not held: no such lease', pg_catalog.quote_literal(p_key)
            USING ERRCODE = 'PF002', DETAIL = pg_catalog.format('reason=missing key=%s', p_key);
    END IF;
    IF l.holder <> p_holder OR l.token <> p_token THEN
        RAISE EXCEPTION 'pgfence: lease % is not held by % with token %: now holder % token %',
                pg_catalog.quote_literal(p_key), p_holder, p_token, l.holder, l.token
            USING ERRCODE = 'PF002', DETAIL = pg_catalog.format('reason=taken_over token=%s key=%s', l.token, p_key);
    END IF;
    IF l.released_at IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: lease % with token % was released at %', pg_catalog.quote_literal(p_key), l.token, l.released_at
            USING ERRCODE = 'PF002', DETAIL = pg_catalog.format('reason=released key=%s', p_key);
    END IF;
    IF l.expires_at <= pg_catalog.clock_timestamp() THEN
        RAISE EXCEPTION 'pgfence: lease % with token % expired at %', pg_catalog.quote_literal(p_key), l.token, l.expires_at
            USING ERRCODE = 'PF002', DETAIL = pg_catalog.format('reason=expired key=%s', p_key);
    END IF;
    RETURN l;
END;
$$;

--
-- Name: require_primary(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.require_primary() RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'pgfence: the server is in recovery (a standby); leases, tokens and fences are decided by the primary only'
            USING ERRCODE = 'PF005',
                  HINT = 'Connect to the current primary (target_session_attrs=read-write).';
    END IF;
END;
$$;

--
-- Name: resume_grants(text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.resume_grants(p_prefix text, p_reason text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgfence.require_primary();
    IF p_prefix IS NULL OR octet_length(p_prefix) > 512 THEN
        RAISE EXCEPTION 'pgfence: resume_grants needs a prefix of 0 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF p_reason IS NOT NULL AND length(p_reason) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgfence: resume_grants reason must be 1 to 1000 characters' USING ERRCODE = 'PF008';
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    DELETE FROM pgfence.grant_pauses g WHERE g.prefix = p_prefix COLLATE pg_catalog."default";
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

--
-- Name: revoke_prefix(regrole, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.revoke_prefix(p_role regrole, p_prefix text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgfence.require_primary();
    IF p_role IS NULL OR p_prefix IS NULL OR octet_length(p_prefix) > 512 THEN
        RAISE EXCEPTION 'pgfence: revoke_prefix needs a role and a prefix of at most 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    DELETE FROM pgfence.prefix_grants g WHERE g.grantee = p_role AND g.prefix = p_prefix COLLATE pg_catalog."default";
    RETURN FOUND;
END;
$$;

--
-- Name: set_holder_info(text, uuid, bigint, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.set_holder_info(p_key text, p_holder uuid, p_token bigint, p_holder_info text) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    l     pgfence.leases%ROWTYPE;
    v_now timestamptz;
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.lease_check_args(p_key, NULL, p_holder_info);
    PERFORM pgfence.require_granted('lease', p_key);
    IF p_holder IS NULL OR p_token IS NULL OR p_holder_info IS NULL THEN
        RAISE EXCEPTION 'pgfence: set_holder_info of lease % needs a holder, a token and a holder_info', p_key
            USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.check_token(p_token);
    l := pgfence.require_lease(p_key, p_holder, p_token, true);

    IF pg_catalog.current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    v_now := pg_catalog.clock_timestamp();
    UPDATE pgfence.leases x SET holder_info = p_holder_info WHERE x.key = p_key COLLATE pg_catalog."default";
    DELETE FROM pgfence.lease_events e
     WHERE e.key = p_key COLLATE pg_catalog."default" AND e.event = 'info_changed' AND e.holder = p_holder AND e.token = p_token;
    INSERT INTO pgfence.lease_events (key, event, holder, token, at, holder_info)
    VALUES (p_key, 'info_changed', p_holder, p_token, v_now, p_holder_info);
    PERFORM pg_catalog.pg_notify('pgfence_lease_changed',
        'info_changed:' || ((EXTRACT(epoch FROM l.expires_at - v_now) * 1000000)::bigint)::text || ':' || p_key);
    RETURN v_now;
END;
$$;

--
-- Name: task_check_key(text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_check_key(p_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 480 THEN
        RAISE EXCEPTION 'pgfence: task key must be 1 to 480 bytes, got %',
            coalesce(octet_length(p_key)::text || ' bytes', 'NULL') USING ERRCODE = 'PF008';
    END IF;
END;
$$;

--
-- Name: task_claim(text, uuid, bigint, integer, integer, boolean); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_claim(p_key text, p_holder uuid, p_token bigint, p_max_tasks integer DEFAULT 100, p_max_attempts integer DEFAULT 5, p_ordered boolean DEFAULT true) RETURNS TABLE(id bigint, seq bigint, payload jsonb, attempts integer, idem_key text, enqueued_at timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_fresh  boolean := pg_current_xact_id_if_assigned() IS NULL;
    v_s      bigint;
    v_x      xid8;
    v_now    timestamptz;
    v_n      bigint;
    v_failed bigint;
    v_ids    bigint[];
    v_base   bigint;
    v_to     bigint;
    k        pgfence.task_keys%ROWTYPE;
BEGIN
    -- A standby first: it cannot assign the mark's xid, and must say PF005.
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    -- The new mark: S first, then an xid assigned after reading it.
    IF v_fresh THEN
        SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO v_s FROM pgfence.task_ids s;
        v_x := pg_current_xact_id();
    END IF;
    PERFORM pgfence.task_require_consumer(p_key, p_holder, p_token);
    IF p_max_tasks IS NULL OR p_max_tasks NOT BETWEEN 1 AND 10000
       OR p_max_attempts IS NULL OR p_max_attempts NOT BETWEEN 1 AND 100 OR p_ordered IS NULL THEN
        RAISE EXCEPTION 'pgfence: task_claim needs max_tasks from 1 to 10000, max_attempts from 1 to 100 and ordered, got %, %, %',
            coalesce(p_max_tasks::text, 'NULL'), coalesce(p_max_attempts::text, 'NULL'), coalesce(p_ordered::text, 'NULL')
            USING ERRCODE = 'PF008';
    END IF;

    INSERT INTO pgfence.task_keys (key) VALUES (p_key) ON CONFLICT DO NOTHING;
    SELECT x.* INTO k FROM pgfence.task_keys x WHERE x.key = p_key COLLATE pg_catalog."default" FOR UPDATE;
    -- The watermark: once every transaction that drew an id <= mark_id has
    -- ended, every task up to it is committed (and visible to the next
    -- statement) or rolled back, so it is numbered by this claim or never:
    -- later scans of unnumbered tasks start above it.
    IF k.mark_id IS NOT NULL AND pg_snapshot_xmin(pg_current_snapshot()) > k.mark_xid THEN
        v_to := k.mark_id;
        k.mark_id := NULL;
        k.mark_xid := NULL;
    END IF;
    -- Number every committed task not numbered yet, in id order, from
    -- next_seq: a task whose enqueue commits later is numbered by a later
    -- claim, higher. The ids are read once, so that the count and the
    -- numbers below are of one set; only this consumer, holding the key's
    -- row, changes an unnumbered task.
    SELECT array_agg(x.id ORDER BY x.id) INTO v_ids FROM pgfence.tasks x
     WHERE x.key = p_key COLLATE pg_catalog."default" AND x.seq IS NULL AND x.id > k.numbered_to AND x.state = 'pending';
    v_base := k.next_seq;
    k.next_seq := k.next_seq + coalesce(cardinality(v_ids), 0);
    k.numbered_to := greatest(k.numbered_to, v_to);
    IF k.mark_id IS NULL AND v_fresh THEN
        k.mark_id := v_s;
        k.mark_xid := v_x;
    END IF;
    UPDATE pgfence.task_keys x SET next_seq = k.next_seq, numbered_to = k.numbered_to, mark_id = k.mark_id, mark_xid = k.mark_xid,
           ordered = p_ordered, max_attempts = p_max_attempts, claimed_at = clock_timestamp()
     WHERE x.key = p_key COLLATE pg_catalog."default";

    -- Tasks an earlier grant left running: its consumer stopped mid-batch.
    v_now := clock_timestamp();
    WITH i AS (
        UPDATE pgfence.tasks t
           SET attempts = t.attempts + 1,
               state = CASE WHEN t.attempts + 1 >= p_max_attempts THEN 'failed' ELSE 'pending' END,
               finished_at = CASE WHEN t.attempts + 1 >= p_max_attempts THEN v_now END,
               error = format('interrupted: the consumer with token %s stopped while applying it', t.token)
         WHERE t.key = p_key COLLATE pg_catalog."default" AND t.state = 'running' AND t.token <> p_token
        RETURNING t.id, t.seq, t.state)
    SELECT (array_agg(i.id ORDER BY i.seq))[1], count(*) INTO v_failed, v_n FROM i WHERE i.state = 'failed';
    IF v_n > 0 THEN
        UPDATE pgfence.task_keys x SET finished = x.finished + v_n WHERE x.key = p_key COLLATE pg_catalog."default";
    END IF;
    IF p_ordered AND v_failed IS NOT NULL AND k.blocked_by IS NULL THEN
        UPDATE pgfence.task_keys x SET blocked_by = v_failed WHERE x.key = p_key COLLATE pg_catalog."default";
        k.blocked_by := v_failed;
    END IF;
    IF p_ordered AND k.blocked_by IS NOT NULL THEN
        p_max_tasks := 0; -- number, claim nothing
    END IF;

    -- Number the tasks that became safe (fresh), and claim the next tasks
    -- in seq order (ordered stops at the first one not due), in one write
    -- of each task.
    RETURN QUERY
    WITH fresh AS (
        SELECT f.id, v_base + f.n - 1 AS seq FROM unnest(v_ids) WITH ORDINALITY AS f(id, n)
    ), c AS (
        ((SELECT x.id, x.seq, x.not_before FROM pgfence.tasks x
           WHERE x.key = p_key COLLATE pg_catalog."default" AND x.state IN ('pending', 'running') AND x.seq IS NOT NULL
           ORDER BY x.seq LIMIT p_max_tasks)
          UNION ALL
         SELECT f.id, f.seq, NULL::timestamptz FROM fresh f)
         ORDER BY seq LIMIT p_max_tasks
    ), due AS (
        SELECT c.id FROM c
         WHERE (c.not_before IS NULL OR c.not_before <= v_now)
           AND (NOT p_ordered OR c.seq < coalesce((SELECT min(c2.seq) FROM c c2 WHERE c2.not_before > v_now), 9223372036854775807))
    ), w AS (
        SELECT coalesce(f.id, d.id) AS id, f.seq AS numbered, d.id IS NOT NULL AS claimed
          FROM fresh f FULL JOIN due d ON d.id = f.id
    ), u AS (
        UPDATE pgfence.tasks t
           SET seq = coalesce(w.numbered, t.seq),
               numbered_at = CASE WHEN w.numbered IS NOT NULL THEN v_now ELSE t.numbered_at END,
               state = CASE WHEN w.claimed THEN 'running' ELSE t.state END,
               token = CASE WHEN w.claimed THEN p_token ELSE t.token END,
               started_at = CASE WHEN w.claimed THEN v_now ELSE t.started_at END,
               not_before = CASE WHEN w.claimed THEN NULL ELSE t.not_before END
          FROM w WHERE t.id = w.id
        RETURNING t.id, t.seq, t.payload, t.attempts, t.idem_key, t.enqueued_at, w.claimed
    )
    SELECT u.id, u.seq, u.payload, u.attempts, u.idem_key, u.enqueued_at FROM u WHERE u.claimed;
END;
$$;

--
-- Name: task_complete(text, uuid, bigint, bigint[], jsonb[]); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_complete(p_key text, p_holder uuid, p_token bigint, p_ids bigint[], p_results jsonb[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_n integer;
BEGIN
    PERFORM pgfence.task_require_consumer(p_key, p_holder, p_token);
    IF p_ids IS NULL OR cardinality(p_ids) > 10000 OR (p_results IS NOT NULL AND cardinality(p_results) <> cardinality(p_ids)) THEN
        RAISE EXCEPTION 'pgfence: task_complete needs at most 10000 task ids and as many results (or NULL)' USING ERRCODE = 'PF008';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_results) r WHERE octet_length(r::text) > 65536) THEN
        RAISE EXCEPTION 'pgfence: a task result must be JSON of at most 65536 bytes' USING ERRCODE = 'PF008';
    END IF;
    UPDATE pgfence.tasks t SET state = 'done', result = r.result, error = NULL, finished_at = clock_timestamp()
      FROM unnest(p_ids, coalesce(p_results, array_fill(NULL::jsonb, ARRAY[cardinality(p_ids)]))) AS r(id, result)
     WHERE t.id = r.id AND t.key = p_key COLLATE pg_catalog."default" AND t.state = 'running' AND t.token = p_token;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n <> cardinality(p_ids) THEN
        RAISE EXCEPTION 'pgfence: % of % tasks of key % are not running under token %',
                cardinality(p_ids) - v_n, cardinality(p_ids), quote_literal(p_key), p_token
            USING ERRCODE = 'PF002', DETAIL = format('reason=task_not_claimed key=%s', pgfence.task_lease_key(p_key));
    END IF;
    UPDATE pgfence.task_keys x SET finished = x.finished + v_n WHERE x.key = p_key COLLATE pg_catalog."default";
    RETURN v_n;
END;
$$;

--
-- Name: task_enqueue(text, jsonb, text, integer); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_enqueue(p_key text, p_payload jsonb, p_idem_key text DEFAULT NULL::text, p_max_backlog integer DEFAULT 10000, OUT id bigint, OUT created boolean, OUT state text, OUT seq bigint, OUT enqueued_at timestamp with time zone) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_xid  xid8;
    v_id   bigint;
    v_to   bigint;
    v_open bigint;
    v_wait text;
    t      pgfence.tasks%ROWTYPE;
BEGIN
    -- Each check's cheap condition inline, its helper (the one place of its
    -- message and code) only to refuse: a call costs more than the check.
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 480 THEN
        PERFORM pgfence.task_check_key(p_key);
    END IF;
    IF p_payload IS NULL OR octet_length(p_payload::text) > 65536 THEN
        RAISE EXCEPTION 'pgfence: a task payload must be JSON of at most 65536 bytes, got %',
            coalesce(octet_length(p_payload::text)::text || ' bytes', 'NULL') USING ERRCODE = 'PF008';
    END IF;
    IF p_idem_key IS NOT NULL AND octet_length(p_idem_key) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'pgfence: a task idempotency key must be 1 to 256 bytes, got %', octet_length(p_idem_key)
            USING ERRCODE = 'PF008';
    END IF;
    IF p_max_backlog IS NULL OR p_max_backlog NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'pgfence: max_backlog must be 1 to 1000000, got %', coalesce(p_max_backlog::text, 'NULL')
            USING ERRCODE = 'PF008';
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('task key', p_key);
    END IF;

    IF p_idem_key IS NOT NULL THEN
        SELECT x.* INTO t FROM pgfence.tasks x WHERE x.key = p_key COLLATE pg_catalog."default" AND x.idem_key = p_idem_key;
        IF FOUND THEN
            PERFORM pgfence.task_same_payload(t, p_payload);
            SELECT t.id, false, t.state, t.seq, t.enqueued_at INTO id, created, state, seq, enqueued_at;
            RETURN;
        END IF;
    END IF;
    -- The xid first, then the id: see "Numbering".
    v_xid := pg_current_xact_id();
    v_id := nextval('pgfence.task_ids');
    -- The backlog: the numbered open tasks from the key's row, and at most
    -- v_id - 1 - numbered_to unnumbered ones (every unnumbered task of the
    -- key has an id above numbered_to). Only when that bound reaches
    -- max_backlog are the unnumbered ones counted: while a consumer runs
    -- they are few, and their index range holds the dead entries of every
    -- numbered task until a vacuum.
    SELECT k.next_seq - 1 - k.finished, k.numbered_to INTO v_open, v_to FROM pgfence.task_keys k WHERE k.key = p_key COLLATE pg_catalog."default";
    v_open := coalesce(v_open, 0);
    IF v_open + (v_id - 1 - coalesce(v_to, 0)) >= p_max_backlog THEN
        IF v_open < p_max_backlog THEN
            SELECT v_open + count(*) INTO v_open FROM (SELECT 1 FROM pgfence.tasks x
                WHERE x.key = p_key COLLATE pg_catalog."default" AND x.state = 'pending' AND x.seq IS NULL AND x.id > coalesce(v_to, 0)
                LIMIT p_max_backlog - v_open) o;
        END IF;
        IF v_open >= p_max_backlog THEN
            RAISE EXCEPTION 'pgfence: the backlog of task key % is full: % open tasks', quote_literal(p_key), v_open
                USING ERRCODE = 'PF016', DETAIL = format('key=%s max_backlog=%s', p_key, p_max_backlog),
                      HINT = 'Try again later, or raise max_backlog; nothing was enqueued.';
        END IF;
    END IF;

    IF p_idem_key IS NULL THEN
        INSERT INTO pgfence.tasks AS x (id, key, xid, payload, idem_key, enqueued_by, enqueued_at)
        VALUES (v_id, p_key, v_xid, p_payload, NULL, pgfence.acting_role(), clock_timestamp())
        RETURNING x.* INTO t;
    ELSE
        -- A duplicate that another open transaction is inserting is waited
        -- for (its outcome decides ours), but not without bound: that
        -- transaction may be a long business transaction.
        v_wait := current_setting('lock_timeout');
        IF v_wait = '0' OR v_wait::interval > interval '5 seconds' THEN
            PERFORM set_config('lock_timeout', '5s', true);
        END IF;
        BEGIN
            INSERT INTO pgfence.tasks AS x (id, key, xid, payload, idem_key, enqueued_by, enqueued_at)
            VALUES (v_id, p_key, v_xid, p_payload, p_idem_key, pgfence.acting_role(), clock_timestamp())
            ON CONFLICT (key, idem_key) WHERE idem_key IS NOT NULL DO NOTHING
            RETURNING x.* INTO t;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'pgfence: task idempotency key % of key % is being enqueued by a transaction that is still open', quote_literal(p_idem_key), quote_literal(p_key)
                USING ERRCODE = 'PF007', DETAIL = format('key=%s idem_key=%s waited=%s', p_key, p_idem_key, current_setting('lock_timeout')),
                      HINT = 'Enqueue again once that transaction has ended: a committed task is returned, a rolled-back one is enqueued anew. Nothing was enqueued. (A lock on pgfence.tasks held as long, by a migration say, ends the wait the same way.)';
        END;
        PERFORM set_config('lock_timeout', v_wait, true);
    END IF;
    IF t.id IS NULL THEN
        -- A concurrent duplicate committed first.
        SELECT x.* INTO t FROM pgfence.tasks x WHERE x.key = p_key COLLATE pg_catalog."default" AND x.idem_key = p_idem_key;
        PERFORM pgfence.task_same_payload(t, p_payload);
        SELECT t.id, false, t.state, t.seq, t.enqueued_at INTO id, created, state, seq, enqueued_at;
        RETURN;
    END IF;
    -- Wake a consumer up only when none holds the key: a NOTIFY serialises
    -- the commits that send one, and a consumer that holds the key claims
    -- again before it lets go.
    IF NOT EXISTS (SELECT 1 FROM pgfence.leases l
        WHERE l.key = pgfence.task_lease_key(p_key) AND l.released_at IS NULL AND l.expires_at > clock_timestamp()) THEN
        PERFORM pg_notify('pgfence_task_enqueued', p_key);
    END IF;
    SELECT t.id, true, t.state, t.seq, t.enqueued_at INTO id, created, state, seq, enqueued_at;
END;
$$;

--
-- Name: task_fail(text, uuid, bigint, bigint, text, interval); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_fail(p_key text, p_holder uuid, p_token bigint, p_id bigint, p_error text, p_retry_in interval DEFAULT NULL::interval) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    k       pgfence.task_keys%ROWTYPE;
    v_state text;
    v_now   timestamptz := clock_timestamp();
BEGIN
    PERFORM pgfence.task_require_consumer(p_key, p_holder, p_token);
    IF p_error IS NULL OR octet_length(p_error) > 4096 OR p_retry_in < interval '0' OR p_retry_in > interval '1 day' THEN
        RAISE EXCEPTION 'pgfence: task_fail needs an error of at most 4096 bytes and a retry delay from 0 to 1 day'
            USING ERRCODE = 'PF008';
    END IF;
    SELECT x.* INTO k FROM pgfence.task_keys x WHERE x.key = p_key COLLATE pg_catalog."default" FOR UPDATE;
    UPDATE pgfence.tasks t
       SET attempts = t.attempts + 1, error = p_error,
           state = CASE WHEN p_retry_in IS NOT NULL AND t.attempts + 1 < k.max_attempts THEN 'pending' ELSE 'failed' END,
           not_before = CASE WHEN p_retry_in IS NOT NULL AND t.attempts + 1 < k.max_attempts THEN v_now + p_retry_in END,
           finished_at = CASE WHEN p_retry_in IS NOT NULL AND t.attempts + 1 < k.max_attempts THEN NULL ELSE v_now END
     WHERE t.id = p_id AND t.key = p_key COLLATE pg_catalog."default" AND t.state = 'running' AND t.token = p_token
    RETURNING t.state INTO v_state;
    IF v_state IS NULL THEN
        RAISE EXCEPTION 'pgfence: task % of key % is not running under token %', p_id, quote_literal(p_key), p_token
            USING ERRCODE = 'PF002', DETAIL = format('reason=task_not_claimed key=%s', pgfence.task_lease_key(p_key));
    END IF;
    -- The rest of the batch rolled back with it, unattempted: pending again.
    UPDATE pgfence.tasks t SET state = 'pending'
     WHERE t.key = p_key COLLATE pg_catalog."default" AND t.state = 'running' AND t.token = p_token AND t.id <> p_id;
    IF v_state = 'failed' THEN
        UPDATE pgfence.task_keys x SET finished = x.finished + 1,
               blocked_by = CASE WHEN x.ordered AND x.blocked_by IS NULL THEN p_id ELSE x.blocked_by END
         WHERE x.key = p_key COLLATE pg_catalog."default";
    END IF;
    RETURN v_state;
END;
$$;

--
-- Name: task_lease_key(text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_lease_key(p_key text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT ('pgfence.task:'::text || p_key);
END;

--
-- Name: task_operator(text, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_operator(p_action text, p_reason text) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgfence.require_primary();
    IF p_reason IS NULL OR length(btrim(p_reason)) = 0 OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION 'pgfence: the reason for a task % must be 1 to 1000 characters', p_action USING ERRCODE = 'PF008';
    END IF;
    RETURN jsonb_build_object('action', p_action, 'by', pgfence.acting_role(), 'at', clock_timestamp(), 'reason', p_reason);
END;
$$;

--
-- Name: task_ready_keys(text, integer, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_ready_keys(p_prefix text DEFAULT ''::text, p_max_keys integer DEFAULT 100, p_after text DEFAULT ''::text) RETURNS SETOF text
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_upper text;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_prefix IS NULL OR octet_length(p_prefix) > 480 OR p_max_keys IS NULL OR p_max_keys NOT BETWEEN 1 AND 10000
       OR p_after IS NULL OR octet_length(p_after) > 480 THEN
        RAISE EXCEPTION 'pgfence: task_ready_keys needs a prefix and an after key of at most 480 bytes and max_keys from 1 to 10000'
            USING ERRCODE = 'PF008';
    END IF;
    -- Under a collation that sorts by code point (C, POSIX, C.UTF-8, with
    -- the UTF8 encoding, whose byte order is code point order) the keys
    -- under a prefix are the range [prefix, the prefix with its last
    -- character one higher): each probe reads the next key of the prefix.
    -- Under another they are not one range: each probe then descends to the
    -- next key with open tasks, whatever its prefix, and the prefix is
    -- tested on the keys found. (Testing it inside the probe would walk,
    -- task by task, every open task of the keys between two matches:
    -- another tenant's hot key.)
    IF p_prefix <> '' AND current_setting('server_encoding') = 'UTF8' AND ascii(right(p_prefix, 1)) < 1114111
       AND EXISTS (SELECT 1 FROM pg_database d
                    WHERE d.datname = current_database() AND coalesce(to_jsonb(d) ->> 'datlocprovider', 'c') = 'c'
                      AND lower(replace(d.datcollate, '-', '')) IN ('c', 'posix', 'c.utf8')) THEN
        v_upper := left(p_prefix, -1) || chr(CASE WHEN ascii(right(p_prefix, 1)) + 1 BETWEEN 55296 AND 57343 THEN 57344
                                                  ELSE ascii(right(p_prefix, 1)) + 1 END);
        RETURN QUERY
        WITH RECURSIVE k(key) AS (
            (SELECT t.key::text FROM pgfence.tasks t
              WHERE t.state IN ('pending', 'running') AND t.key > p_after AND t.key >= p_prefix AND t.key < v_upper
              ORDER BY t.key LIMIT 1)
            UNION ALL
            SELECT (SELECT t.key::text FROM pgfence.tasks t
                     WHERE t.state IN ('pending', 'running') AND t.key > k.key AND t.key < v_upper
                     ORDER BY t.key LIMIT 1)
              FROM k WHERE k.key IS NOT NULL
        )
        SELECT k.key FROM k WHERE k.key IS NOT NULL AND starts_with(k.key, p_prefix)
           AND pgfence.may_use(pgfence.task_lease_key(k.key)) LIMIT p_max_keys;
        RETURN;
    END IF;
    RETURN QUERY
    WITH RECURSIVE k(key) AS (
        (SELECT t.key::text FROM pgfence.tasks t
          WHERE t.state IN ('pending', 'running') AND t.key > p_after
          ORDER BY t.key LIMIT 1)
        UNION ALL
        SELECT (SELECT t.key::text FROM pgfence.tasks t
                 WHERE t.state IN ('pending', 'running') AND t.key > k.key
                 ORDER BY t.key LIMIT 1)
          FROM k WHERE k.key IS NOT NULL
    )
    SELECT k.key FROM k WHERE k.key IS NOT NULL AND starts_with(k.key, p_prefix)
       AND pgfence.may_use(pgfence.task_lease_key(k.key)) LIMIT p_max_keys;
END;
$$;

--
-- Name: task_require_consumer(text, uuid, bigint); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_require_consumer(p_key text, p_holder uuid, p_token bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 480 THEN
        PERFORM pgfence.task_check_key(p_key);
    END IF;
    IF p_holder IS NULL THEN
        RAISE EXCEPTION 'pgfence: a task consumer of % needs a holder', quote_literal(p_key) USING ERRCODE = 'PF008';
    END IF;
    IF p_token IS NULL OR p_token <= 0 OR p_token > 6917529027641081856 THEN
        PERFORM pgfence.check_token(p_token);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('lease', pgfence.task_lease_key(p_key));
    END IF;
    PERFORM pgfence.require_lease(pgfence.task_lease_key(p_key), p_holder, p_token);
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END;
$$;

--
-- Name: task_retry(bigint, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_retry(p_id bigint, p_reason text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_key text;
    v_op  jsonb := pgfence.task_operator('retry', p_reason);
BEGIN
    UPDATE pgfence.tasks t SET state = 'pending', attempts = 0, not_before = NULL, finished_at = NULL, operator = v_op
     WHERE t.id = p_id AND t.state = 'failed' RETURNING t.key INTO v_key;
    IF v_key IS NULL THEN
        RETURN false;
    END IF;
    UPDATE pgfence.task_keys x SET finished = x.finished - 1,
           blocked_by = CASE WHEN x.blocked_by = p_id THEN NULL ELSE x.blocked_by END
     WHERE x.key = v_key;
    PERFORM pg_notify('pgfence_task_enqueued', v_key);
    RETURN true;
END;
$$;

--
-- Name: tasks; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.tasks (
    id bigint NOT NULL,
    key pgfence.key_name NOT NULL,
    xid xid8 NOT NULL,
    seq bigint,
    state text DEFAULT 'pending'::text NOT NULL,
    payload jsonb NOT NULL,
    idem_key text,
    attempts integer DEFAULT 0 NOT NULL,
    not_before timestamp with time zone,
    token bigint,
    result jsonb,
    error text,
    enqueued_by name NOT NULL,
    enqueued_at timestamp with time zone NOT NULL,
    numbered_at timestamp with time zone,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    operator jsonb,
    CONSTRAINT tasks_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT tasks_check CHECK (((seq IS NOT NULL) OR (state = 'pending'::text))),
    CONSTRAINT tasks_idem_key_check CHECK (((octet_length(idem_key) >= 1) AND (octet_length(idem_key) <= 256))),
    CONSTRAINT tasks_seq_check CHECK ((seq > 0)),
    CONSTRAINT tasks_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'running'::text, 'done'::text, 'failed'::text, 'skipped'::text])))
);

--
-- Name: task_same_payload(pgfence.tasks, jsonb); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_same_payload(t pgfence.tasks, p_payload jsonb) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF t.payload <> p_payload THEN
        RAISE EXCEPTION 'pgfence: task idempotency key % of key % was used for task % with another payload',
                quote_literal(t.idem_key), quote_literal(t.key), t.id
            USING ERRCODE = 'PF004', DETAIL = format('key=%s idem_key=%s id=%s', t.key, t.idem_key, t.id);
    END IF;
END;
$$;

--
-- Name: task_skip(bigint, text); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_skip(p_id bigint, p_reason text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_key text;
    v_op  jsonb := pgfence.task_operator('skip', p_reason);
BEGIN
    UPDATE pgfence.tasks t SET state = 'skipped', operator = v_op WHERE t.id = p_id AND t.state = 'failed' RETURNING t.key INTO v_key;
    IF v_key IS NULL THEN
        RETURN false;
    END IF;
    UPDATE pgfence.task_keys x SET blocked_by = NULL WHERE x.key = v_key AND x.blocked_by = p_id;
    PERFORM pg_notify('pgfence_task_enqueued', v_key);
    RETURN true;
END;
$$;

--
-- Name: task_status(bigint); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.task_status(p_id bigint) RETURNS TABLE(id bigint, key text, state text, seq bigint, attempts integer, payload jsonb, result jsonb, error text, idem_key text, enqueued_at timestamp with time zone, numbered_at timestamp with time zone, started_at timestamp with time zone, finished_at timestamp with time zone, operator jsonb)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT t.id,
     t.key,
     t.state,
     t.seq,
     t.attempts,
     t.payload,
     t.result,
     t.error,
     t.idem_key,
     t.enqueued_at,
     t.numbered_at,
     t.started_at,
     t.finished_at,
     t.operator
    FROM pgfence.tasks t
   WHERE ((t.id = task_status.p_id) AND ((t.enqueued_by = pgfence.acting_role()) OR pg_has_role(pgfence.acting_role(), CURRENT_USER, 'USAGE'::text) OR pg_has_role(pgfence.acting_role(), 'pgfence_operator'::name, 'USAGE'::text) OR pgfence.may_use(pgfence.task_lease_key((t.key)::text))));
END;

--
-- Name: token_epoch(); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.token_epoch() RETURNS bigint
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF pg_catalog.pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    RETURN ('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
END;
$$;

--
-- Name: try_acquire(text, interval, text, uuid, text, boolean); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.try_acquire(p_key text, p_ttl interval, p_holder_info text DEFAULT ''::text, p_holder uuid DEFAULT NULL::uuid, p_client_version text DEFAULT NULL::text, p_announce boolean DEFAULT false) RETURNS TABLE(acquired boolean, holder uuid, token bigint, granted_at timestamp with time zone, expires_at timestamp with time zone, remaining interval)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    -- takes what set_config and pg_notify return: an assignment is evaluated
    -- as a simple expression, a PERFORM as a query through the executor
    v_set    text;
    cur      pgfence.leases%ROWTYPE;
    v_holder uuid := coalesce(p_holder, gen_random_uuid());
    v_token  bigint;
    v_grant  timestamptz;
    v_exp    timestamptz;
    v_probed boolean;
    v_busy   boolean := false;
    v_timeout text;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512
       OR p_ttl < interval '1 millisecond' OR p_ttl > pgfence.lease_max_ttl()
       OR octet_length(coalesce(p_holder_info, '')) > 1024 THEN
        PERFORM pgfence.lease_check_args(p_key, p_ttl, coalesce(p_holder_info, ''));
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('lease', p_key);
    END IF;
    IF p_ttl IS NULL THEN
        RAISE EXCEPTION 'pgfence: lease ttl must not be NULL' USING ERRCODE = 'PF008';
    END IF;
    IF octet_length(p_client_version) > 128 THEN
        RAISE EXCEPTION 'pgfence: client_version must be at most 128 bytes, got %', octet_length(p_client_version)
            USING ERRCODE = 'PF008';
    END IF;

    -- Kill switch: a paused prefix refuses new grants (PF011). An empty table
    -- costs one scan of an empty heap.
    IF EXISTS (SELECT 1 FROM pgfence.grant_pauses g WHERE starts_with(p_key COLLATE pg_catalog."default", g.prefix)) THEN
        PERFORM pgfence.raise_grants_paused(p_key);
    END IF;

    -- The cheap check: a plain read, no lock, no write.
    SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key COLLATE pg_catalog."default";
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

    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        v_set := set_config('synchronous_commit', 'on', true);
    END IF;

    -- The grant. A key granted before (the common case) is updated in place:
    -- under READ COMMITTED an UPDATE that meets a row changed by a concurrent
    -- grant waits for it and re-checks its WHERE on the newest version, as ON
    -- CONFLICT DO UPDATE does, and it draws one token where the upsert drew
    -- two (VALUES is evaluated before the conflict is found).
    --
    -- Contention filter, not the authority: an attempt that meets another
    -- grant in progress writes nothing and is turned away below, instead of
    -- queueing on the row and writing a failed update. A row version that
    -- no transaction locked or updated since it was written has xmax 0: it
    -- is updated at once. Any other goes to the probe below, which never
    -- waits for a grant. Row locks on pgfence.leases, and so its xmax, need
    -- UPDATE on it, which only the schema's owner has, and pgfence's
    -- functions lock a lease row only for a caller granted its key (the lock
    -- of a refused call is rolled back with it): no other role can make a
    -- key look busy.
    IF cur.key IS NOT NULL THEN
        UPDATE pgfence.leases AS l
           SET holder         = v_holder,
               token          = pgfence.next_token(l.token),
               granted_at     = clock_timestamp(),
               renewed_at     = NULL,
               expires_at     = clock_timestamp() + p_ttl,
               released_at    = NULL,
               holder_info    = coalesce(p_holder_info, ''),
               client_version = p_client_version
         WHERE l.key = p_key COLLATE pg_catalog."default" AND (l.released_at IS NOT NULL OR l.expires_at <= clock_timestamp())
           AND l.xmax = '0'::xid
        RETURNING l.token, l.granted_at, l.expires_at INTO v_token, v_grant, v_exp;
        IF v_token IS NULL THEN
            -- Refused: the row is live now, was locked or updated since it
            -- was written (its locker may still run), or was pruned. A
            -- grant, a renewal, a release or a prune holds the lock at
            -- least FOR NO KEY UPDATE, which the probe's FOR SHARE SKIP
            -- LOCKED skips: turned away. A lease-checked write
            -- holds FOR SHARE, which FOR SHARE passes: a takeover waits for
            -- the write's transaction to end, as the design promises, and
            -- then decides. The probe's share lock is given back at once
            -- (its subtransaction rolls back; the variables keep what it
            -- read): two takeovers that kept one would each wait for the
            -- other's to upgrade it, a deadlock. Without it the first
            -- takeover waits in the UPDATE below holding the row's tuple
            -- lock, and the second queues behind it and is refused.
            v_probed := false;
            BEGIN
                SELECT x.* INTO cur FROM pgfence.leases x WHERE x.key = p_key COLLATE pg_catalog."default" FOR SHARE SKIP LOCKED;
                v_probed := FOUND;
                RAISE EXCEPTION USING ERRCODE = 'PFZ99';
            EXCEPTION WHEN SQLSTATE 'PFZ99' THEN
                NULL;
            END;
            IF NOT v_probed THEN
                IF EXISTS (SELECT 1 FROM pgfence.leases x WHERE x.key = p_key COLLATE pg_catalog."default") THEN
                    RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, NULL::timestamptz, NULL::timestamptz, interval '0';
                    RETURN;
                END IF;
                -- Pruned: a first grant again, below.
            ELSIF cur.released_at IS NULL AND cur.expires_at > clock_timestamp() THEN
                -- Another grant won since the read, and committed.
                RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, NULL::timestamptz, cur.expires_at,
                                    greatest(cur.expires_at - clock_timestamp(), interval '0');
                RETURN;
            ELSE
                UPDATE pgfence.leases AS l
                   SET holder         = v_holder,
                       token          = pgfence.next_token(l.token),
                       granted_at     = clock_timestamp(),
                       renewed_at     = NULL,
                       expires_at     = clock_timestamp() + p_ttl,
                       released_at    = NULL,
                       holder_info    = coalesce(p_holder_info, ''),
                       client_version = p_client_version
                 WHERE l.key = p_key COLLATE pg_catalog."default" AND (l.released_at IS NOT NULL OR l.expires_at <= clock_timestamp())
                RETURNING l.token, l.granted_at, l.expires_at INTO v_token, v_grant, v_exp;
            END IF;
        END IF;
    END IF;
    -- A first grant, or a row pruned since the read: ON CONFLICT's WHERE is
    -- evaluated on the locked, latest row. Another first grant of the key in
    -- progress holds the key's index entry until its transaction ends: the
    -- insert waits for it at most 1 ms (lock_timeout, in a subtransaction,
    -- then set back), then the attempt is turned away as above. Only a grant
    -- of the key inserts its entry, and only a role granted the key can run
    -- one.
    IF v_token IS NULL AND cur.key IS NULL THEN
        v_timeout := current_setting('lock_timeout');
        v_set := set_config('lock_timeout', '1ms', true);
        BEGIN
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
        EXCEPTION WHEN lock_not_available THEN
            v_busy := true;
        END;
        v_set := set_config('lock_timeout', v_timeout, true);
        IF v_busy THEN
            RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, NULL::timestamptz, NULL::timestamptz, interval '0';
            RETURN;
        END IF;
    END IF;

    IF v_token IS NULL THEN
        -- Someone else won between the read and the grant.
        SELECT l.* INTO cur FROM pgfence.leases l WHERE l.key = p_key COLLATE pg_catalog."default";
        RETURN QUERY SELECT false, NULL::uuid, NULL::bigint, NULL::timestamptz, cur.expires_at,
                            greatest(cur.expires_at - clock_timestamp(), interval '0');
        RETURN;
    END IF;

    -- A client that lost the reply of this very attempt may have abandoned
    -- it (abandon_grant) and been told nothing was granted: then this grant,
    -- arriving late, must not happen. Checked now that the row is ours, in a
    -- statement of its own (a snapshot taken after the lock): an abandonment
    -- committed before is seen here, one committed after waits for our
    -- commit in grant_probe and finds the grant.
    IF EXISTS (SELECT 1 FROM pgfence.abandoned_requests ab
                WHERE ab.id = v_holder AND ab.kind = 'grant' AND ab.name = p_key COLLATE pg_catalog."default") THEN
        PERFORM pgfence.raise_if_abandoned('grant', p_key, v_holder);
    END IF;

    -- The read above tells which grant we replaced (exact unless that grant
    -- changed between the read and the upsert, which only affects the label).
    IF cur.key IS NOT NULL AND cur.released_at IS NULL THEN
        INSERT INTO pgfence.lease_events (key, event, holder, token, reason, client_version, holder_info)
        VALUES (p_key, 'taken_over', v_holder, v_token,
                format('lease of holder %s (token %s) expired at %s', cur.holder, cur.token, cur.expires_at),
                p_client_version, coalesce(p_holder_info, ''));
    ELSE
        INSERT INTO pgfence.lease_events (key, event, holder, token, client_version, holder_info)
        VALUES (p_key, 'acquired', v_holder, v_token, p_client_version, coalesce(p_holder_info, ''));
    END IF;
    IF v_token % 32 = 0 THEN
        PERFORM pgfence.prune_lease_events(p_key, 100);
    END IF;

    IF p_announce THEN
        -- Waiters in other clients that were woken by the same release hold
        -- back their attempts when they hear this: payload "<lease
        -- microseconds>:<key>".
        v_set := pg_notify('pgfence_lease_granted',
                          ((extract(epoch FROM v_exp - v_grant) * 1000000)::bigint)::text || ':' || p_key);
    END IF;

    RETURN QUERY SELECT true, v_holder, v_token, v_grant, v_exp,
                        greatest(v_exp - clock_timestamp(), interval '0');
END;
$$;

--
-- Name: unprotect(regclass); Type: FUNCTION; Schema: pgfence; Owner: -
--

CREATE FUNCTION pgfence.unprotect(relation regclass) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    had   boolean;
    child regclass;
BEGIN
    SELECT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = relation AND t.tgname = 'pgfence_guard') INTO had;
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', relation);
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', relation);
    -- The triggers protect() put on the tables below it (a partition's row
    -- guard, a clone, went with its parent's).
    FOR child IN
        WITH RECURSIVE tree(relid) AS (
            SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = relation
            UNION
            SELECT i.inhrelid FROM tree t JOIN pg_inherits i ON i.inhparent = t.relid
        )
        SELECT t.relid::regclass FROM tree t JOIN pg_class c ON c.oid = t.relid WHERE c.relkind IN ('r', 'p')
    LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', child);
        EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', child);
    END LOOP;
    RETURN had;
END;
$$;

--
-- Name: abandoned_requests; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.abandoned_requests (
    id uuid NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    abandoned_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    abandoned_by name DEFAULT SESSION_USER NOT NULL,
    CONSTRAINT abandoned_requests_kind_check CHECK ((kind = ANY (ARRAY['grant'::text, 'fence'::text]))),
    CONSTRAINT abandoned_requests_name_check CHECK (((octet_length(name) >= 1) AND (octet_length(name) <= 512)))
);

--
-- Name: announce_secret; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.announce_secret (
    only_row boolean DEFAULT true NOT NULL,
    secret bytea NOT NULL,
    CONSTRAINT announce_secret_only_row_check CHECK (only_row),
    CONSTRAINT announce_secret_secret_check CHECK ((octet_length(secret) = 32))
);

--
-- Name: fence_rejections; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.fence_rejections (
    id bigint NOT NULL,
    resource text NOT NULL,
    presented_token bigint NOT NULL,
    accepted_token bigint,
    reason text NOT NULL,
    lease_reason text,
    operation text,
    op uuid,
    trace_id text,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT fence_rejections_lease_reason_check CHECK ((lease_reason = ANY (ARRAY['missing'::text, 'taken_over'::text, 'released'::text, 'expired'::text]))),
    CONSTRAINT fence_rejections_operation_check CHECK ((length(operation) <= 64)),
    CONSTRAINT fence_rejections_reason_check CHECK ((reason = ANY (ARRAY['stale_token'::text, 'lease_not_held'::text, 'token_not_issued'::text]))),
    CONSTRAINT fence_rejections_resource_check CHECK (((length(resource) >= 1) AND (length(resource) <= 1024))),
    CONSTRAINT fence_rejections_trace_id_check CHECK ((trace_id ~ '^[0-9a-f]{32}$'::text))
);

--
-- Name: fence_rejections_id_seq; Type: SEQUENCE; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.fence_rejections ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgfence.fence_rejections_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: fence_resets; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.fence_resets (
    id bigint NOT NULL,
    resource text NOT NULL,
    from_token bigint NOT NULL,
    to_token bigint NOT NULL,
    reason text NOT NULL,
    reset_by name DEFAULT SESSION_USER NOT NULL,
    reset_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    CONSTRAINT fence_resets_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 1000)))
);

--
-- Name: fence_resets_id_seq; Type: SEQUENCE; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.fence_resets ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgfence.fence_resets_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: fences; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.fences (
    resource pgfence.key_name NOT NULL,
    token pgfence.token_value NOT NULL,
    accepted_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    writes pgfence.write_count DEFAULT 1 NOT NULL,
    op uuid,
    fenced_xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    trace_id text DEFAULT pgfence.current_trace_id()
)
WITH (fillfactor='50');

--
-- Name: goose_db_version; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.goose_db_version (
    id integer NOT NULL,
    version_id bigint NOT NULL,
    is_applied boolean NOT NULL,
    tstamp timestamp without time zone DEFAULT now() NOT NULL
);

--
-- Name: goose_db_version_id_seq; Type: SEQUENCE; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.goose_db_version ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME pgfence.goose_db_version_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: grant_pause_events; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.grant_pause_events (
    id bigint NOT NULL,
    prefix text NOT NULL,
    action text NOT NULL,
    actor text DEFAULT SESSION_USER NOT NULL,
    reason text,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT grant_pause_events_action_check CHECK ((action = ANY (ARRAY['paused'::text, 'resumed'::text]))),
    CONSTRAINT grant_pause_events_reason_check CHECK (((reason IS NULL) OR ((length(reason) >= 1) AND (length(reason) <= 1000))))
);

--
-- Name: grant_pause_events_id_seq; Type: SEQUENCE; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.grant_pause_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgfence.grant_pause_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: grant_pauses; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.grant_pauses (
    prefix text NOT NULL,
    paused_by text DEFAULT SESSION_USER NOT NULL,
    reason text NOT NULL,
    paused_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT grant_pauses_prefix_check CHECK ((octet_length(prefix) <= 512)),
    CONSTRAINT grant_pauses_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 1000)))
);

--
-- Name: job_slots; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.job_slots (
    key text NOT NULL,
    slot text NOT NULL,
    holder uuid NOT NULL,
    token bigint NOT NULL,
    runs integer NOT NULL,
    started_at timestamp with time zone NOT NULL,
    run_at timestamp with time zone NOT NULL,
    checkpoint text,
    saved_at timestamp with time zone,
    completed_at timestamp with time zone,
    CONSTRAINT job_slots_checkpoint_check CHECK ((octet_length(checkpoint) <= 65536)),
    CONSTRAINT job_slots_key_check CHECK (((octet_length(key) >= 1) AND (octet_length(key) <= 512))),
    CONSTRAINT job_slots_runs_check CHECK ((runs >= 0)),
    CONSTRAINT job_slots_slot_check CHECK (((octet_length(slot) >= 1) AND (octet_length(slot) <= 256))),
    CONSTRAINT job_slots_token_check CHECK ((token > 0))
);

--
-- Name: lease_events; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.lease_events (
    id bigint NOT NULL,
    key pgfence.key_name NOT NULL,
    event pgfence.lease_event_kind NOT NULL,
    holder uuid NOT NULL,
    token pgfence.token_value NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    reason pgfence.lease_reason,
    trace_id text DEFAULT pgfence.current_trace_id(),
    client_version text,
    holder_info pgfence.holder_info
);

--
-- Name: lease_events_id_seq; Type: SEQUENCE; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.lease_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgfence.lease_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: lease_status; Type: VIEW; Schema: pgfence; Owner: -
--

CREATE VIEW pgfence.lease_status WITH (security_invoker='true') AS
 SELECT l.key,
    l.holder,
    l.token,
    l.granted_at,
    l.renewed_at,
    l.expires_at,
    l.released_at,
    l.holder_info,
    ((l.released_at IS NULL) AND (l.expires_at > clock_timestamp())) AS live,
        CASE
            WHEN (l.released_at IS NULL) THEN GREATEST((l.expires_at - clock_timestamp()), '00:00:00'::interval)
            ELSE '00:00:00'::interval
        END AS remaining,
    l.client_version
   FROM pgfence.leases l;

--
-- Name: lease_waiters; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.lease_waiters (
    key text NOT NULL,
    waiter uuid NOT NULL,
    enqueued_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT lease_waiters_check CHECK ((expires_at > enqueued_at)),
    CONSTRAINT lease_waiters_key_check CHECK (((octet_length(key) >= 1) AND (octet_length(key) <= 512)))
);

--
-- Name: migration_lock; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.migration_lock (
    singleton boolean DEFAULT true NOT NULL,
    holder uuid NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    application text NOT NULL,
    db_user text NOT NULL,
    locked_at timestamp with time zone NOT NULL,
    lease_until timestamp with time zone NOT NULL,
    CONSTRAINT migration_lock_singleton_check CHECK (singleton)
);

--
-- Name: TABLE migration_lock; Type: COMMENT; Schema: pgfence; Owner: -
--

COMMENT ON TABLE pgfence.migration_lock IS 'The pgfence migration lock: one row while a migration runs. Clear a stuck one only once the process it names no longer runs.';

--
-- Name: prefix_grants; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.prefix_grants (
    grantee regrole NOT NULL,
    prefix text NOT NULL,
    granted_by name DEFAULT SESSION_USER NOT NULL,
    granted_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT prefix_grants_prefix_check CHECK ((octet_length(prefix) <= 512))
);

--
-- Name: task_ids; Type: SEQUENCE; Schema: pgfence; Owner: -
--

CREATE SEQUENCE pgfence.task_ids
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: task_keys; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.task_keys (
    key pgfence.key_name NOT NULL,
    next_seq bigint DEFAULT 1 NOT NULL,
    mark_id bigint,
    mark_xid xid8,
    ordered boolean DEFAULT true NOT NULL,
    max_attempts integer DEFAULT 5 NOT NULL,
    finished bigint DEFAULT 0 NOT NULL,
    numbered_to bigint DEFAULT 0 NOT NULL,
    blocked_by bigint,
    claimed_at timestamp with time zone,
    CONSTRAINT task_keys_check CHECK (((mark_id IS NULL) = (mark_xid IS NULL))),
    CONSTRAINT task_keys_finished_check CHECK ((finished >= 0)),
    CONSTRAINT task_keys_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 100))),
    CONSTRAINT task_keys_next_seq_check CHECK ((next_seq > 0))
);

--
-- Name: token_floor; Type: TABLE; Schema: pgfence; Owner: -
--

CREATE TABLE pgfence.token_floor (
    singleton boolean DEFAULT true NOT NULL,
    floor bigint DEFAULT 0 NOT NULL,
    raised_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    reason text DEFAULT 'initial'::text NOT NULL,
    retention bigint DEFAULT 0 NOT NULL,
    retention_at timestamp with time zone,
    CONSTRAINT token_floor_floor_check CHECK ((floor >= 0)),
    CONSTRAINT token_floor_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 1000))),
    CONSTRAINT token_floor_retention_check CHECK ((retention >= 0)),
    CONSTRAINT token_floor_singleton_check CHECK (singleton)
);

--
-- Name: abandoned_requests abandoned_requests_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.abandoned_requests
    ADD CONSTRAINT abandoned_requests_pkey PRIMARY KEY (id, kind, name);

--
-- Name: announce_secret announce_secret_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.announce_secret
    ADD CONSTRAINT announce_secret_pkey PRIMARY KEY (only_row);

--
-- Name: fence_rejections fence_rejections_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.fence_rejections
    ADD CONSTRAINT fence_rejections_pkey PRIMARY KEY (id);

--
-- Name: fence_resets fence_resets_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.fence_resets
    ADD CONSTRAINT fence_resets_pkey PRIMARY KEY (id);

--
-- Name: fences fences_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.fences
    ADD CONSTRAINT fences_pkey PRIMARY KEY (resource);

--
-- Name: token_floor floor_leaves_room; Type: CHECK CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.token_floor
    ADD CONSTRAINT floor_leaves_room CHECK (((floor <= '4611686018427387904'::bigint) AND (retention <= '4611686018427387904'::bigint))) NOT VALID;

--
-- Name: goose_db_version goose_db_version_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.goose_db_version
    ADD CONSTRAINT goose_db_version_pkey PRIMARY KEY (id);

--
-- Name: grant_pause_events grant_pause_events_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.grant_pause_events
    ADD CONSTRAINT grant_pause_events_pkey PRIMARY KEY (id);

--
-- Name: grant_pauses grant_pauses_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.grant_pauses
    ADD CONSTRAINT grant_pauses_pkey PRIMARY KEY (prefix);

--
-- Name: idempotency_keys idempotency_keys_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.idempotency_keys
    ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (scope, key);

--
-- Name: job_slots job_slots_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.job_slots
    ADD CONSTRAINT job_slots_pkey PRIMARY KEY (key, slot);

--
-- Name: lease_waiters lease_waiters_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.lease_waiters
    ADD CONSTRAINT lease_waiters_pkey PRIMARY KEY (key, waiter);

--
-- Name: leases leases_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.leases
    ADD CONSTRAINT leases_pkey PRIMARY KEY (key);

--
-- Name: migration_lock migration_lock_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.migration_lock
    ADD CONSTRAINT migration_lock_pkey PRIMARY KEY (singleton);

--
-- Name: prefix_grants prefix_grants_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.prefix_grants
    ADD CONSTRAINT prefix_grants_pkey PRIMARY KEY (grantee, prefix);

--
-- Name: task_keys task_keys_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.task_keys
    ADD CONSTRAINT task_keys_pkey PRIMARY KEY (key);

--
-- Name: tasks tasks_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.tasks
    ADD CONSTRAINT tasks_pkey PRIMARY KEY (id);

--
-- Name: token_floor token_floor_pkey; Type: CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE ONLY pgfence.token_floor
    ADD CONSTRAINT token_floor_pkey PRIMARY KEY (singleton);

--
-- Name: idempotency_keys valid_row; Type: CHECK CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.idempotency_keys
    ADD CONSTRAINT valid_row CHECK (pgfence.idempotency_key_valid(idempotency_keys.*)) NOT VALID;

--
-- Name: leases valid_row; Type: CHECK CONSTRAINT; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.leases
    ADD CONSTRAINT valid_row CHECK (pgfence.lease_row_valid(leases.*)) NOT VALID;

--
-- Name: fence_rejections_resource_at; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE INDEX fence_rejections_resource_at ON pgfence.fence_rejections USING btree (resource, at DESC);

--
-- Name: fence_rejections_trace_id; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE INDEX fence_rejections_trace_id ON pgfence.fence_rejections USING btree (trace_id) WHERE (trace_id IS NOT NULL);

--
-- Name: idempotency_keys_expires_at; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE INDEX idempotency_keys_expires_at ON pgfence.idempotency_keys USING btree (expires_at) WHERE (expires_at IS NOT NULL);

--
-- Name: idempotency_keys_leased_in_progress; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE INDEX idempotency_keys_leased_in_progress ON pgfence.idempotency_keys USING btree (scope) WHERE ((status = 'in_progress'::text) AND (mode = 'leased'::text));

--
-- Name: job_slots_key_started; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE INDEX job_slots_key_started ON pgfence.job_slots USING btree (key, started_at, slot);

--
-- Name: lease_events_key_id; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE INDEX lease_events_key_id ON pgfence.lease_events USING btree (key, id);

--
-- Name: lease_events_trace_id; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE INDEX lease_events_trace_id ON pgfence.lease_events USING btree (trace_id) WHERE (trace_id IS NOT NULL);

--
-- Name: lease_waiters_order; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE INDEX lease_waiters_order ON pgfence.lease_waiters USING btree (key, enqueued_at, waiter);

--
-- Name: tasks_key_idem; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE UNIQUE INDEX tasks_key_idem ON pgfence.tasks USING btree (key, idem_key) WHERE (idem_key IS NOT NULL);

--
-- Name: tasks_key_seq; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE UNIQUE INDEX tasks_key_seq ON pgfence.tasks USING btree (key, seq) WHERE (seq IS NOT NULL);

--
-- Name: tasks_open; Type: INDEX; Schema: pgfence; Owner: -
--

CREATE INDEX tasks_open ON pgfence.tasks USING btree (key, seq, id) WHERE (state = ANY (ARRAY['pending'::text, 'running'::text]));

--
-- Name: fences fences_before_update; Type: TRIGGER; Schema: pgfence; Owner: -
--

CREATE TRIGGER fences_before_update BEFORE UPDATE OF token, resource ON pgfence.fences FOR EACH ROW EXECUTE FUNCTION pgfence.fences_before_update();

--
-- Name: fences fences_no_delete; Type: TRIGGER; Schema: pgfence; Owner: -
--

CREATE TRIGGER fences_no_delete BEFORE DELETE ON pgfence.fences FOR EACH ROW EXECUTE FUNCTION pgfence.reject_fence_change();

--
-- Name: fences fences_no_truncate; Type: TRIGGER; Schema: pgfence; Owner: -
--

CREATE TRIGGER fences_no_truncate BEFORE TRUNCATE ON pgfence.fences FOR EACH STATEMENT EXECUTE FUNCTION pgfence.reject_fence_change();

--
-- Name: idempotency_keys idempotency_atomic_completed; Type: TRIGGER; Schema: pgfence; Owner: -
--

CREATE CONSTRAINT TRIGGER idempotency_atomic_completed AFTER INSERT OR UPDATE OF status, mode ON pgfence.idempotency_keys DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pgfence.idempotency_atomic_completed();

--
-- Name: fence_rejections; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.fence_rejections ENABLE ROW LEVEL SECURITY;

--
-- Name: fences; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.fences ENABLE ROW LEVEL SECURITY;

--
-- Name: grant_pause_events; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.grant_pause_events ENABLE ROW LEVEL SECURITY;

--
-- Name: grant_pauses; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.grant_pauses ENABLE ROW LEVEL SECURITY;

--
-- Name: fence_rejections granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.fence_rejections FOR SELECT TO pgfence_app USING (pgfence.may_use(resource));

--
-- Name: fences granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.fences FOR SELECT TO pgfence_app USING (pgfence.may_use((resource)::text));

--
-- Name: grant_pause_events granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.grant_pause_events FOR SELECT TO pgfence_app USING (pgfence.may_use_under(prefix));

--
-- Name: grant_pauses granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.grant_pauses FOR SELECT TO pgfence_app USING (pgfence.may_use_under(prefix));

--
-- Name: idempotency_keys granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.idempotency_keys FOR SELECT TO pgfence_app USING (pgfence.may_use(scope));

--
-- Name: job_slots granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.job_slots FOR SELECT TO pgfence_app USING (pgfence.may_use(key));

--
-- Name: lease_events granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.lease_events FOR SELECT TO pgfence_app USING (pgfence.may_use((key)::text));

--
-- Name: lease_waiters granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.lease_waiters FOR SELECT TO pgfence_app USING (pgfence.may_use(key));

--
-- Name: leases granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.leases FOR SELECT TO pgfence_app USING (pgfence.may_use((key)::text));

--
-- Name: task_keys granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.task_keys FOR SELECT TO pgfence_app USING (pgfence.may_use(pgfence.task_lease_key((key)::text)));

--
-- Name: tasks granted; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY granted ON pgfence.tasks FOR SELECT TO pgfence_app USING (((enqueued_by =
CASE
    WHEN (current_setting('role'::text) = 'none'::text) THEN SESSION_USER
    ELSE (current_setting('role'::text))::name
END) OR pgfence.may_use(pgfence.task_lease_key((key)::text))));

--
-- Name: idempotency_keys; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.idempotency_keys ENABLE ROW LEVEL SECURITY;

--
-- Name: job_slots; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.job_slots ENABLE ROW LEVEL SECURITY;

--
-- Name: lease_events; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.lease_events ENABLE ROW LEVEL SECURITY;

--
-- Name: lease_waiters; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.lease_waiters ENABLE ROW LEVEL SECURITY;

--
-- Name: leases; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.leases ENABLE ROW LEVEL SECURITY;

--
-- Name: fence_rejections operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.fence_rejections FOR SELECT TO pgfence_operator USING (true);

--
-- Name: fences operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.fences FOR SELECT TO pgfence_operator USING (true);

--
-- Name: grant_pause_events operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.grant_pause_events FOR SELECT TO pgfence_operator USING (true);

--
-- Name: grant_pauses operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.grant_pauses FOR SELECT TO pgfence_operator USING (true);

--
-- Name: idempotency_keys operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.idempotency_keys FOR SELECT TO pgfence_operator USING (true);

--
-- Name: job_slots operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.job_slots FOR SELECT TO pgfence_operator USING (true);

--
-- Name: lease_events operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.lease_events FOR SELECT TO pgfence_operator USING (true);

--
-- Name: lease_waiters operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.lease_waiters FOR SELECT TO pgfence_operator USING (true);

--
-- Name: leases operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.leases FOR SELECT TO pgfence_operator USING (true);

--
-- Name: task_keys operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.task_keys FOR SELECT TO pgfence_operator USING (true);

--
-- Name: tasks operators; Type: POLICY; Schema: pgfence; Owner: -
--

CREATE POLICY operators ON pgfence.tasks FOR SELECT TO pgfence_operator USING (true);

--
-- Name: task_keys; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.task_keys ENABLE ROW LEVEL SECURITY;

--
-- Name: tasks; Type: ROW SECURITY; Schema: pgfence; Owner: -
--

ALTER TABLE pgfence.tasks ENABLE ROW LEVEL SECURITY;

--
-- Name: SCHEMA pgfence; Type: ACL; Schema: -; Owner: -
--

GRANT USAGE ON SCHEMA pgfence TO pgfence_app;
GRANT USAGE ON SCHEMA pgfence TO pgfence_operator;

--
-- Name: FUNCTION abandon_fence(p_resource text, p_op uuid); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.abandon_fence(p_resource text, p_op uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.abandon_fence(p_resource text, p_op uuid) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.abandon_fence(p_resource text, p_op uuid) TO pgfence_operator;

--
-- Name: FUNCTION abandon_grant(p_key text, p_holder uuid); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.abandon_grant(p_key text, p_holder uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.abandon_grant(p_key text, p_holder uuid) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.abandon_grant(p_key text, p_holder uuid) TO pgfence_operator;

--
-- Name: FUNCTION abandon_request(p_kind text, p_name text, p_id uuid); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.abandon_request(p_kind text, p_name text, p_id uuid) FROM PUBLIC;

--
-- Name: FUNCTION acquire(p_key text, p_ttl interval, p_holder_info text, p_holder uuid, p_client_version text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.acquire(p_key text, p_ttl interval, p_holder_info text, p_holder uuid, p_client_version text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.acquire(p_key text, p_ttl interval, p_holder_info text, p_holder uuid, p_client_version text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.acquire(p_key text, p_ttl interval, p_holder_info text, p_holder uuid, p_client_version text) TO pgfence_operator;

--
-- Name: FUNCTION acting_role(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.acting_role() FROM PUBLIC;

--
-- Name: FUNCTION advance_retention(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.advance_retention() FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.advance_retention() TO pgfence_operator;

--
-- Name: FUNCTION announce_key(p_key text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.announce_key(p_key text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.announce_key(p_key text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.announce_key(p_key text) TO pgfence_operator;

--
-- Name: FUNCTION announce_renewal(p_key text, p_holder uuid, p_token bigint); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.announce_renewal(p_key text, p_holder uuid, p_token bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.announce_renewal(p_key text, p_holder uuid, p_token bigint) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.announce_renewal(p_key text, p_holder uuid, p_token bigint) TO pgfence_operator;

--
-- Name: FUNCTION check_lease(key text, holder uuid, token bigint); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.check_lease(key text, holder uuid, token bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.check_lease(key text, holder uuid, token bigint) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.check_lease(key text, holder uuid, token bigint) TO pgfence_operator;

--
-- Name: FUNCTION check_token(p_token bigint); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.check_token(p_token bigint) FROM PUBLIC;

--
-- Name: FUNCTION current_trace_id(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.current_trace_id() FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.current_trace_id() TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.current_trace_id() TO pgfence_operator;

--
-- Name: FUNCTION fence(resource text, token bigint, op uuid); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.fence(resource text, token bigint, op uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.fence(resource text, token bigint, op uuid) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.fence(resource text, token bigint, op uuid) TO pgfence_operator;

--
-- Name: FUNCTION fence_probe(p_resource text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.fence_probe(p_resource text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.fence_probe(p_resource text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.fence_probe(p_resource text) TO pgfence_operator;

--
-- Name: FUNCTION fences_before_update(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.fences_before_update() FROM PUBLIC;

--
-- Name: FUNCTION force_release(p_key text, p_reason text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.force_release(p_key text, p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.force_release(p_key text, p_reason text) TO pgfence_operator;

--
-- Name: FUNCTION grant_prefix(p_role regrole, p_prefix text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.grant_prefix(p_role regrole, p_prefix text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.grant_prefix(p_role regrole, p_prefix text) TO pgfence_operator;

--
-- Name: FUNCTION grant_probe(p_key text, p_holder uuid); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.grant_probe(p_key text, p_holder uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.grant_probe(p_key text, p_holder uuid) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.grant_probe(p_key text, p_holder uuid) TO pgfence_operator;

--
-- Name: FUNCTION guard(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.guard() FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.guard() TO pgfence_operator;

--
-- Name: FUNCTION guard_new_tables(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.guard_new_tables() FROM PUBLIC;

--
-- Name: FUNCTION idempotency_advance(p_scope text, p_key text, p_owner uuid, p_recovery_point text, p_recovery_data bytea, p_lease interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_advance(p_scope text, p_key text, p_owner uuid, p_recovery_point text, p_recovery_data bytea, p_lease interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.idempotency_advance(p_scope text, p_key text, p_owner uuid, p_recovery_point text, p_recovery_data bytea, p_lease interval) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.idempotency_advance(p_scope text, p_key text, p_owner uuid, p_recovery_point text, p_recovery_data bytea, p_lease interval) TO pgfence_operator;

--
-- Name: FUNCTION idempotency_atomic_completed(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_atomic_completed() FROM PUBLIC;

--
-- Name: FUNCTION idempotency_check_args(p_scope text, p_key text, p_fingerprint bytea, p_retention interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_check_args(p_scope text, p_key text, p_fingerprint bytea, p_retention interval) FROM PUBLIC;

--
-- Name: FUNCTION idempotency_check_name(p_scope text, p_key text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_check_name(p_scope text, p_key text) FROM PUBLIC;

--
-- Name: FUNCTION idempotency_check_result(p_result bytea, p_failure_code text, p_failure_message text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_check_result(p_result bytea, p_failure_code text, p_failure_message text) FROM PUBLIC;

--
-- Name: FUNCTION idempotency_claim(p_scope text, p_key text, p_fingerprint bytea, p_lease interval, p_retention interval, p_wait interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_claim(p_scope text, p_key text, p_fingerprint bytea, p_lease interval, p_retention interval, p_wait interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.idempotency_claim(p_scope text, p_key text, p_fingerprint bytea, p_lease interval, p_retention interval, p_wait interval) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.idempotency_claim(p_scope text, p_key text, p_fingerprint bytea, p_lease interval, p_retention interval, p_wait interval) TO pgfence_operator;

--
-- Name: FUNCTION idempotency_claim_atomic(p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_claim_atomic(p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.idempotency_claim_atomic(p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.idempotency_claim_atomic(p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval) TO pgfence_operator;

--
-- Name: FUNCTION idempotency_claim_atomic_new(p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_claim_atomic_new(p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.idempotency_claim_atomic_new(p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.idempotency_claim_atomic_new(p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval) TO pgfence_operator;

--
-- Name: FUNCTION idempotency_complete(p_scope text, p_key text, p_owner uuid, p_result bytea, p_failure_code text, p_failure_message text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_complete(p_scope text, p_key text, p_owner uuid, p_result bytea, p_failure_code text, p_failure_message text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.idempotency_complete(p_scope text, p_key text, p_owner uuid, p_result bytea, p_failure_code text, p_failure_message text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.idempotency_complete(p_scope text, p_key text, p_owner uuid, p_result bytea, p_failure_code text, p_failure_message text) TO pgfence_operator;

--
-- Name: FUNCTION idempotency_complete_atomic(p_scope text, p_key text, p_result bytea, p_failure_code text, p_failure_message text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_complete_atomic(p_scope text, p_key text, p_result bytea, p_failure_code text, p_failure_message text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.idempotency_complete_atomic(p_scope text, p_key text, p_result bytea, p_failure_code text, p_failure_message text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.idempotency_complete_atomic(p_scope text, p_key text, p_result bytea, p_failure_code text, p_failure_message text) TO pgfence_operator;

--
-- Name: FUNCTION idempotency_durable(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_durable() FROM PUBLIC;

--
-- Name: FUNCTION idempotency_gc(p_batch integer); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_gc(p_batch integer) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.idempotency_gc(p_batch integer) TO pgfence_operator;

--
-- Name: FUNCTION idempotency_heartbeat(p_scope text, p_key text, p_owner uuid, p_lease interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_heartbeat(p_scope text, p_key text, p_owner uuid, p_lease interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.idempotency_heartbeat(p_scope text, p_key text, p_owner uuid, p_lease interval) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.idempotency_heartbeat(p_scope text, p_key text, p_owner uuid, p_lease interval) TO pgfence_operator;

--
-- Name: TABLE idempotency_keys; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.idempotency_keys TO pgfence_app;
GRANT SELECT ON TABLE pgfence.idempotency_keys TO pgfence_operator;

--
-- Name: FUNCTION idempotency_key_valid(k pgfence.idempotency_keys); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_key_valid(k pgfence.idempotency_keys) FROM PUBLIC;

--
-- Name: FUNCTION idempotency_not_owner(p_scope text, p_key text, p_owner uuid); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_not_owner(p_scope text, p_key text, p_owner uuid) FROM PUBLIC;

--
-- Name: FUNCTION idempotency_release(p_scope text, p_key text, p_owner uuid); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_release(p_scope text, p_key text, p_owner uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.idempotency_release(p_scope text, p_key text, p_owner uuid) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.idempotency_release(p_scope text, p_key text, p_owner uuid) TO pgfence_operator;

--
-- Name: FUNCTION idempotency_require_read_committed(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.idempotency_require_read_committed() FROM PUBLIC;

--
-- Name: FUNCTION job_check_args(p_key text, p_holder uuid, p_token bigint, p_slot text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.job_check_args(p_key text, p_holder uuid, p_token bigint, p_slot text) FROM PUBLIC;

--
-- Name: FUNCTION job_slot_begin(p_key text, p_holder uuid, p_token bigint, p_slot text, p_restart boolean); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.job_slot_begin(p_key text, p_holder uuid, p_token bigint, p_slot text, p_restart boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.job_slot_begin(p_key text, p_holder uuid, p_token bigint, p_slot text, p_restart boolean) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.job_slot_begin(p_key text, p_holder uuid, p_token bigint, p_slot text, p_restart boolean) TO pgfence_operator;

--
-- Name: FUNCTION job_slot_complete(p_key text, p_holder uuid, p_token bigint, p_slot text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.job_slot_complete(p_key text, p_holder uuid, p_token bigint, p_slot text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.job_slot_complete(p_key text, p_holder uuid, p_token bigint, p_slot text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.job_slot_complete(p_key text, p_holder uuid, p_token bigint, p_slot text) TO pgfence_operator;

--
-- Name: FUNCTION job_slot_missed(p_key text, p_holder uuid, p_token bigint, p_before timestamp with time zone, p_period interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.job_slot_missed(p_key text, p_holder uuid, p_token bigint, p_before timestamp with time zone, p_period interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.job_slot_missed(p_key text, p_holder uuid, p_token bigint, p_before timestamp with time zone, p_period interval) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.job_slot_missed(p_key text, p_holder uuid, p_token bigint, p_before timestamp with time zone, p_period interval) TO pgfence_operator;

--
-- Name: FUNCTION job_slot_save(p_key text, p_holder uuid, p_token bigint, p_slot text, p_checkpoint text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.job_slot_save(p_key text, p_holder uuid, p_token bigint, p_slot text, p_checkpoint text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.job_slot_save(p_key text, p_holder uuid, p_token bigint, p_slot text, p_checkpoint text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.job_slot_save(p_key text, p_holder uuid, p_token bigint, p_slot text, p_checkpoint text) TO pgfence_operator;

--
-- Name: FUNCTION lease_check_args(p_key text, p_ttl interval, p_holder_info text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.lease_check_args(p_key text, p_ttl interval, p_holder_info text) FROM PUBLIC;

--
-- Name: FUNCTION lease_max_ttl(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.lease_max_ttl() FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.lease_max_ttl() TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.lease_max_ttl() TO pgfence_operator;

--
-- Name: FUNCTION lease_queue_leave(p_key text, p_waiter uuid); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.lease_queue_leave(p_key text, p_waiter uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.lease_queue_leave(p_key text, p_waiter uuid) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.lease_queue_leave(p_key text, p_waiter uuid) TO pgfence_operator;

--
-- Name: FUNCTION lease_queue_turn(p_key text, p_waiter uuid, p_patience interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.lease_queue_turn(p_key text, p_waiter uuid, p_patience interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.lease_queue_turn(p_key text, p_waiter uuid, p_patience interval) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.lease_queue_turn(p_key text, p_waiter uuid, p_patience interval) TO pgfence_operator;

--
-- Name: TABLE leases; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.leases TO pgfence_app;
GRANT SELECT ON TABLE pgfence.leases TO pgfence_operator;

--
-- Name: FUNCTION lease_row_valid(l pgfence.leases); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.lease_row_valid(l pgfence.leases) FROM PUBLIC;

--
-- Name: FUNCTION lower_fence(p_resource text, p_token bigint, p_reason text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.lower_fence(p_resource text, p_token bigint, p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.lower_fence(p_resource text, p_token bigint, p_reason text) TO pgfence_operator;

--
-- Name: FUNCTION max_stored_token(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.max_stored_token() FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.max_stored_token() TO pgfence_operator;

--
-- Name: FUNCTION max_token(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.max_token() FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.max_token() TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.max_token() TO pgfence_operator;

--
-- Name: FUNCTION may_use(p_name text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.may_use(p_name text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.may_use(p_name text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.may_use(p_name text) TO pgfence_operator;

--
-- Name: FUNCTION may_use_under(p_prefix text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.may_use_under(p_prefix text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.may_use_under(p_prefix text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.may_use_under(p_prefix text) TO pgfence_operator;

--
-- Name: FUNCTION next_token(previous bigint); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.next_token(previous bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.next_token(previous bigint) TO pgfence_operator;

--
-- Name: FUNCTION pause_grants(p_prefix text, p_reason text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.pause_grants(p_prefix text, p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.pause_grants(p_prefix text, p_reason text) TO pgfence_operator;

--
-- Name: FUNCTION protect(relation regclass, resource_column text, prefix text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.protect(relation regclass, resource_column text, prefix text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.protect(relation regclass, resource_column text, prefix text) TO pgfence_operator;

--
-- Name: FUNCTION protected_tables(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.protected_tables() FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.protected_tables() TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.protected_tables() TO pgfence_operator;

--
-- Name: FUNCTION prune_fence_rejections(p_max_age interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.prune_fence_rejections(p_max_age interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.prune_fence_rejections(p_max_age interval) TO pgfence_operator;

--
-- Name: FUNCTION prune_lease_events(p_key text, p_keep integer); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.prune_lease_events(p_key text, p_keep integer) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.prune_lease_events(p_key text, p_keep integer) TO pgfence_operator;

--
-- Name: FUNCTION prune_retired(p_batch integer); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.prune_retired(p_batch integer) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.prune_retired(p_batch integer) TO pgfence_operator;

--
-- Name: FUNCTION prune_tasks(p_older_than interval, p_batch integer); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.prune_tasks(p_older_than interval, p_batch integer) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.prune_tasks(p_older_than interval, p_batch integer) TO pgfence_operator;

--
-- Name: FUNCTION raise_grants_paused(p_key text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.raise_grants_paused(p_key text) FROM PUBLIC;

--
-- Name: FUNCTION raise_if_abandoned(p_kind text, p_name text, p_id uuid); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.raise_if_abandoned(p_kind text, p_name text, p_id uuid) FROM PUBLIC;

--
-- Name: FUNCTION raise_not_slot_run(p_key text, p_slot text, p_token bigint); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.raise_not_slot_run(p_key text, p_slot text, p_token bigint) FROM PUBLIC;

--
-- Name: FUNCTION raise_token_floor(new_floor bigint, reason text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.raise_token_floor(new_floor bigint, reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.raise_token_floor(new_floor bigint, reason text) TO pgfence_operator;

--
-- Name: FUNCTION record_fence_rejection(p_resource text, p_presented_token bigint, p_accepted_token bigint, p_reason text, p_lease_reason text, p_operation text, p_op uuid, p_trace_id text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.record_fence_rejection(p_resource text, p_presented_token bigint, p_accepted_token bigint, p_reason text, p_lease_reason text, p_operation text, p_op uuid, p_trace_id text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.record_fence_rejection(p_resource text, p_presented_token bigint, p_accepted_token bigint, p_reason text, p_lease_reason text, p_operation text, p_op uuid, p_trace_id text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.record_fence_rejection(p_resource text, p_presented_token bigint, p_accepted_token bigint, p_reason text, p_lease_reason text, p_operation text, p_op uuid, p_trace_id text) TO pgfence_operator;

--
-- Name: FUNCTION reject_fence_change(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.reject_fence_change() FROM PUBLIC;

--
-- Name: FUNCTION reject_truncate(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.reject_truncate() FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.reject_truncate() TO pgfence_operator;

--
-- Name: FUNCTION release(p_key text, p_holder uuid, p_token bigint, p_durable boolean); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.release(p_key text, p_holder uuid, p_token bigint, p_durable boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.release(p_key text, p_holder uuid, p_token bigint, p_durable boolean) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.release(p_key text, p_holder uuid, p_token bigint, p_durable boolean) TO pgfence_operator;

--
-- Name: FUNCTION renew(p_key text, p_holder uuid, p_token bigint, p_ttl interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.renew(p_key text, p_holder uuid, p_token bigint, p_ttl interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.renew(p_key text, p_holder uuid, p_token bigint, p_ttl interval) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.renew(p_key text, p_holder uuid, p_token bigint, p_ttl interval) TO pgfence_operator;

--
-- Name: FUNCTION require_granted(p_what text, p_name text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.require_granted(p_what text, p_name text) FROM PUBLIC;

--
-- Name: FUNCTION require_lease(p_key text, p_holder uuid, p_token bigint, p_for_update boolean); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.require_lease(p_key text, p_holder uuid, p_token bigint, p_for_update boolean) FROM PUBLIC;

--
-- Name: FUNCTION require_primary(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.require_primary() FROM PUBLIC;

--
-- Name: FUNCTION resume_grants(p_prefix text, p_reason text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.resume_grants(p_prefix text, p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.resume_grants(p_prefix text, p_reason text) TO pgfence_operator;

--
-- Name: FUNCTION revoke_prefix(p_role regrole, p_prefix text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.revoke_prefix(p_role regrole, p_prefix text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.revoke_prefix(p_role regrole, p_prefix text) TO pgfence_operator;

--
-- Name: FUNCTION set_holder_info(p_key text, p_holder uuid, p_token bigint, p_holder_info text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.set_holder_info(p_key text, p_holder uuid, p_token bigint, p_holder_info text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.set_holder_info(p_key text, p_holder uuid, p_token bigint, p_holder_info text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.set_holder_info(p_key text, p_holder uuid, p_token bigint, p_holder_info text) TO pgfence_operator;

--
-- Name: FUNCTION task_check_key(p_key text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_check_key(p_key text) FROM PUBLIC;

--
-- Name: FUNCTION task_claim(p_key text, p_holder uuid, p_token bigint, p_max_tasks integer, p_max_attempts integer, p_ordered boolean); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_claim(p_key text, p_holder uuid, p_token bigint, p_max_tasks integer, p_max_attempts integer, p_ordered boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.task_claim(p_key text, p_holder uuid, p_token bigint, p_max_tasks integer, p_max_attempts integer, p_ordered boolean) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.task_claim(p_key text, p_holder uuid, p_token bigint, p_max_tasks integer, p_max_attempts integer, p_ordered boolean) TO pgfence_operator;

--
-- Name: FUNCTION task_complete(p_key text, p_holder uuid, p_token bigint, p_ids bigint[], p_results jsonb[]); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_complete(p_key text, p_holder uuid, p_token bigint, p_ids bigint[], p_results jsonb[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.task_complete(p_key text, p_holder uuid, p_token bigint, p_ids bigint[], p_results jsonb[]) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.task_complete(p_key text, p_holder uuid, p_token bigint, p_ids bigint[], p_results jsonb[]) TO pgfence_operator;

--
-- Name: FUNCTION task_enqueue(p_key text, p_payload jsonb, p_idem_key text, p_max_backlog integer, OUT id bigint, OUT created boolean, OUT state text, OUT seq bigint, OUT enqueued_at timestamp with time zone); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_enqueue(p_key text, p_payload jsonb, p_idem_key text, p_max_backlog integer, OUT id bigint, OUT created boolean, OUT state text, OUT seq bigint, OUT enqueued_at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.task_enqueue(p_key text, p_payload jsonb, p_idem_key text, p_max_backlog integer, OUT id bigint, OUT created boolean, OUT state text, OUT seq bigint, OUT enqueued_at timestamp with time zone) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.task_enqueue(p_key text, p_payload jsonb, p_idem_key text, p_max_backlog integer, OUT id bigint, OUT created boolean, OUT state text, OUT seq bigint, OUT enqueued_at timestamp with time zone) TO pgfence_operator;

--
-- Name: FUNCTION task_fail(p_key text, p_holder uuid, p_token bigint, p_id bigint, p_error text, p_retry_in interval); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_fail(p_key text, p_holder uuid, p_token bigint, p_id bigint, p_error text, p_retry_in interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.task_fail(p_key text, p_holder uuid, p_token bigint, p_id bigint, p_error text, p_retry_in interval) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.task_fail(p_key text, p_holder uuid, p_token bigint, p_id bigint, p_error text, p_retry_in interval) TO pgfence_operator;

--
-- Name: FUNCTION task_lease_key(p_key text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_lease_key(p_key text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.task_lease_key(p_key text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.task_lease_key(p_key text) TO pgfence_operator;

--
-- Name: FUNCTION task_operator(p_action text, p_reason text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_operator(p_action text, p_reason text) FROM PUBLIC;

--
-- Name: FUNCTION task_ready_keys(p_prefix text, p_max_keys integer, p_after text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_ready_keys(p_prefix text, p_max_keys integer, p_after text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.task_ready_keys(p_prefix text, p_max_keys integer, p_after text) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.task_ready_keys(p_prefix text, p_max_keys integer, p_after text) TO pgfence_operator;

--
-- Name: FUNCTION task_require_consumer(p_key text, p_holder uuid, p_token bigint); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_require_consumer(p_key text, p_holder uuid, p_token bigint) FROM PUBLIC;

--
-- Name: FUNCTION task_retry(p_id bigint, p_reason text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_retry(p_id bigint, p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.task_retry(p_id bigint, p_reason text) TO pgfence_operator;

--
-- Name: TABLE tasks; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.tasks TO pgfence_app;
GRANT SELECT ON TABLE pgfence.tasks TO pgfence_operator;

--
-- Name: FUNCTION task_same_payload(t pgfence.tasks, p_payload jsonb); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_same_payload(t pgfence.tasks, p_payload jsonb) FROM PUBLIC;

--
-- Name: FUNCTION task_skip(p_id bigint, p_reason text); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_skip(p_id bigint, p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.task_skip(p_id bigint, p_reason text) TO pgfence_operator;

--
-- Name: FUNCTION task_status(p_id bigint); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.task_status(p_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.task_status(p_id bigint) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.task_status(p_id bigint) TO pgfence_operator;

--
-- Name: FUNCTION token_epoch(); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.token_epoch() FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.token_epoch() TO pgfence_operator;

--
-- Name: FUNCTION try_acquire(p_key text, p_ttl interval, p_holder_info text, p_holder uuid, p_client_version text, p_announce boolean); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.try_acquire(p_key text, p_ttl interval, p_holder_info text, p_holder uuid, p_client_version text, p_announce boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.try_acquire(p_key text, p_ttl interval, p_holder_info text, p_holder uuid, p_client_version text, p_announce boolean) TO pgfence_app;
GRANT ALL ON FUNCTION pgfence.try_acquire(p_key text, p_ttl interval, p_holder_info text, p_holder uuid, p_client_version text, p_announce boolean) TO pgfence_operator;

--
-- Name: FUNCTION unprotect(relation regclass); Type: ACL; Schema: pgfence; Owner: -
--

REVOKE ALL ON FUNCTION pgfence.unprotect(relation regclass) FROM PUBLIC;
GRANT ALL ON FUNCTION pgfence.unprotect(relation regclass) TO pgfence_operator;

--
-- Name: TABLE abandoned_requests; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.abandoned_requests TO pgfence_operator;

--
-- Name: TABLE fence_rejections; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.fence_rejections TO pgfence_app;
GRANT SELECT ON TABLE pgfence.fence_rejections TO pgfence_operator;

--
-- Name: TABLE fence_resets; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.fence_resets TO pgfence_operator;

--
-- Name: TABLE fences; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.fences TO pgfence_app;
GRANT SELECT ON TABLE pgfence.fences TO pgfence_operator;

--
-- Name: TABLE goose_db_version; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.goose_db_version TO pgfence_operator;

--
-- Name: TABLE grant_pause_events; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.grant_pause_events TO pgfence_app;
GRANT SELECT ON TABLE pgfence.grant_pause_events TO pgfence_operator;

--
-- Name: TABLE grant_pauses; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.grant_pauses TO pgfence_app;
GRANT SELECT ON TABLE pgfence.grant_pauses TO pgfence_operator;

--
-- Name: TABLE job_slots; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.job_slots TO pgfence_app;
GRANT SELECT ON TABLE pgfence.job_slots TO pgfence_operator;

--
-- Name: TABLE lease_events; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.lease_events TO pgfence_app;
GRANT SELECT ON TABLE pgfence.lease_events TO pgfence_operator;

--
-- Name: TABLE lease_status; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.lease_status TO pgfence_app;
GRANT SELECT ON TABLE pgfence.lease_status TO pgfence_operator;

--
-- Name: TABLE lease_waiters; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.lease_waiters TO pgfence_app;
GRANT SELECT ON TABLE pgfence.lease_waiters TO pgfence_operator;

--
-- Name: TABLE prefix_grants; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.prefix_grants TO pgfence_operator;

--
-- Name: TABLE task_keys; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.task_keys TO pgfence_app;
GRANT SELECT ON TABLE pgfence.task_keys TO pgfence_operator;

--
-- Name: TABLE token_floor; Type: ACL; Schema: pgfence; Owner: -
--

GRANT SELECT ON TABLE pgfence.token_floor TO pgfence_app;
GRANT SELECT ON TABLE pgfence.token_floor TO pgfence_operator;

--
-- PostgreSQL database dump complete
--
