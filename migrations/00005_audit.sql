-- pgfence audit: the trace id of the request that caused a lease event or
-- the last accepted fenced write, stored beside it, so that one query joins a
-- lock grant to the business write it protected:
--
--   SELECT e.key, e.event, e.token AS lease_token, e.at, f.resource, f.token AS fence_token, f.accepted_at
--     FROM pgfence.lease_events e JOIN pgfence.fences f USING (trace_id)
--    WHERE e.trace_id = '4bf92f3577b34da6a3ce929d0e0e4736';
--
-- A client names its trace for the current transaction only:
--
--   SELECT set_config('pgfence.trace_id', '4bf92f3577b34da6a3ce929d0e0e4736', true);
--
-- (the Go packages do it in the same pipeline as the statement when the
-- context carries a valid OpenTelemetry span context: no extra round trip).
-- Anything but 32 lowercase hex digits is ignored (stored as NULL): a bad
-- setting never makes a grant or a write fail. pgfence.fences keeps one row
-- per resource, so it holds the trace id of the last accepted write; rejected
-- writes roll back with their transaction and are recorded by the clients as
-- span events and metrics, not here.
--
--   pgfence.current_trace_id() -> text   the setting if well-formed, else NULL
--
-- Cost: lease_events gets the trace id through a column default (no trigger);
-- pgfence.fences through the same default and a BEFORE UPDATE trigger that
-- runs only when a trace id is set or must be cleared (one plpgsql call per
-- traced write; none while nobody traces). fences.trace_id is deliberately
-- not indexed, so fence updates stay HOT.

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION pgfence.current_trace_id() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN s ~ '^[0-9a-f]{32}$' AND s <> '00000000000000000000000000000000' THEN s END
      FROM current_setting('pgfence.trace_id', true) AS s
$$;
-- +goose StatementEnd

ALTER TABLE pgfence.lease_events ADD COLUMN trace_id text DEFAULT pgfence.current_trace_id();
CREATE INDEX lease_events_trace_id ON pgfence.lease_events (trace_id) WHERE trace_id IS NOT NULL;

ALTER TABLE pgfence.fences ADD COLUMN trace_id text DEFAULT pgfence.current_trace_id();

-- An UPDATE that does not set trace_id itself (pgfence.fence() accepting a
-- new write) takes the current transaction's trace id.
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

-- The WHEN clause keeps the untraced hot path free of a plpgsql call: the
-- trigger runs only when this transaction names a trace or the row carries
-- one to clear.
CREATE TRIGGER fences_trace_id BEFORE UPDATE ON pgfence.fences
    FOR EACH ROW
    WHEN (OLD.trace_id IS NOT NULL OR current_setting('pgfence.trace_id', true) <> '')
    EXECUTE FUNCTION pgfence.fences_set_trace_id();

-- +goose Down
DROP TRIGGER fences_trace_id ON pgfence.fences;
DROP FUNCTION pgfence.fences_set_trace_id();
ALTER TABLE pgfence.fences DROP COLUMN trace_id;
DROP INDEX pgfence.lease_events_trace_id;
ALTER TABLE pgfence.lease_events DROP COLUMN trace_id;
DROP FUNCTION pgfence.current_trace_id();
