-- pgfence ordered tasks: per-key task records that producers add without
-- waiting for each other, numbered gaplessly per key by the key's consumer,
-- and applied in that order under the consumer's lease.
--
--   pgfence.task_enqueue(key, payload, idem_key DEFAULT NULL, max_backlog DEFAULT 10000)
--       -> (id, created, state, seq, enqueued_at)               PF016 when the backlog is full
--   pgfence.task_status(id) -> (id, key, state, seq, attempts, payload, result, error,
--       idem_key, enqueued_at, numbered_at, started_at, finished_at, operator)   no row: unknown id
--   pgfence.task_ready_keys(prefix DEFAULT '', max_keys DEFAULT 100, after DEFAULT '') -> setof text
--   pgfence.task_lease_key(key) -> text                          the consumer's lease key
--   pgfence.task_claim(key, holder, token, max_tasks DEFAULT 100, max_attempts DEFAULT 5,
--       ordered DEFAULT true) -> (id, seq, payload, attempts, idem_key, enqueued_at)
--   pgfence.task_complete(key, holder, token, ids, results) -> integer
--   pgfence.task_fail(key, holder, token, id, error, retry_in DEFAULT NULL) -> text (the new state)
--   pgfence.task_retry(id, reason) -> boolean, pgfence.task_skip(id, reason) -> boolean    (operator)
--   pgfence.prune_tasks(older_than, batch DEFAULT 1000) -> bigint            (operator)
--
-- Producers. task_enqueue is one INSERT: it takes no row lock and updates no
-- counter, so no producer waits on another producer or on a consumer. Only a
-- duplicate of an idempotency key that another open transaction is enqueueing
-- waits for that one to end, at most 5 s (or the session's lock_timeout when
-- lower): then PF007, nothing written, as for an idempotency key in flight.
-- Called in the caller's transaction, the task exists if and only if that
-- transaction commits. It assigns the transaction's xid first and draws the
-- task's id from the sequence pgfence.task_ids after it. A duplicate
-- idem_key of the key returns the first task (created = false; PF004 when its
-- payload differs). More than max_backlog open tasks (pending or running) of
-- the key: PF016, nothing written (concurrent producers may each pass the
-- check, so a backlog overshoots by at most their number).
--
-- Numbering. The task's per-key number (seq) is assigned by the key's
-- consumer at claim, and never changes. A sequence number drawn at enqueue
-- would not do: numbers are drawn at call time and commit in another order,
-- so a number would be taken by a task that is not visible yet, or never
-- will be. A claim numbers every committed task of the key that has no
-- number yet, in id order, from next_seq; a task whose enqueue commits
-- after that claim's snapshot is numbered by a later claim, higher. So:
--   * numbers are gapless and final: a rolled-back enqueue never becomes
--     visible, and a committed task is numbered exactly once;
--   * numbers follow commit order: a task enqueued after another one
--     committed either is numbered by a later claim or, seen by the same
--     claim, has the higher id (nextval is monotonic);
--   * an enqueue in a transaction that stays open holds back no other
--     task: the tasks committed meanwhile are numbered and applied, and
--     it is numbered after them when it commits.
-- The scan for unnumbered tasks starts above a watermark (numbered_to),
-- below which every task is numbered or rolled back; it keeps the scan off
-- the index entries that earlier versions of numbered tasks leave until a
-- vacuum. task_claim advances it with a mark per key (task_keys.mark_id,
-- mark_xid): S, the last id the sequence handed out, read first, then X, an
-- xid the claim's transaction is assigned after reading S. A transaction
-- that holds an id <= S drew it before S was read, and took its xid before
-- that, so its xid is below X. Once pg_snapshot_xmin(pg_current_snapshot())
-- > X every such transaction has ended: the claim numbers every committed
-- task with id <= S, moves the watermark to S and takes a fresh mark. A mark
-- that is not safe yet is kept (a new one would never become safe under a
-- steady stream). A fresh mark needs an xid assigned after S is read:
-- task_claim takes one only when it is the first statement of its
-- transaction that needs an xid (a claim in autocommit, or first in its
-- transaction, as the Go consumer sends it). A transaction that has written
-- and stays open, in any database of the cluster, holds the watermark back
-- (not the numbering): the scans then cover more of the index until it ends.
--
-- Consumers claim keys. The consumer of key holds the lease
-- task_lease_key(key) = 'pgfence.task:' || key (pgfence.try_acquire): a role
-- granted the producers' prefix ('orders/') cannot take it unless it is also
-- granted 'pgfence.task:orders/'. task_claim, task_complete and task_fail
-- check that grant (PF014) and the live grant (holder, token) of that lease
-- like pgfence.check_lease: the lease row stays locked FOR SHARE until the
-- transaction ends, so no takeover commits in between, and a consumer that
-- lost the lease (paused, cut off, taken over) is refused with PF002 and
-- rolls back with all it wrote.
--
-- A claim (its own transaction, durable) numbers, then marks the key's next
-- max_tasks numbered tasks running under its token, in seq order, and returns
-- them. The consumer applies them with its business writes and records them
-- done with task_complete (their results) in ONE transaction: they are done
-- if and only if the writes commit. task_fail records a failed attempt (in
-- its own transaction: the batch's writes rolled back): with retry_in the task
-- is pending again after that delay, without it (or once max_attempts is
-- reached) it ends failed. Running tasks of an earlier token (its consumer
-- died or lost the lease mid-batch) count an attempt at the next claim.
-- ordered (the default): a task that is not due yet stops the key's later
-- tasks, and one that failed blocks the key (task_keys.blocked_by) until an
-- operator retries or skips it; not ordered: later tasks go on.
--
-- Wake-ups. task_enqueue sends NOTIFY pgfence_task_enqueued with the key as
-- payload when no consumer holds the key's lease (a consumer that holds it
-- claims again before it lets go). A NOTIFY serialises the commits that
-- send one: enqueues to keys no consumer holds commit one at a time.
-- Consumers poll as well: the notification is a hint.
--
-- Status. task_status answers the role that enqueued the task, the key's
-- consumers (a grant of its lease key), pgfence_operator members and the
-- schema's owner: the roles that see the task's row in pgfence.tasks
-- (pgfence_app members see the rows of the keys they consume and of the
-- tasks they enqueued, and the task_keys rows of the keys they consume).
--
-- Retention: done, failed and skipped tasks stay until prune_tasks deletes
-- them (an idempotency key is remembered as long as its task is).
--
-- SQLSTATEs: PF002 the consumer's lease is lost (or the task is not running
-- under its grant), PF004 idem_key reused with another payload, PF007 idem_key
-- being enqueued by a transaction still open after the wait, PF008 invalid
-- argument, PF014 key not granted, PF016 backlog full.

-- +goose Up
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- Task ids: drawn by task_enqueue after the transaction's xid. CACHE 1 (the
-- default): the last value read from the sequence is the last one handed out
-- by any session.
CREATE SEQUENCE pgfence.task_ids AS bigint;

-- +goose StatementBegin
CREATE TABLE pgfence.tasks (
    id          bigint           PRIMARY KEY,
    key         pgfence.key_name NOT NULL,
    xid         xid8             NOT NULL,
    seq         bigint           CHECK (seq > 0),
    state       text             NOT NULL DEFAULT 'pending'
                                 CHECK (state IN ('pending', 'running', 'done', 'failed', 'skipped')),
    payload     jsonb            NOT NULL,
    idem_key    text             CHECK (octet_length(idem_key) BETWEEN 1 AND 256),
    attempts    integer          NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    not_before  timestamptz,
    token       bigint,
    result      jsonb,
    error       text,
    enqueued_by name             NOT NULL,
    enqueued_at timestamptz      NOT NULL,
    numbered_at timestamptz,
    started_at  timestamptz,
    finished_at timestamptz,
    -- the last operator action (task_retry, task_skip): what, by whom, when, why
    operator    jsonb,
    CHECK (seq IS NOT NULL OR state = 'pending')
);
-- +goose StatementEnd

-- Open tasks by key: the backlog count, numbering (seq IS NULL, by id) and
-- claims (by seq).
CREATE INDEX tasks_open ON pgfence.tasks (key, seq, id) WHERE state IN ('pending', 'running');
CREATE UNIQUE INDEX tasks_key_seq ON pgfence.tasks (key, seq) WHERE seq IS NOT NULL;
CREATE UNIQUE INDEX tasks_key_idem ON pgfence.tasks (key, idem_key) WHERE idem_key IS NOT NULL;

-- One row per key, written by the key's consumer only (task_claim,
-- task_complete, task_fail) and by an operator's task_retry/task_skip.
-- finished counts the key's tasks that are done, failed or skipped, so that
-- next_seq - 1 - finished is its numbered open tasks; numbered_to is the
-- watermark of the last numbering (every task of the key up to that id is
-- numbered): an enqueue bounds the unnumbered ones by the ids drawn since,
-- and the scans of unnumbered tasks start above it (the earlier versions of
-- numbered tasks stay in that index range until a vacuum).
-- +goose StatementBegin
CREATE TABLE pgfence.task_keys (
    key          pgfence.key_name PRIMARY KEY,
    next_seq     bigint           NOT NULL DEFAULT 1 CHECK (next_seq > 0),
    mark_id      bigint,
    mark_xid     xid8,
    ordered      boolean          NOT NULL DEFAULT true,
    max_attempts integer          NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 100),
    finished     bigint           NOT NULL DEFAULT 0 CHECK (finished >= 0),
    numbered_to  bigint           NOT NULL DEFAULT 0,
    blocked_by   bigint,
    claimed_at   timestamptz,
    CHECK ((mark_id IS NULL) = (mark_xid IS NULL))
);
-- +goose StatementEnd

-- task_lease_key is the key of the lease a consumer of key holds.
-- +goose StatementBegin
CREATE FUNCTION pgfence.task_lease_key(p_key text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT 'pgfence.task:' OPERATOR(pg_catalog.||) p_key;
END;
-- +goose StatementEnd

-- task_check_key raises PF008 unless p_key is a task key: 1 to 480 bytes
-- (its lease key is at most 512).
-- +goose StatementBegin
CREATE FUNCTION pgfence.task_check_key(p_key text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 480 THEN
        RAISE EXCEPTION 'pgfence: task key must be 1 to 480 bytes, got %',
            coalesce(octet_length(p_key)::text || ' bytes', 'NULL') USING ERRCODE = 'PF008';
    END IF;
END;
$$;
-- +goose StatementEnd

-- task_require_consumer checks a consumer's call: the key, the grant of its
-- lease key, and the live grant (holder, token) of that lease, whose row
-- stays locked FOR SHARE until the transaction ends. It forces a durable
-- commit.
-- +goose StatementBegin
CREATE FUNCTION pgfence.task_require_consumer(p_key text, p_holder uuid, p_token bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgfence.task_enqueue(p_key text, p_payload jsonb, p_idem_key text DEFAULT NULL, p_max_backlog integer DEFAULT 10000,
                                     OUT id bigint, OUT created boolean, OUT state text, OUT seq bigint, OUT enqueued_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- task_same_payload raises PF004 unless task t was enqueued with p_payload.
-- +goose StatementBegin
CREATE FUNCTION pgfence.task_same_payload(t pgfence.tasks, p_payload jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF t.payload <> p_payload THEN
        RAISE EXCEPTION 'pgfence: task idempotency key % of key % was used for task % with another payload',
                quote_literal(t.idem_key), quote_literal(t.key), t.id
            USING ERRCODE = 'PF004', DETAIL = format('key=%s idem_key=%s id=%s', t.key, t.idem_key, t.id);
    END IF;
END;
$$;
-- +goose StatementEnd

-- task_status returns task p_id to the role that enqueued it, to the key's
-- consumers, to pgfence_operator members and to the schema's owner; no row
-- otherwise.
-- +goose StatementBegin
CREATE FUNCTION pgfence.task_status(p_id bigint)
RETURNS TABLE (id bigint, key text, state text, seq bigint, attempts integer, payload jsonb, result jsonb, error text,
               idem_key text, enqueued_at timestamptz, numbered_at timestamptz, started_at timestamptz, finished_at timestamptz,
               operator jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT t.id, t.key, t.state, t.seq, t.attempts, t.payload, t.result, t.error,
           t.idem_key, t.enqueued_at, t.numbered_at, t.started_at, t.finished_at, t.operator
      FROM pgfence.tasks t
     WHERE t.id = p_id
       AND (t.enqueued_by = pgfence.acting_role()
            OR pg_catalog.pg_has_role(pgfence.acting_role(), CURRENT_USER, 'USAGE')
            OR pg_catalog.pg_has_role(pgfence.acting_role(), 'pgfence_operator', 'USAGE')
            OR pgfence.may_use(pgfence.task_lease_key(t.key)));
END;
-- +goose StatementEnd

-- task_ready_keys lists up to p_max_keys keys that start with p_prefix, come
-- after p_after and have open tasks, which the caller may consume (a grant
-- of their lease key), in key order: a skip scan of tasks_open, one probe
-- per key (per key of the prefix under a code-point collation, per key of
-- any prefix under another). A consumer passes the last key of its previous list as p_after
-- (and '' once a list came back short), so that it comes to every key.
-- +goose StatementBegin
CREATE FUNCTION pgfence.task_ready_keys(p_prefix text DEFAULT '', p_max_keys integer DEFAULT 100, p_after text DEFAULT '')
RETURNS SETOF text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- task_claim numbers the key's committed tasks that have no number yet (see
-- "Numbering"), counts an attempt for tasks an earlier grant left running,
-- and marks the key's next p_max_tasks numbered tasks running under the
-- grant (p_holder, p_token) of the key's consumer lease, in seq order, and
-- returns them. It returns no task while the key is blocked (ordered, after a
-- failure). Send it as the first statement of its transaction (or in
-- autocommit): only then does it take a fresh numbering mark.
-- +goose StatementBegin
CREATE FUNCTION pgfence.task_claim(p_key text, p_holder uuid, p_token bigint, p_max_tasks integer DEFAULT 100,
                                   p_max_attempts integer DEFAULT 5, p_ordered boolean DEFAULT true)
RETURNS TABLE (id bigint, seq bigint, payload jsonb, attempts integer, idem_key text, enqueued_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- task_complete records the tasks p_ids, running under the grant (p_holder,
-- p_token) of the key's consumer lease, done with p_results (NULL: no
-- results), in the caller's transaction: send it in the transaction of their
-- business writes. PF002 when the lease is lost or a task is not running under
-- this grant. It returns how many it recorded.
-- +goose StatementBegin
CREATE FUNCTION pgfence.task_complete(p_key text, p_holder uuid, p_token bigint, p_ids bigint[], p_results jsonb[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- task_fail records a failed attempt of task p_id, running under the grant
-- (p_holder, p_token) of the key's consumer lease, with p_error (at most
-- 4096 bytes). With p_retry_in and attempts left (task_keys.max_attempts)
-- the task is pending again after p_retry_in; otherwise it ends failed, and a
-- key in order is blocked by it. The grant's other running tasks (the rest
-- of the batch, which rolled back) are pending again. It returns the task's
-- new state.
-- +goose StatementBegin
CREATE FUNCTION pgfence.task_fail(p_key text, p_holder uuid, p_token bigint, p_id bigint, p_error text, p_retry_in interval DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- task_retry makes failed task p_id pending again with its attempts reset,
-- and unblocks its key; task_skip marks it skipped and unblocks its key. They
-- return false when the task is not failed. Each records on the task what
-- was done, by which role, when and why (p_reason, 1 to 1000 characters:
-- PF008 otherwise): the column operator. Operator only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.task_operator(p_action text, p_reason text) RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgfence.require_primary();
    IF p_reason IS NULL OR length(btrim(p_reason)) = 0 OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION 'pgfence: the reason for a task % must be 1 to 1000 characters', p_action USING ERRCODE = 'PF008';
    END IF;
    RETURN jsonb_build_object('action', p_action, 'by', pgfence.acting_role(), 'at', clock_timestamp(), 'reason', p_reason);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgfence.task_retry(p_id bigint, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgfence.task_skip(p_id bigint, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- prune_tasks deletes up to p_batch tasks that finished (done, failed,
-- skipped) before now - p_older_than, and returns how many. Operator only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.prune_tasks(p_older_than interval, p_batch integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

REVOKE ALL ON pgfence.tasks, pgfence.task_keys FROM PUBLIC;
REVOKE ALL ON SEQUENCE pgfence.task_ids FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION
    pgfence.task_lease_key(text), pgfence.task_check_key(text), pgfence.task_require_consumer(text, uuid, bigint),
    pgfence.task_enqueue(text, jsonb, text, integer), pgfence.task_same_payload(pgfence.tasks, jsonb),
    pgfence.task_status(bigint), pgfence.task_ready_keys(text, integer, text),
    pgfence.task_claim(text, uuid, bigint, integer, integer, boolean),
    pgfence.task_complete(text, uuid, bigint, bigint[], jsonb[]),
    pgfence.task_fail(text, uuid, bigint, bigint, text, interval),
    pgfence.task_operator(text, text), pgfence.task_retry(bigint, text), pgfence.task_skip(bigint, text),
    pgfence.prune_tasks(interval, integer)
  FROM PUBLIC;
GRANT SELECT ON pgfence.tasks, pgfence.task_keys TO pgfence_app, pgfence_operator;
GRANT EXECUTE ON FUNCTION
    pgfence.task_lease_key(text),
    pgfence.task_enqueue(text, jsonb, text, integer),
    pgfence.task_status(bigint), pgfence.task_ready_keys(text, integer, text),
    pgfence.task_claim(text, uuid, bigint, integer, integer, boolean),
    pgfence.task_complete(text, uuid, bigint, bigint[], jsonb[]),
    pgfence.task_fail(text, uuid, bigint, bigint, text, interval)
  TO pgfence_app, pgfence_operator;
GRANT EXECUTE ON FUNCTION pgfence.task_retry(bigint, text), pgfence.task_skip(bigint, text), pgfence.prune_tasks(interval, integer)
  TO pgfence_operator;

-- Row-level security: pgfence_app members see the tasks they enqueued and
-- the tasks and keys they may consume; operators see every row.
ALTER TABLE pgfence.tasks ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.task_keys ENABLE ROW LEVEL SECURITY;
-- The policy runs with the reader's rights, which do not include
-- acting_role(): its expression is written out.
CREATE POLICY granted ON pgfence.tasks FOR SELECT TO pgfence_app
    USING (enqueued_by = CASE WHEN current_setting('role') = 'none' THEN session_user ELSE current_setting('role')::name END
           OR pgfence.may_use(pgfence.task_lease_key(key)));
CREATE POLICY granted ON pgfence.task_keys FOR SELECT TO pgfence_app USING (pgfence.may_use(pgfence.task_lease_key(key)));
CREATE POLICY operators ON pgfence.tasks FOR SELECT TO pgfence_operator USING (true);
CREATE POLICY operators ON pgfence.task_keys FOR SELECT TO pgfence_operator USING (true);

-- +goose Down
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
DROP FUNCTION pgfence.prune_tasks(interval, integer);
DROP FUNCTION pgfence.task_skip(bigint, text);
DROP FUNCTION pgfence.task_retry(bigint, text);
DROP FUNCTION pgfence.task_operator(text, text);
DROP FUNCTION pgfence.task_fail(text, uuid, bigint, bigint, text, interval);
DROP FUNCTION pgfence.task_complete(text, uuid, bigint, bigint[], jsonb[]);
DROP FUNCTION pgfence.task_claim(text, uuid, bigint, integer, integer, boolean);
DROP FUNCTION pgfence.task_ready_keys(text, integer, text);
DROP FUNCTION pgfence.task_status(bigint);
DROP FUNCTION pgfence.task_same_payload(pgfence.tasks, jsonb);
DROP FUNCTION pgfence.task_enqueue(text, jsonb, text, integer);
DROP FUNCTION pgfence.task_require_consumer(text, uuid, bigint);
DROP FUNCTION pgfence.task_check_key(text);
-- The row-level security policies use task_lease_key: the tables go first.
DROP TABLE pgfence.task_keys;
DROP TABLE pgfence.tasks;
DROP FUNCTION pgfence.task_lease_key(text);
DROP SEQUENCE pgfence.task_ids;
