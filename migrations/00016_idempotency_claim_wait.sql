-- A leased idempotency claim waits for a locked key row at most p_wait.
--
-- idempotency_claim takes an expired lease over (or reuses an expired key)
-- with INSERT ... ON CONFLICT DO UPDATE, which waits for the row lock of any
-- transaction that has the row locked: an owner completing, failing or
-- heartbeating inside its own longer transaction, or another claim not yet
-- committed. The duplicate waited for as long as that transaction lasted,
-- and the HTTP middleware answered 500 when its claim timed out. The claim
-- now takes p_wait (DEFAULT 5 seconds, the Go Store's default WaitTimeout),
-- waits at most that long, as idempotency_claim_atomic does, and then raises
-- PF007 (in progress) like any claim that meets a live owner. Clients that
-- call the five-argument form get the default.
--
-- The function is dropped and created again (its signature changes), so its
-- SECURITY DEFINER setting and grants are restated as migration 00009 set
-- them. Down restores 00004's body with 00009's settings and grants.

-- +goose Up
-- +goose StatementBegin
DROP FUNCTION pgfence.idempotency_claim(text, text, bytea, interval, interval);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_claim(
    p_scope text, p_key text, p_fingerprint bytea, p_lease interval, p_retention interval,
    p_wait interval DEFAULT interval '5 seconds')
RETURNS TABLE (outcome text, owner uuid, epoch bigint, lease_expires_at timestamptz,
               recovery_point text, recovery_data bytea,
               status text, result bytea, failure_code text, failure_message text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    r         pgfence.idempotency_keys%ROWTYPE;
    v_old     text;
    v_claimed boolean;
BEGIN
    PERFORM pgfence.idempotency_durable();
    PERFORM pgfence.idempotency_require_read_committed();
    PERFORM pgfence.idempotency_check_args(p_scope, p_key, p_fingerprint, p_retention);
    IF p_lease IS NULL OR p_lease < interval '1 millisecond' THEN
        RAISE EXCEPTION 'pgfence: idempotency lease must be at least 1ms, got %', p_lease USING ERRCODE = 'PF008';
    END IF;
    IF p_wait IS NULL OR p_wait < interval '1 millisecond' OR p_wait > interval '2147483647 milliseconds' THEN
        RAISE EXCEPTION 'pgfence: idempotency wait must be 1ms to 2147483647ms (lock_timeout''s range), got %', p_wait
            USING ERRCODE = 'PF008';
    END IF;
    FOR i IN 1..5 LOOP
        -- Cheap read first: a replay or a refusal writes nothing.
        SELECT * INTO r FROM pgfence.idempotency_keys k WHERE k.scope = p_scope AND k.key = p_key;
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
            PERFORM set_config('lock_timeout', ceil(extract(epoch FROM p_wait) * 1000)::bigint || 'ms', true);
            INSERT INTO pgfence.idempotency_keys AS k
                   (scope, key, fingerprint, mode, status, owner, epoch, lease_expires_at, retention,
                    created_at, updated_at)
            VALUES (p_scope, p_key, p_fingerprint, 'leased', 'in_progress', gen_random_uuid(), 1,
                    clock_timestamp() + p_lease, p_retention, clock_timestamp(), clock_timestamp())
            ON CONFLICT (scope, key) DO UPDATE
               SET fingerprint = excluded.fingerprint, mode = 'leased', status = 'in_progress',
                   owner = excluded.owner, epoch = k.epoch + 1,
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
            PERFORM set_config('lock_timeout', v_old, true);
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
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgfence.idempotency_claim(text, text, bytea, interval, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.idempotency_claim(text, text, bytea, interval, interval, interval) TO pgfence_app, pgfence_operator;

-- +goose Down
-- +goose StatementBegin
DROP FUNCTION pgfence.idempotency_claim(text, text, bytea, interval, interval, interval);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_claim(
    p_scope text, p_key text, p_fingerprint bytea, p_lease interval, p_retention interval)
RETURNS TABLE (outcome text, owner uuid, epoch bigint, lease_expires_at timestamptz,
               recovery_point text, recovery_data bytea,
               status text, result bytea, failure_code text, failure_message text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    r pgfence.idempotency_keys%ROWTYPE;
BEGIN
    PERFORM pgfence.idempotency_durable();
    PERFORM pgfence.idempotency_require_read_committed();
    PERFORM pgfence.idempotency_check_args(p_scope, p_key, p_fingerprint, p_retention);
    IF p_lease IS NULL OR p_lease < interval '1 millisecond' THEN
        RAISE EXCEPTION 'pgfence: idempotency lease must be at least 1ms, got %', p_lease USING ERRCODE = 'PF008';
    END IF;
    FOR i IN 1..5 LOOP
        -- Cheap read first: a replay or a refusal writes nothing.
        SELECT * INTO r FROM pgfence.idempotency_keys k WHERE k.scope = p_scope AND k.key = p_key;
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
        INSERT INTO pgfence.idempotency_keys AS k
               (scope, key, fingerprint, mode, status, owner, epoch, lease_expires_at, retention,
                created_at, updated_at)
        VALUES (p_scope, p_key, p_fingerprint, 'leased', 'in_progress', gen_random_uuid(), 1,
                clock_timestamp() + p_lease, p_retention, clock_timestamp(), clock_timestamp())
        ON CONFLICT (scope, key) DO UPDATE
           SET fingerprint = excluded.fingerprint, mode = 'leased', status = 'in_progress',
               owner = excluded.owner, epoch = k.epoch + 1,
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
        IF FOUND THEN
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
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgfence.idempotency_claim(text, text, bytea, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.idempotency_claim(text, text, bytea, interval, interval) TO pgfence_app, pgfence_operator;
