-- pgfence leases: the SQL surface of the lease protocol.
--
-- These functions are the one source of truth: the Go package "leases" calls
-- them, and a worker in any other language takes part in the same protocol by
-- calling them with a plain SQL client.
--
--   pgfence.try_acquire(key, ttl, holder_info DEFAULT '', holder DEFAULT NULL,
--                       client_version DEFAULT NULL, announce DEFAULT false)
--       -> (acquired, holder, token, granted_at, expires_at, remaining)
--   pgfence.acquire(key, ttl, holder_info DEFAULT '', holder DEFAULT NULL, client_version DEFAULT NULL)
--       -> (holder, token, granted_at, expires_at)            raises PF003 when held
--   pgfence.renew(key, holder, token, ttl)
--       -> (token, expires_at, remaining)                     raises PF002 when lost
--   pgfence.release(key, holder, token, durable DEFAULT true)
--       -> (released, status)    status: released | expired | already_released | not_held
--   pgfence.force_release(key, reason) -> (released, holder, token, was_live)
--   pgfence.prune_lease_events(key DEFAULT NULL, keep DEFAULT 100) -> bigint
--   pgfence.lease_queue_turn(key, waiter, patience) -> bigint (waiters ahead)
--   pgfence.lease_queue_leave(key, waiter) -> boolean
--   pgfence.pause_grants(prefix, reason) -> boolean
--   pgfence.resume_grants(prefix, reason DEFAULT NULL) -> boolean
--   pgfence.lease_max_ttl() -> interval
--   pgfence.set_holder_info(key, holder, token, holder_info) -> timestamptz
--                                                             raises PF002 when lost
--   pgfence.job_slot_begin(key, holder, token, slot, restart DEFAULT false)
--       -> (completed, runs, checkpoint, previous_token, started_at, completed_at)
--   pgfence.job_slot_save(key, holder, token, slot, checkpoint) -> timestamptz
--   pgfence.job_slot_complete(key, holder, token, slot) -> timestamptz
--   pgfence.job_slot_missed(key, holder, token, before, period) -> text[] (the missed slots)
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
--     upsert, and the grant takes the lease row's lock with SKIP LOCKED, so
--     attempts that meet another grant in progress are turned away
--     (acquired = false, remaining 0) instead of queueing on its row lock, and
--     a hot key's losers cost a read, not a WAL flush. Nothing a grant
--     consults can be taken by a role not granted the key: no advisory lock
--     (one namespace for every role), only row locks on pgfence.leases,
--     which need UPDATE on it, and pgfence's functions take them only for a
--     caller granted the key.
--   * Grants and renewals force synchronous_commit to at least "on" for their
--     transaction: a grant lost in a crash could hand out its token twice, a lost
--     renewal could make the holder trust an expiry the database forgot.
--   * A release may commit with synchronous_commit = off (durable => false): a
--     release lost in a crash only delays the next holder until the lease
--     expires, and any later durable commit (such as the next grant) flushes it.
--   * A release and a force-release send NOTIFY pgfence_lease_released with the
--     key as payload, so waiters wake up without polling. Expiry sends nothing.
--   * Every transition appends a row to pgfence.lease_events; every 32nd grant of
--     a key prunes its history to the newest 100 events. Grants record the
--     holder_info they were given; set_holder_info records info_changed
--     (one per grant: a newer change replaces the grant's previous one).
--   * set_holder_info sends NOTIFY pgfence_lease_changed with the payload
--     'info_changed:<remaining µs>:<key>'. A holder may announce its renewals on
--     the same channel with pgfence.announce_renewal, which signs them, so
--     that followers move their timers to the new expiry instead of reading.
--   * Functions that act for a grant without renewing or releasing it
--     (set_holder_info, job_slot_*) take the lease row's lock and check holder,
--     token and expiry by the database clock first (require_lease), like
--     check_lease: a lost grant gets PF002.
--   * Errors: PF008 invalid argument, PF002 lease not held (renew), PF003 lease
--     held by another holder (acquire), PF011 new grants paused; messages name
--     the key, holder and token.
--
-- Wake-ups that do not stampede. Every client waiting for a key tries to
-- acquire it when it hears the release: with N waiting clients a release
-- costs N attempts of which one wins. A waiter that has already lost a race
-- for the key passes announce => true, and its grant then sends NOTIFY
-- pgfence_lease_granted with the payload "<lease length in microseconds>:<key>".
-- The Go client spreads the attempts of woken waiters over a short random
-- window that adapts to how often it loses, and a waiter that hears the grant
-- before its turn goes back to sleep until the next release, or until that
-- lease would expire, without sending anything. Uncontended grants pass false
-- and notify nobody: a NOTIFY serialises commits that send one.
-- resume_grants wakes every waiter (NOTIFY pgfence_lease_released with an
-- empty payload) instead of leaving them to notice at their next poll. The
-- notifications are hints: the database still decides every grant, and a
-- client that misses them falls back to polling.
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

-- +goose Up
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- The row checks of the lease rows and their history that look at one
-- column, as domains (see pgfence.key_name): PostgreSQL keeps a domain's
-- checks compiled, where a function-backed CHECK runs a PL/pgSQL frame for
-- every row written (lease_events now runs none), and a CHECK expression is
-- read back and planned for every statement that writes the table.
-- lease_event_kind is what happened to a grant.
-- +goose StatementBegin
CREATE DOMAIN pgfence.lease_event_kind AS text
    CHECK (VALUE IN ('acquired', 'taken_over', 'released', 'force_released', 'expired', 'info_changed'));
-- +goose StatementEnd

-- lease_reason is why: 1 to 1000 characters (NULL passes: no reason).
-- +goose StatementBegin
CREATE DOMAIN pgfence.lease_reason AS text CHECK (length(VALUE) BETWEEN 1 AND 1000);
-- +goose StatementEnd

-- holder_info is a holder's description: at most 1024 bytes.
-- +goose StatementBegin
CREATE DOMAIN pgfence.holder_info AS text CHECK (octet_length(VALUE) <= 1024);
-- +goose StatementEnd

-- Lease rows. A row is created by the first grant for a key and is never deleted
-- while tokens matter: "token" is the last token issued for the key and the next
-- grant draws next_token(token) in the same statement that stores it.
--
-- A lease is live iff released_at IS NULL AND expires_at > clock_timestamp().
-- Only the database clock decides; holder is the random id of the current (or
-- last) grant and must be presented to renew or release it.
--
-- fillfactor 80: every grant and release updates its key's row, and free room
-- on the page keeps those updates HOT (no index entry, no table growth under
-- churn).
-- +goose StatementBegin
CREATE TABLE pgfence.leases (
    key            pgfence.key_name    PRIMARY KEY,
    holder         uuid                NOT NULL,
    token          pgfence.token_value NOT NULL,
    granted_at     timestamptz         NOT NULL,
    renewed_at     timestamptz,
    expires_at     timestamptz         NOT NULL,
    released_at    timestamptz,
    holder_info    pgfence.holder_info NOT NULL DEFAULT '',
    client_version text
) WITH (fillfactor = 80);
-- +goose StatementEnd

-- Grant history: one row per transition, bounded by pruning (see the leases
-- package). It outlives the lease rows on purpose.
--
-- Every read of it names a key, so (key, id) is its only index besides the
-- traces': id is unique by its identity (GENERATED ALWAYS, and only pgfence's
-- functions insert), and a primary key index on it would be a third index
-- entry for every event, two per grant + release, that no query reads.
-- +goose StatementBegin
CREATE TABLE pgfence.lease_events (
    id             bigint                   GENERATED ALWAYS AS IDENTITY,
    key            pgfence.key_name         NOT NULL,
    event          pgfence.lease_event_kind NOT NULL,
    holder         uuid                     NOT NULL,
    token          pgfence.token_value      NOT NULL,
    at             timestamptz              NOT NULL DEFAULT clock_timestamp(),
    reason         pgfence.lease_reason,
    trace_id       text                     DEFAULT pgfence.current_trace_id(),
    client_version text,
    holder_info    pgfence.holder_info
);
-- +goose StatementEnd

CREATE INDEX lease_events_key_id ON pgfence.lease_events (key, id);
CREATE INDEX lease_events_trace_id ON pgfence.lease_events (trace_id) WHERE trace_id IS NOT NULL;

-- The invariant of a lease row that compares columns: a grant's times do not
-- go back before it. One plpgsql call per row: as a CHECK expression it was
-- read back and planned for every statement that writes the table, which
-- cost more than the call (callgrind, leases case: 909k instructions per
-- grant + release against 852k).
-- NOT VALID: PostgreSQL checks every row inserted or updated once the
-- constraint exists; NOT VALID only records that rows already there were not
-- scanned.
-- +goose StatementBegin
CREATE FUNCTION pgfence.lease_row_valid(l pgfence.leases) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN l.expires_at >= l.granted_at
       AND (l.renewed_at IS NULL OR l.renewed_at >= l.granted_at)
       AND (l.released_at IS NULL OR l.released_at >= l.granted_at);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE pgfence.leases
    ADD CONSTRAINT valid_row CHECK (pgfence.lease_row_valid(leases)) NOT VALID;
-- +goose StatementEnd

-- A waiter queue for fair leases: Acquire with AcquireOptions.Fair takes its
-- turn here before it tries the lease, so waiters across clients and
-- processes are granted in arrival order. A waiter that stops polling for its
-- patience leaves the queue (its row expires), so a crashed waiter never
-- blocks the others for long. Waiter rows are not durable: a crash forgets the
-- queue, which only costs fairness, never safety.
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

-- Job slots: one row per slot of a periodic job that a run started, keyed by
-- the job's lease key (see job_slot_begin). A slot is completed once, by the
-- run whose transaction called job_slot_complete; an unfinished slot is taken
-- over by the next grant of the job's lease. runs = 0: a missed slot, which no
-- run began (job_slot_missed); started_at is then when it was recorded.
-- Retention: the newest 1000 slots of each job (by start); an older slot
-- counts as never run.
-- +goose StatementBegin
CREATE TABLE pgfence.job_slots (
    key          text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 512),
    slot         text        NOT NULL CHECK (octet_length(slot) BETWEEN 1 AND 256),
    holder       uuid        NOT NULL,
    token        bigint      NOT NULL CHECK (token > 0),
    runs         integer     NOT NULL CHECK (runs >= 0),
    started_at   timestamptz NOT NULL,
    run_at       timestamptz NOT NULL,
    checkpoint   text        CHECK (octet_length(checkpoint) <= 65536),
    saved_at     timestamptz,
    completed_at timestamptz,
    PRIMARY KEY (key, slot)
);
-- +goose StatementEnd

CREATE INDEX job_slots_key_started ON pgfence.job_slots (key, started_at, slot);

-- lease_max_ttl is the longest ttl a grant or a renewal accepts.
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
-- +goose StatementEnd

-- prune_lease_events keeps the newest p_keep events of p_key (of every key when
-- p_key is NULL) and returns how many it deleted.
-- +goose StatementBegin
CREATE FUNCTION pgfence.prune_lease_events(p_key text DEFAULT NULL, p_keep integer DEFAULT 100)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- raise_grants_paused raises PF011 for p_key, naming the longest paused
-- prefix that matches it. try_acquire calls it only when a pause matches.
-- +goose StatementBegin
CREATE FUNCTION pgfence.raise_grants_paused(p_key text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- resume_grants lifts the pause of exactly p_prefix and returns whether there
-- was one, and wakes every waiter. Operator only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.resume_grants(p_prefix text, p_reason text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- lease_queue_turn enqueues p_waiter for p_key (or refreshes its place for
-- another p_patience) and returns how many live waiters are ahead of it: 0
-- means it is its turn to try pgfence.try_acquire.
-- +goose StatementBegin
CREATE FUNCTION pgfence.lease_queue_turn(p_key text, p_waiter uuid, p_patience interval)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- lease_queue_leave removes p_waiter from p_key's queue (granted or gave up).
-- +goose StatementBegin
CREATE FUNCTION pgfence.lease_queue_leave(p_key text, p_waiter uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- try_acquire grants the lease on p_key for p_ttl when nobody holds it, in one
-- statement, with a fresh holder id (p_holder, or a random one) and the next
-- token. When another holder has it, it writes nothing and returns
-- acquired = false with the time that holder has left. It checks the kill
-- switches first, and with p_announce it tells the other waiters about the
-- grant (see the header).
-- +goose StatementBegin
CREATE FUNCTION pgfence.try_acquire(p_key text, p_ttl interval, p_holder_info text DEFAULT '', p_holder uuid DEFAULT NULL,
                                    p_client_version text DEFAULT NULL, p_announce boolean DEFAULT false)
RETURNS TABLE (acquired boolean, holder uuid, token bigint, granted_at timestamptz, expires_at timestamptz, remaining interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- renew extends the lease to clock_timestamp() + p_ttl if (and only if) p_holder
-- still holds it with p_token and it has not expired. It locks the row first and
-- checks after the lock. Raises PF002 otherwise.
-- +goose StatementBegin
CREATE FUNCTION pgfence.renew(p_key text, p_holder uuid, p_token bigint, p_ttl interval)
RETURNS TABLE (token bigint, expires_at timestamptz, remaining interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- force_release ends whatever grant of p_key is not released yet, whoever holds
-- it, for an operator; p_reason is recorded in the history.
-- +goose StatementBegin
CREATE FUNCTION pgfence.force_release(p_key text, p_reason text)
RETURNS TABLE (released boolean, holder uuid, token bigint, was_live boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- abandon_grant gives up the grant attempt of p_holder on p_key, whose reply
-- its client lost (see pgfence.abandoned_requests): from its commit on, that
-- attempt is refused if it arrives. Then grant_probe tells, in a transaction
-- of its own, whether the attempt got there first. It returns false when the
-- attempt was abandoned before.
-- +goose StatementBegin
CREATE FUNCTION pgfence.abandon_grant(p_key text, p_holder uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.lease_check_args(p_key, NULL, NULL);
    PERFORM pgfence.require_granted('lease', p_key);
    RETURN pgfence.abandon_request('grant', p_key, p_holder);
END;
$$;
-- +goose StatementEnd

-- grant_probe waits for any transaction that holds (or is inserting) the lease
-- row of p_key, then returns the committed grant of p_holder, if the row holds
-- one: granted = false means the attempt of p_holder did not get the lease
-- (once abandon_grant committed, it never will). Its probe row is rolled back
-- inside the function: it changes nothing.
-- +goose StatementBegin
CREATE FUNCTION pgfence.grant_probe(p_key text, p_holder uuid)
RETURNS TABLE (granted boolean, token bigint, granted_at timestamptz, expires_at timestamptz, live boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- require_lease raises PF002 unless p_holder holds the live lease p_key with
-- p_token, by the database clock, and keeps the lease row locked until the
-- transaction ends: FOR SHARE (a takeover's ON CONFLICT DO UPDATE waits for
-- it), or FOR UPDATE when p_for_update (the caller changes the row). The
-- functions that act for a grant (set_holder_info, the job slot functions)
-- call it after their own argument checks; it is not granted to any role.
-- +goose StatementBegin
CREATE FUNCTION pgfence.require_lease(p_key text, p_holder uuid, p_token bigint, p_for_update boolean DEFAULT false)
RETURNS pgfence.leases LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- set_holder_info replaces the holder description of the live grant
-- (p_holder, p_token) of p_key: an elected leader publishes its address or
-- state this way. The change is recorded as an info_changed event (one per
-- grant: a newer change replaces the grant's previous one, so the history
-- stays bounded) and announced with NOTIFY pgfence_lease_changed,
-- 'info_changed:<remaining µs>:<key>'. It commits durably. PF002 when the
-- grant is not live any more, PF008 for arguments out of bounds. It returns
-- the change's time by the database clock.
-- +goose StatementBegin
CREATE FUNCTION pgfence.set_holder_info(p_key text, p_holder uuid, p_token bigint, p_holder_info text)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- job_check_args raises PF008 unless a job slot call's arguments are
-- acceptable (the key is checked by lease_check_args).
-- +goose StatementBegin
CREATE FUNCTION pgfence.job_check_args(p_key text, p_holder uuid, p_token bigint, p_slot text)
RETURNS void LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- job_slot_begin starts (or resumes) the run of slot p_slot of the job whose
-- lease is p_key, for the live grant (p_holder, p_token) of that lease. When
-- the slot was completed, it changes nothing and returns completed = true.
-- When an earlier grant started it and never completed it (its runner died
-- or lost the lease), this grant takes the run over: runs counts the runs,
-- previous_token names the grant that ran it last, and checkpoint is what
-- that run saved (job_slot_save), or NULL with p_restart. A missed slot
-- (job_slot_missed) is begun as run 1, without previous_token. Calling it
-- again with the same grant returns the same run. It commits durably. Each new
-- slot row prunes the job's rows beyond its newest 1000 slots (by start).
-- +goose StatementBegin
CREATE FUNCTION pgfence.job_slot_begin(p_key text, p_holder uuid, p_token bigint, p_slot text, p_restart boolean DEFAULT false)
RETURNS TABLE (completed boolean, runs integer, checkpoint text, previous_token bigint, started_at timestamptz, completed_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- job_slot_save records p_checkpoint (at most 64 kB) for the run of slot
-- p_slot by grant (p_holder, p_token): a run that takes it over later starts
-- from there. PF002 when the grant is not live, or the slot is not its run
-- (completed, or taken over). It returns the time by the database clock.
-- +goose StatementBegin
CREATE FUNCTION pgfence.job_slot_save(p_key text, p_holder uuid, p_token bigint, p_slot text, p_checkpoint text)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- job_slot_complete marks slot p_slot completed by the run of grant
-- (p_holder, p_token), in the caller's transaction: call it in the
-- transaction of the run's last write, and the slot is completed if and only
-- if that write commits. The lease row stays locked (FOR SHARE) until the
-- transaction ends, so no takeover commits in between, and a run whose lease
-- was lost is refused (PF002) with all it wrote. Completing a slot again with
-- the grant that completed it returns its completion time; a slot that is not
-- this grant's run (never begun by it, taken over, completed by another) is
-- refused with PF002. The transaction commits durably.
-- +goose StatementBegin
CREATE FUNCTION pgfence.job_slot_complete(p_key text, p_holder uuid, p_token bigint, p_slot text)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- job_slot_missed records as missed, for the live grant (p_holder, p_token)
-- of the job whose lease is p_key, the periods of length p_period before the
-- one that starts at p_before that have no slot, back to the job's newest slot
-- named like a period before it (its start in UTC, 'YYYY-MM-DDTHH:MI:SSZ'),
-- at most 999: periods in which no run began the slot. A missed slot has
-- runs = 0 and counts as unfinished; job_slot_begin runs it (run 1). It
-- returns the slots it found missed, oldest first (none for a job without an
-- earlier period slot).
-- +goose StatementBegin
CREATE FUNCTION pgfence.job_slot_missed(p_key text, p_holder uuid, p_token bigint, p_before timestamptz, p_period interval)
RETURNS text[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET timezone = 'UTC' AS $$
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
$$;
-- +goose StatementEnd

-- raise_not_slot_run raises PF002 for a slot that is not the run of token
-- p_token, saying whose it is.
-- +goose StatementBegin
CREATE FUNCTION pgfence.raise_not_slot_run(p_key text, p_slot text, p_token bigint) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- lease_status shows every lease row with its state by the database clock,
-- and the client version of the current (or last) grant.
-- +goose StatementBegin
CREATE VIEW pgfence.lease_status AS
SELECT l.key, l.holder, l.token, l.granted_at, l.renewed_at, l.expires_at, l.released_at, l.holder_info,
       (l.released_at IS NULL AND l.expires_at > clock_timestamp()) AS live,
       CASE WHEN l.released_at IS NULL THEN greatest(l.expires_at - clock_timestamp(), interval '0')
            ELSE interval '0' END AS remaining,
       l.client_version
FROM pgfence.leases l;
-- +goose StatementEnd

-- Nothing for PUBLIC (functions are created executable by everyone), then
-- each role gets exactly its list.
REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgfence FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;

-- Reads: both roles (the Go clients read lease rows and history back after
-- lost replies).
GRANT SELECT ON pgfence.leases, pgfence.lease_status, pgfence.lease_events, pgfence.lease_waiters,
                pgfence.grant_pauses, pgfence.grant_pause_events, pgfence.job_slots
   TO pgfence_app, pgfence_operator;

-- The protocol: both roles.
GRANT EXECUTE ON FUNCTION
    pgfence.try_acquire(text, interval, text, uuid, text, boolean),
    pgfence.acquire(text, interval, text, uuid, text),
    pgfence.renew(text, uuid, bigint, interval),
    pgfence.release(text, uuid, bigint, boolean),
    pgfence.lease_queue_turn(text, uuid, interval),
    pgfence.lease_queue_leave(text, uuid),
    pgfence.lease_max_ttl(),
    pgfence.abandon_grant(text, uuid),
    pgfence.grant_probe(text, uuid),
    pgfence.set_holder_info(text, uuid, bigint, text),
    pgfence.job_slot_begin(text, uuid, bigint, text, boolean),
    pgfence.job_slot_save(text, uuid, bigint, text, text),
    pgfence.job_slot_complete(text, uuid, bigint, text),
    pgfence.job_slot_missed(text, uuid, bigint, timestamptz, interval)
  TO pgfence_app, pgfence_operator;

-- Operations: the operator role only.
GRANT EXECUTE ON FUNCTION
    pgfence.force_release(text, text),
    pgfence.prune_lease_events(text, integer),
    pgfence.pause_grants(text, text),
    pgfence.resume_grants(text, text)
  TO pgfence_operator;

-- Row-level security: pgfence_app members see the rows of the names granted
-- to them (grant_prefix); operators see every row. The functions run as the
-- schema's owner, which row-level security does not restrict.
ALTER TABLE pgfence.leases ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.lease_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.lease_waiters ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.job_slots ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.grant_pauses ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.grant_pause_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY granted ON pgfence.leases FOR SELECT TO pgfence_app USING (pgfence.may_use(key));
CREATE POLICY granted ON pgfence.lease_events FOR SELECT TO pgfence_app USING (pgfence.may_use(key));
CREATE POLICY granted ON pgfence.lease_waiters FOR SELECT TO pgfence_app USING (pgfence.may_use(key));
CREATE POLICY granted ON pgfence.job_slots FOR SELECT TO pgfence_app USING (pgfence.may_use(key));
-- A pause shows to the roles that may use a key it pauses.
CREATE POLICY granted ON pgfence.grant_pauses FOR SELECT TO pgfence_app USING (pgfence.may_use_under(prefix));
CREATE POLICY granted ON pgfence.grant_pause_events FOR SELECT TO pgfence_app USING (pgfence.may_use_under(prefix));
CREATE POLICY operators ON pgfence.leases FOR SELECT TO pgfence_operator USING (true);
CREATE POLICY operators ON pgfence.lease_events FOR SELECT TO pgfence_operator USING (true);
CREATE POLICY operators ON pgfence.lease_waiters FOR SELECT TO pgfence_operator USING (true);
CREATE POLICY operators ON pgfence.job_slots FOR SELECT TO pgfence_operator USING (true);
CREATE POLICY operators ON pgfence.grant_pauses FOR SELECT TO pgfence_operator USING (true);
CREATE POLICY operators ON pgfence.grant_pause_events FOR SELECT TO pgfence_operator USING (true);
-- The view reads the table with the caller's rights, so the policies apply.
ALTER VIEW pgfence.lease_status SET (security_invoker = true);

-- +goose Down
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
DROP VIEW pgfence.lease_status;
DROP FUNCTION pgfence.raise_not_slot_run(text, text, bigint);
DROP FUNCTION pgfence.job_slot_missed(text, uuid, bigint, timestamptz, interval);
DROP FUNCTION pgfence.job_slot_complete(text, uuid, bigint, text);
DROP FUNCTION pgfence.job_slot_save(text, uuid, bigint, text, text);
DROP FUNCTION pgfence.job_slot_begin(text, uuid, bigint, text, boolean);
DROP FUNCTION pgfence.job_check_args(text, uuid, bigint, text);
DROP FUNCTION pgfence.set_holder_info(text, uuid, bigint, text);
DROP FUNCTION pgfence.require_lease(text, uuid, bigint, boolean);
DROP FUNCTION pgfence.grant_probe(text, uuid);
DROP FUNCTION pgfence.abandon_grant(text, uuid);
DROP FUNCTION pgfence.force_release(text, text);
DROP FUNCTION pgfence.release(text, uuid, bigint, boolean);
DROP FUNCTION pgfence.renew(text, uuid, bigint, interval);
DROP FUNCTION pgfence.acquire(text, interval, text, uuid, text);
DROP FUNCTION pgfence.try_acquire(text, interval, text, uuid, text, boolean);
DROP FUNCTION pgfence.lease_queue_leave(text, uuid);
DROP FUNCTION pgfence.lease_queue_turn(text, uuid, interval);
DROP FUNCTION pgfence.resume_grants(text, text);
DROP FUNCTION pgfence.pause_grants(text, text);
DROP FUNCTION pgfence.raise_grants_paused(text);
DROP FUNCTION pgfence.prune_lease_events(text, integer);
DROP FUNCTION pgfence.lease_check_args(text, interval, text);
DROP FUNCTION pgfence.lease_max_ttl();
DROP TABLE pgfence.job_slots;
DROP TABLE pgfence.grant_pause_events;
DROP TABLE pgfence.grant_pauses;
DROP TABLE pgfence.lease_waiters;
DROP TABLE pgfence.lease_events;
-- A row check's function takes the table's row type: it goes before the table.
ALTER TABLE pgfence.leases DROP CONSTRAINT valid_row;
DROP FUNCTION pgfence.lease_row_valid(pgfence.leases);
DROP TABLE pgfence.leases;
DROP DOMAIN pgfence.holder_info;
DROP DOMAIN pgfence.lease_reason;
DROP DOMAIN pgfence.lease_event_kind;
