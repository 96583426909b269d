-- pgfence audit, part two: rejected fenced writes, and the trace of the claim
-- that owns an idempotency key.
--
-- A rejected fenced write rolls back with its transaction, so it cannot leave
-- a row in that transaction. The Go helpers (package pgfence) record it
-- afterwards, best effort, in one extra statement that runs only on a
-- rejection, when the write ran in its own transaction (not inside a
-- caller's pgx.Tx, whose transaction the rejection aborts):
--
--   pgfence.record_fence_rejection(resource, presented_token, accepted_token,
--       reason, lease_reason, operation, op, trace_id) -> void
--   pgfence.prune_fence_rejections(max_age DEFAULT '7 days') -> bigint
--
-- The row is an audit hint, not a guarantee: the function commits with
-- synchronous_commit off (a crash may forget the newest rows; it never waits
-- for a flush) and never raises for a malformed trace id (stored as NULL).
-- Every 128th row it prunes the rows older than 7 days, at most 1000 at a
-- time, by scanning the oldest ids only (ids and timestamps grow together),
-- so there is no index on the timestamp alone and no background job.
--
-- Any other client can call it after its own rejected write (outside the
-- rejected transaction, or in a fresh one). Other clients' rows carry the
-- trace id they pass, else the transaction's pgfence.trace_id setting
-- (pgfence.current_trace_id(), migration 00005).
--
-- One query then follows a trace from its lease grant to the write it got
-- accepted and to the writes that were refused (README, "Audit"):
--
--   SELECT e.key, e.event, e.token AS lease_token, f.resource, f.token AS accepted_token,
--          r.resource AS rejected_resource, r.presented_token, r.accepted_token AS rejected_by, r.reason
--     FROM pgfence.lease_events e
--     LEFT JOIN pgfence.fences f ON f.trace_id = e.trace_id
--     LEFT JOIN pgfence.fence_rejections r ON r.trace_id = e.trace_id
--    WHERE e.trace_id = $1 AND e.event IN ('acquired', 'taken_over');
--
-- pgfence.idempotency_keys.trace_id is the trace of the claim that created or
-- last took over (or reused) the key: a column default on INSERT, and on
-- UPDATE a trigger that fires only when a claim bumps the epoch (heartbeats,
-- recovery points and completions do not fire it).

-- +goose Up

-- +goose StatementBegin
CREATE TABLE pgfence.fence_rejections (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource        text        NOT NULL CHECK (length(resource) BETWEEN 1 AND 1024),
    presented_token bigint      NOT NULL,
    accepted_token  bigint,
    reason          text        NOT NULL CHECK (reason IN ('stale_token', 'lease_not_held')),
    lease_reason    text        CHECK (lease_reason IN ('missing', 'taken_over', 'released', 'expired')),
    operation       text        CHECK (length(operation) <= 64),
    op              uuid,
    trace_id        text        CHECK (trace_id ~ '^[0-9a-f]{32}$'),
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- +goose StatementEnd

CREATE INDEX fence_rejections_resource_at ON pgfence.fence_rejections (resource, at DESC);
CREATE INDEX fence_rejections_trace_id ON pgfence.fence_rejections (trace_id) WHERE trace_id IS NOT NULL;

-- prune_fence_rejections deletes up to 1000 of the oldest rows older than
-- p_max_age and returns how many it deleted. It reads the 1000 lowest ids
-- only, so it costs the same however large the table is.
-- +goose StatementBegin
CREATE FUNCTION pgfence.prune_fence_rejections(p_max_age interval DEFAULT interval '7 days')
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_deleted bigint;
BEGIN
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
-- +goose StatementEnd

-- record_fence_rejection stores one rejected fenced write. It lowers
-- synchronous_commit to off only while its transaction has written nothing
-- else, so a write made before it keeps its durability; but the setting holds
-- until the transaction ends, so writes made after it in the same transaction
-- commit non-durably too. Call it in a transaction of its own, as the Go
-- helpers do.
-- +goose StatementBegin
CREATE FUNCTION pgfence.record_fence_rejection(
    p_resource text, p_presented_token bigint, p_accepted_token bigint, p_reason text,
    p_lease_reason text DEFAULT NULL, p_operation text DEFAULT NULL, p_op uuid DEFAULT NULL,
    p_trace_id text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id bigint;
BEGIN
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
$$;
-- +goose StatementEnd

ALTER TABLE pgfence.idempotency_keys ADD COLUMN trace_id text DEFAULT pgfence.current_trace_id();

-- A claim that takes a key over or reuses an expired one bumps the epoch: it
-- takes the current transaction's trace id (NULL when untraced).
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_keys_set_trace_id() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.trace_id := pgfence.current_trace_id();
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER idempotency_keys_trace_id BEFORE UPDATE ON pgfence.idempotency_keys
    FOR EACH ROW
    WHEN (NEW.epoch IS DISTINCT FROM OLD.epoch)
    EXECUTE FUNCTION pgfence.idempotency_keys_set_trace_id();

-- +goose Down
DROP TRIGGER idempotency_keys_trace_id ON pgfence.idempotency_keys;
DROP FUNCTION pgfence.idempotency_keys_set_trace_id();
ALTER TABLE pgfence.idempotency_keys DROP COLUMN trace_id;
-- +goose StatementBegin
DROP FUNCTION pgfence.record_fence_rejection(text, bigint, bigint, text, text, text, uuid, text);
-- +goose StatementEnd
DROP FUNCTION pgfence.prune_fence_rejections(interval);
DROP TABLE pgfence.fence_rejections;
