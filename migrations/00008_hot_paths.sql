-- pgfence hot paths: the same protocol, fewer microseconds per operation.
--
-- Measured with pg_stat_statements (track = all) and pg_stat_user_functions on
-- PostgreSQL 15 (see the leases and pgfence package docs for the figures):
--
--   * A LANGUAGE sql function that cannot be inlined is parsed and planned
--     again for every statement that calls it (PostgreSQL 15 caches its plan
--     for one outer statement only). next_token (a subquery in its body) cost
--     ~60 µs per grant that way, current_trace_id (a FROM clause) ~25 µs per
--     lease event and per new fence row, through the column defaults.
--     next_token becomes plpgsql (plans cached per session); current_trace_id
--     becomes a single-expression SQL function that the planner inlines.
--   * pgfence.fence() ran a failed UPDATE, a SELECT and an INSERT for a
--     resource's first write, in a retry loop. It keeps the plain UPDATE for
--     a resource fenced before (cheaper than an upsert there: no lock record,
--     no insert tuple), and otherwise decides in one INSERT ... ON CONFLICT DO
--     UPDATE ... WHERE f.token <= excluded.token, whose WHERE is evaluated on
--     the newest row version after the row lock (DESIGN.md §4): no loop.
--   * pgfence.leases gets fillfactor 80: every grant and release updates its
--     key's row, and free room on the page keeps those updates HOT (no index
--     entry, no table growth under churn). Only pages filled from now on keep
--     the room; VACUUM FULL rewrites older ones.
--
-- Signatures are unchanged; the Down section restores the previous bodies.

-- +goose Up

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.next_token(previous bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_floor bigint;
BEGIN
    SELECT f.floor INTO v_floor FROM pgfence.token_floor f;
    RETURN greatest(coalesce(previous, 0) + 1, (pgfence.token_epoch() << 40) + 1, v_floor + 1);
END;
$$;
-- +goose StatementEnd

-- One expression, no FROM: inlined into the column defaults that call it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.current_trace_id() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN current_setting('pgfence.trace_id', true) ~ '^[0-9a-f]{32}$'
                 AND current_setting('pgfence.trace_id', true) <> '00000000000000000000000000000000'
                THEN current_setting('pgfence.trace_id', true) END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.fence(resource text, token bigint, op uuid DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    accepted bigint;
BEGIN
    IF fence.resource IS NULL OR octet_length(fence.resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF fence.token IS NULL OR fence.token <= 0 THEN
        RAISE EXCEPTION 'pgfence: token must be positive, got %', fence.token USING ERRCODE = 'PF008';
    END IF;
    -- An accepted token must survive a crash as long as the write it guards.
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    -- The common case: the resource was fenced before. Under READ COMMITTED
    -- a row changed by a concurrent writer is waited for and this WHERE is
    -- re-checked on its newest version, so a higher token committed meanwhile
    -- is never overwritten. The row stays locked until our transaction ends.
    UPDATE pgfence.fences AS f
       SET token = fence.token, accepted_at = clock_timestamp(), writes = f.writes + 1,
           op = fence.op, fenced_xid = pg_current_xact_id()
     WHERE f.resource = fence.resource AND f.token <= fence.token;
    IF FOUND THEN
        RETURN fence.token;
    END IF;
    -- Stale, a first write, or a row our UPDATE could not see yet (a
    -- concurrent first writer). A committed higher token is final (tokens
    -- never decrease): reject it without waiting for anyone's row lock.
    SELECT f.token INTO accepted FROM pgfence.fences f WHERE f.resource = fence.resource;
    IF FOUND AND accepted > fence.token THEN
        RAISE EXCEPTION 'pgfence: stale token % for resource %: token % was accepted', fence.token, quote_literal(fence.resource), accepted
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', accepted, fence.token, fence.resource),
                  HINT = 'A newer holder has written this resource; this writer lost its lease and must not write.';
    END IF;
    -- Otherwise ON CONFLICT waits for a concurrent first writer and evaluates
    -- its WHERE on the newest version after the row lock: one statement
    -- decides, no retry loop.
    INSERT INTO pgfence.fences AS f (resource, token, op)
    VALUES (fence.resource, fence.token, fence.op)
    ON CONFLICT (resource) DO UPDATE
       SET token = excluded.token, accepted_at = clock_timestamp(), writes = f.writes + 1,
           op = excluded.op, fenced_xid = pg_current_xact_id()
     WHERE f.token <= excluded.token;
    IF FOUND THEN
        RETURN fence.token;
    END IF;
    -- Stale: a higher token committed while we waited. The row is locked by
    -- us now and this read (a new snapshot) sees it.
    SELECT f.token INTO accepted FROM pgfence.fences f WHERE f.resource = fence.resource;
    RAISE EXCEPTION 'pgfence: stale token % for resource %: token % was accepted', fence.token, quote_literal(fence.resource), accepted
        USING ERRCODE = 'PF001',
              DETAIL = format('accepted=%s presented=%s resource=%s', accepted, fence.token, fence.resource),
              HINT = 'A newer holder has written this resource; this writer lost its lease and must not write.';
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE pgfence.leases SET (fillfactor = 80);
-- +goose StatementEnd

-- The row invariants of pgfence.idempotency_keys, in one plpgsql call.
-- PostgreSQL rebuilds (parses and plans) every CHECK expression for each
-- INSERT and UPDATE statement; the two large CHECKs of 00004 cost ~40 µs per
-- statement that way, and every atomic key writes its row twice. A plpgsql
-- function keeps its compiled expressions for the session, so the same
-- conditions cost a function call. They are the conditions of 00004's
-- sane_sizes and valid_state, unchanged.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_key_valid(k pgfence.idempotency_keys) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
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
-- +goose StatementEnd

-- NOT VALID: existing rows already passed the same conditions (the two
-- constraints replaced here), so the migration does not rescan the table
-- under its lock; every new and updated row is checked.
-- +goose StatementBegin
ALTER TABLE pgfence.idempotency_keys
    DROP CONSTRAINT sane_sizes,
    DROP CONSTRAINT valid_state,
    ADD CONSTRAINT valid_row CHECK (pgfence.idempotency_key_valid(idempotency_keys)) NOT VALID;
-- +goose StatementEnd

-- pgfence.fences: the same rules, checked without per-statement planning.
-- Trigger WHEN clauses and CHECK expressions are read back from the catalog
-- and planned again for every statement that updates the table (~75k and
-- ~60k CPU instructions per fenced write, measured with callgrind): the two
-- BEFORE UPDATE triggers become one plpgsql trigger without a WHEN clause, and
-- the three CHECKs one CHECK calling a plpgsql function (plpgsql keeps its
-- compiled expressions for the session).
-- +goose StatementBegin
CREATE FUNCTION pgfence.fences_before_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- fences_monotonic of 00003: a stale writer must not reset the fence.
    IF NEW.token < OLD.token OR NEW.resource <> OLD.resource THEN
        RAISE EXCEPTION 'pgfence: token for resource % may not be lowered from % to %', OLD.resource, OLD.token, NEW.token
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', OLD.token, NEW.token, OLD.resource);
    END IF;
    -- fences_trace_id of 00005: an UPDATE that does not set trace_id itself
    -- takes the current transaction's trace id.
    IF (OLD.trace_id IS NOT NULL OR current_setting('pgfence.trace_id', true) <> '')
       AND NEW.trace_id IS NOT DISTINCT FROM OLD.trace_id THEN
        NEW.trace_id := pgfence.current_trace_id();
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DROP TRIGGER fences_monotonic ON pgfence.fences;
-- +goose StatementEnd
-- +goose StatementBegin
DROP TRIGGER fences_trace_id ON pgfence.fences;
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.fences_set_trace_id();
-- +goose StatementEnd
-- +goose StatementBegin
CREATE TRIGGER fences_before_update BEFORE UPDATE ON pgfence.fences
    FOR EACH ROW EXECUTE FUNCTION pgfence.fences_before_update();
-- +goose StatementEnd

-- The column CHECKs of 00003, unchanged, in one call.
-- +goose StatementBegin
CREATE FUNCTION pgfence.fence_row_valid(f pgfence.fences) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN octet_length(f.resource) BETWEEN 1 AND 512 AND f.token > 0 AND f.writes >= 0;
END;
$$;
-- +goose StatementEnd

-- NOT VALID: every existing row passed the identical constraints.
-- +goose StatementBegin
ALTER TABLE pgfence.fences
    DROP CONSTRAINT fences_resource_check,
    DROP CONSTRAINT fences_token_check,
    DROP CONSTRAINT fences_writes_check,
    ADD CONSTRAINT valid_row CHECK (pgfence.fence_row_valid(fences)) NOT VALID;
-- +goose StatementEnd

-- pgfence.leases and pgfence.lease_events: their ten CHECKs were planned
-- again for every row written (callgrind: ~550k of the 2.1M instructions of
-- one grant + release, which writes each table twice). The same conditions,
-- in one plpgsql call per table; NOT VALID because every existing row passed
-- the identical constraints.
-- +goose StatementBegin
CREATE FUNCTION pgfence.lease_row_valid(l pgfence.leases) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN octet_length(l.key) BETWEEN 1 AND 512 AND l.token > 0 AND octet_length(l.holder_info) <= 1024
       AND l.expires_at >= l.granted_at
       AND (l.renewed_at IS NULL OR l.renewed_at >= l.granted_at)
       AND (l.released_at IS NULL OR l.released_at >= l.granted_at);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE pgfence.leases
    DROP CONSTRAINT leases_key_check,
    DROP CONSTRAINT leases_token_check,
    DROP CONSTRAINT leases_holder_info_check,
    DROP CONSTRAINT leases_check,
    DROP CONSTRAINT leases_check1,
    DROP CONSTRAINT leases_check2,
    ADD CONSTRAINT valid_row CHECK (pgfence.lease_row_valid(leases)) NOT VALID;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgfence.lease_event_valid(e pgfence.lease_events) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN octet_length(e.key) BETWEEN 1 AND 512
       AND e.event IN ('acquired', 'taken_over', 'released', 'force_released', 'expired')
       AND e.token > 0
       AND (e.reason IS NULL OR length(e.reason) BETWEEN 1 AND 1000);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE pgfence.lease_events
    DROP CONSTRAINT lease_events_key_check,
    DROP CONSTRAINT lease_events_event_check,
    DROP CONSTRAINT lease_events_token_check,
    DROP CONSTRAINT lease_events_reason_check,
    ADD CONSTRAINT valid_row CHECK (pgfence.lease_event_valid(lease_events)) NOT VALID;
-- +goose StatementEnd

-- +goose Down

-- +goose StatementBegin
ALTER TABLE pgfence.lease_events
    DROP CONSTRAINT valid_row,
    ADD CONSTRAINT lease_events_key_check CHECK (octet_length(key) BETWEEN 1 AND 512),
    ADD CONSTRAINT lease_events_event_check CHECK (event IN ('acquired', 'taken_over', 'released', 'force_released', 'expired')),
    ADD CONSTRAINT lease_events_token_check CHECK (token > 0),
    ADD CONSTRAINT lease_events_reason_check CHECK (reason IS NULL OR length(reason) BETWEEN 1 AND 1000);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.lease_event_valid(pgfence.lease_events);
-- +goose StatementEnd
-- +goose StatementBegin
ALTER TABLE pgfence.leases
    DROP CONSTRAINT valid_row,
    ADD CONSTRAINT leases_key_check CHECK (octet_length(key) BETWEEN 1 AND 512),
    ADD CONSTRAINT leases_token_check CHECK (token > 0),
    ADD CONSTRAINT leases_holder_info_check CHECK (octet_length(holder_info) <= 1024),
    ADD CONSTRAINT leases_check CHECK (expires_at >= granted_at),
    ADD CONSTRAINT leases_check1 CHECK (renewed_at IS NULL OR renewed_at >= granted_at),
    ADD CONSTRAINT leases_check2 CHECK (released_at IS NULL OR released_at >= granted_at);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.lease_row_valid(pgfence.leases);
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE pgfence.fences
    DROP CONSTRAINT valid_row,
    ADD CONSTRAINT fences_resource_check CHECK (octet_length(resource) BETWEEN 1 AND 512),
    ADD CONSTRAINT fences_token_check CHECK (token > 0),
    ADD CONSTRAINT fences_writes_check CHECK (writes >= 0);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.fence_row_valid(pgfence.fences);
-- +goose StatementEnd

-- +goose StatementBegin
DROP TRIGGER fences_before_update ON pgfence.fences;
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.fences_before_update();
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION pgfence.fences_set_trace_id() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.trace_id IS NOT DISTINCT FROM OLD.trace_id THEN
        NEW.trace_id := pgfence.current_trace_id();
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE TRIGGER fences_trace_id BEFORE UPDATE ON pgfence.fences
    FOR EACH ROW
    WHEN (OLD.trace_id IS NOT NULL OR current_setting('pgfence.trace_id', true) <> '')
    EXECUTE FUNCTION pgfence.fences_set_trace_id();
-- +goose StatementEnd
-- +goose StatementBegin
CREATE TRIGGER fences_monotonic BEFORE UPDATE ON pgfence.fences
    FOR EACH ROW WHEN (NEW.token < OLD.token OR NEW.resource <> OLD.resource)
    EXECUTE FUNCTION pgfence.reject_fence_change();
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE pgfence.idempotency_keys
    DROP CONSTRAINT valid_row,
    ADD CONSTRAINT sane_sizes CHECK (octet_length(scope) BETWEEN 1 AND 512 AND octet_length(key) BETWEEN 1 AND 512
                                     AND octet_length(fingerprint) BETWEEN 16 AND 64 AND epoch >= 1),
    ADD CONSTRAINT valid_state CHECK (CASE status
        WHEN 'in_progress' THEN completed_at IS NULL AND expires_at IS NULL AND result IS NULL AND failure_code IS NULL
             AND CASE mode WHEN 'atomic' THEN owner IS NULL AND lease_expires_at IS NULL AND recovery_data IS NULL
                           WHEN 'leased' THEN lease_expires_at IS NOT NULL
                           ELSE false END
        WHEN 'succeeded' THEN coalesce(expires_at > completed_at, false) AND result IS NOT NULL AND failure_code IS NULL
             AND failure_message IS NULL AND owner IS NULL AND lease_expires_at IS NULL AND mode IN ('atomic', 'leased')
        WHEN 'failed' THEN coalesce(expires_at > completed_at, false) AND failure_code IS NOT NULL
             AND owner IS NULL AND lease_expires_at IS NULL AND mode IN ('atomic', 'leased')
        ELSE false END);
-- +goose StatementEnd

-- +goose StatementBegin
DROP FUNCTION pgfence.idempotency_key_valid(pgfence.idempotency_keys);
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE pgfence.leases RESET (fillfactor);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.fence(resource text, token bigint, op uuid DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    accepted bigint;
BEGIN
    IF fence.resource IS NULL OR octet_length(fence.resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF fence.token IS NULL OR fence.token <= 0 THEN
        RAISE EXCEPTION 'pgfence: token must be positive, got %', fence.token USING ERRCODE = 'PF008';
    END IF;
    -- An accepted token must survive a crash as long as the write it guards.
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    -- Fast path: a plain UPDATE. Its WHERE depends only on the row's content,
    -- and under READ COMMITTED a row changed by a concurrent writer is waited
    -- for and re-checked on its newest version, so a higher token committed
    -- meanwhile is never overwritten. The row stays locked until our
    -- transaction ends.
    FOR attempt IN 1..5 LOOP
        UPDATE pgfence.fences AS f
           SET token = fence.token, accepted_at = clock_timestamp(), writes = f.writes + 1,
               op = fence.op, fenced_xid = pg_current_xact_id()
         WHERE f.resource = fence.resource AND f.token <= fence.token;
        IF FOUND THEN
            RETURN fence.token;
        END IF;
        -- Stale, or a resource never fenced. This read takes a new snapshot: it
        -- sees every committed token.
        SELECT f.token INTO accepted FROM pgfence.fences f WHERE f.resource = fence.resource;
        IF FOUND AND accepted > fence.token THEN
            RAISE EXCEPTION 'pgfence: stale token % for resource %: token % was accepted', fence.token, quote_literal(fence.resource), accepted
                USING ERRCODE = 'PF001',
                      DETAIL = format('accepted=%s presented=%s resource=%s', accepted, fence.token, fence.resource),
                      HINT = 'A newer holder has written this resource; this writer lost its lease and must not write.';
        END IF;
        IF NOT FOUND THEN
            -- Waits for a concurrent first writer of the resource; if that one
            -- commits, the next round compares with its token.
            INSERT INTO pgfence.fences (resource, token, op) VALUES (fence.resource, fence.token, fence.op)
                ON CONFLICT (resource) DO NOTHING;
            IF FOUND THEN
                RETURN fence.token;
            END IF;
        END IF;
        -- The row was committed by a concurrent writer after our UPDATE
        -- started: try again against it.
    END LOOP;
    RAISE EXCEPTION 'pgfence: fence row for resource % keeps changing; try again', quote_literal(fence.resource)
        USING ERRCODE = '40001';
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.current_trace_id() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN s ~ '^[0-9a-f]{32}$' AND s <> '00000000000000000000000000000000' THEN s END
      FROM current_setting('pgfence.trace_id', true) AS s
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.next_token(previous bigint) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT greatest(coalesce(previous, 0) + 1,
                    (pgfence.token_epoch() << 40) + 1,
                    (SELECT f.floor FROM pgfence.token_floor f) + 1);
$$;
-- +goose StatementEnd
