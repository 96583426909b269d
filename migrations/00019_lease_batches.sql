-- pgfence lease batches: many grants and releases in one statement and one
-- commit, each with its own result.
--
--   pgfence.lease_batch(ops, keys, ttls, holder_infos, holders, tokens,
--                       announce, trace_ids, client_version, durable_release,
--                       read_takeover, lock_wait DEFAULT NULL)
--     -> TABLE(ord, ok, holder, token, granted_at, expires_at, remaining,
--              status, taken_over, sqlstate, message, detail, hint)
--
-- Why. A grant or a release is a few hundred microseconds of work, and one
-- commit (a WAL flush for a grant) plus one round trip. A client with many
-- callers taking and releasing leases at once (a worker pool) pays a commit
-- and a round trip per call; sending the calls that are waiting together pays
-- one for all of them, as a database's group commit does for transactions.
--
-- What each element is. ops[i] is 'acquire' (pgfence.try_acquire(keys[i],
-- ttls[i], holder_infos[i], holders[i], client_version, announce[i])) or
-- 'release' (pgfence.release(keys[i], holders[i], tokens[i],
-- durable_release)); the arrays are indexed alike. Each element runs in a
-- subtransaction of its own, in the order given, with pgfence.trace_id set to
-- trace_ids[i] (NULL or '' for none): an element that fails (not granted to
-- this role, a paused prefix, bad arguments, a deadlock) rolls back alone and
-- its row carries its SQLSTATE, message, detail and hint; the others go on.
-- The row of a grant is try_acquire's (ok = acquired; taken_over, when
-- read_takeover, says whether it replaced an expired grant); the row of a
-- release is release's (ok = released, status). Rows come back in ord order,
-- one per element (ord counts from 1).
--
-- What it guarantees. Nothing new and nothing less: every element is the
-- function it names, with that function's checks and privileges (this one is
-- SECURITY INVOKER), and the whole batch commits or nothing does. A batch
-- with a grant commits with synchronous_commit = on, and, as for a single
-- grant, a client takes no result as final before the commit is confirmed
-- (the statement's end, ReadyForQuery). A batch whose
-- statement is cancelled, or whose connection is lost, fails as a whole: the
-- client settles each of its grants as it settles one whose reply was lost.
--
-- Waiting. An element that waits for a row lock (a grant of an expired
-- lease whose row a transaction still holds FOR SHARE, a release racing a
-- takeover) makes the whole batch wait. lock_wait bounds each such wait for
-- this statement (lock_timeout, restored at the end): an element that would
-- wait longer fails alone with 55P03, and the client sends it again on its
-- own, where it may wait as long as it needs without holding up the others.
--
-- Lock order. Each element locks at most its key's row. Clients send the
-- elements sorted by key (a release before a grant of the same key), so two
-- batches never wait for each other in opposite orders; a deadlock another
-- transaction causes fails only its element.

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION pgfence.lease_batch(
    p_ops             text[],
    p_keys            text[],
    p_ttls            interval[],
    p_holder_infos    text[],
    p_holders         uuid[],
    p_tokens          bigint[],
    p_announce        boolean[],
    p_trace_ids       text[],
    p_client_version  text,
    p_durable_release boolean,
    p_read_takeover   boolean,
    p_lock_wait       interval DEFAULT NULL)
RETURNS TABLE(ord integer, ok boolean, holder uuid, token bigint, granted_at timestamptz,
              expires_at timestamptz, remaining interval, status text, taken_over boolean,
              sqlstate text, message text, detail text, hint text)
LANGUAGE plpgsql SECURITY INVOKER
SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    n        integer := coalesce(cardinality(p_ops), 0);
    v_trace  text := coalesce(current_setting('pgfence.trace_id', true), '');
    v_lock   text := current_setting('lock_timeout');
    v_ok     boolean;
    v_holder uuid;
    v_token  bigint;
    v_grant  timestamptz;
    v_exp    timestamptz;
    v_rem    interval;
    v_status text;
    v_taken  boolean;
    v_state  text;
    v_msg    text;
    v_detail text;
    v_hint   text;
BEGIN
    -- On a standby the whole batch is refused, as each of its functions is.
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'pgfence: the server is in recovery (a standby); leases, tokens and fences are decided by the primary only'
            USING ERRCODE = 'PF005',
                  HINT = 'Connect to the current primary (target_session_attrs=read-write).';
    END IF;
    IF n > 1000 THEN
        RAISE EXCEPTION 'pgfence: a lease batch holds at most 1000 elements, got %', n
            USING ERRCODE = 'PF008';
    END IF;
    IF coalesce(cardinality(p_keys), 0) <> n OR coalesce(cardinality(p_ttls), 0) <> n
       OR coalesce(cardinality(p_holder_infos), 0) <> n OR coalesce(cardinality(p_holders), 0) <> n
       OR coalesce(cardinality(p_tokens), 0) <> n OR coalesce(cardinality(p_announce), 0) <> n
       OR coalesce(cardinality(p_trace_ids), 0) <> n THEN
        RAISE EXCEPTION 'pgfence: the arrays of a lease batch must all have % elements', n
            USING ERRCODE = 'PF008';
    END IF;
    IF p_lock_wait IS NOT NULL THEN
        IF p_lock_wait < interval '1 millisecond' OR p_lock_wait > interval '2147483647 milliseconds' THEN
            RAISE EXCEPTION 'pgfence: a lease batch''s lock wait must be 1 ms to 2147483647 ms (lock_timeout''s range), got %', p_lock_wait
                USING ERRCODE = 'PF008';
        END IF;
        PERFORM set_config('lock_timeout', ceil(extract(epoch FROM p_lock_wait) * 1000)::bigint || 'ms', true);
    END IF;
    FOR i IN 1..n LOOP
        v_ok := NULL; v_holder := NULL; v_token := NULL; v_grant := NULL; v_exp := NULL;
        v_rem := NULL; v_status := NULL; v_taken := NULL;
        v_state := NULL; v_msg := NULL; v_detail := NULL; v_hint := NULL;
        BEGIN
            IF coalesce(p_trace_ids[i], '') <> v_trace THEN
                v_trace := coalesce(p_trace_ids[i], '');
                PERFORM set_config('pgfence.trace_id', v_trace, true);
            END IF;
            IF p_ops[i] = 'acquire' THEN
                SELECT a.acquired, a.holder, a.token, a.granted_at, a.expires_at, a.remaining
                  INTO v_ok, v_holder, v_token, v_grant, v_exp, v_rem
                  FROM pgfence.try_acquire(p_keys[i], p_ttls[i], p_holder_infos[i], p_holders[i],
                                           p_client_version, coalesce(p_announce[i], false)) AS a;
                IF v_ok AND p_read_takeover THEN
                    SELECT e.event = 'taken_over' INTO v_taken
                      FROM pgfence.lease_events e
                     WHERE e.key = p_keys[i] COLLATE pg_catalog."default" AND e.holder = p_holders[i]
                     ORDER BY e.id DESC LIMIT 1;
                END IF;
            ELSIF p_ops[i] = 'release' THEN
                SELECT r.released, r.status INTO v_ok, v_status
                  FROM pgfence.release(p_keys[i], p_holders[i], p_tokens[i], p_durable_release) AS r;
            ELSE
                RAISE EXCEPTION 'pgfence: a lease batch element is ''acquire'' or ''release'', got %',
                    coalesce(quote_literal(p_ops[i]), 'NULL')
                    USING ERRCODE = 'PF008';
            END IF;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT,
                                    v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
            -- The element's subtransaction took its settings with it.
            v_trace := coalesce(current_setting('pgfence.trace_id', true), '');
            v_ok := NULL; v_holder := NULL; v_token := NULL; v_grant := NULL; v_exp := NULL;
            v_rem := NULL; v_status := NULL; v_taken := NULL;
        END;
        RETURN QUERY SELECT i, v_ok, v_holder, v_token, v_grant, v_exp, v_rem, v_status, v_taken,
                            v_state, v_msg, nullif(v_detail, ''), nullif(v_hint, '');
    END LOOP;
    IF p_lock_wait IS NOT NULL THEN
        PERFORM set_config('lock_timeout', v_lock, true);
    END IF;
END;
$$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgfence.lease_batch(text[], text[], interval[], text[], uuid[], bigint[], boolean[], text[], text, boolean, boolean, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.lease_batch(text[], text[], interval[], text[], uuid[], bigint[], boolean[], text[], text, boolean, boolean, interval) TO pgfence_app, pgfence_operator;

-- +goose Down
DROP FUNCTION pgfence.lease_batch(text[], text[], interval[], text[], uuid[], bigint[], boolean[], text[], text, boolean, boolean, interval);
