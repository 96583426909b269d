-- A waiter queue for fair leases: Acquire with AcquireOptions.Fair takes its
-- turn here before it tries the lease, so waiters across clients and
-- processes are granted in arrival order. A waiter that stops polling for its
-- patience leaves the queue (its row expires), so a crashed waiter never
-- blocks the others for long. Waiter rows are not durable: a crash forgets the
-- queue, which only costs fairness, never safety.

-- +goose Up
-- +goose StatementBegin
CREATE TABLE pgfence.lease_waiters (
    key          text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 512),
    waiter       uuid        NOT NULL,
    enqueued_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (key, waiter),
    CHECK (expires_at > enqueued_at)
);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE INDEX lease_waiters_order ON pgfence.lease_waiters (key, enqueued_at, waiter);
-- +goose StatementEnd

-- lease_queue_turn enqueues p_waiter for p_key (or refreshes its place for
-- another p_patience) and returns how many live waiters are ahead of it: 0
-- means it is its turn to try pgfence.try_acquire.
-- +goose StatementBegin
CREATE FUNCTION pgfence.lease_queue_turn(p_key text, p_waiter uuid, p_patience interval)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    my_enqueued timestamptz;
    ahead       bigint;
BEGIN
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 OR p_waiter IS NULL
       OR p_patience IS NULL OR p_patience <= interval '0' THEN
        RAISE EXCEPTION 'pgfence: lease_queue_turn needs a key (1 to 512 bytes), a waiter id and a positive patience'
            USING ERRCODE = 'PF008';
    END IF;
    -- Queue positions need no durability: losing them in a crash costs
    -- fairness only.
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM pgfence.lease_waiters w WHERE w.key = p_key AND w.expires_at <= clock_timestamp();
    INSERT INTO pgfence.lease_waiters AS w (key, waiter, expires_at)
    VALUES (p_key, p_waiter, clock_timestamp() + p_patience)
    ON CONFLICT (key, waiter) DO UPDATE SET expires_at = clock_timestamp() + p_patience
    RETURNING w.enqueued_at INTO my_enqueued;
    SELECT count(*) INTO ahead
      FROM pgfence.lease_waiters w
     WHERE w.key = p_key AND w.expires_at > clock_timestamp()
       AND (w.enqueued_at, w.waiter) < (my_enqueued, p_waiter);
    RETURN ahead;
END;
$$;
-- +goose StatementEnd

-- lease_queue_leave removes p_waiter from p_key's queue (granted or gave up).
-- +goose StatementBegin
CREATE FUNCTION pgfence.lease_queue_leave(p_key text, p_waiter uuid) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    WITH gone AS (DELETE FROM pgfence.lease_waiters WHERE key = p_key AND waiter = p_waiter RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM gone);
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP FUNCTION pgfence.lease_queue_leave(text, uuid);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.lease_queue_turn(text, uuid, interval);
-- +goose StatementEnd
-- +goose StatementBegin
DROP TABLE pgfence.lease_waiters;
-- +goose StatementEnd
