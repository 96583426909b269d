-- pgfence idempotency keys: one business intent (scope + key) takes effect once.
--
-- Two modes share one table:
--
--   atomic  The effect lives in this database. The claim, the business writes
--           and the stored result commit in ONE READ COMMITTED transaction:
--           idempotency_claim_atomic() inserts the claim row, the caller writes,
--           idempotency_complete_atomic() stores the result, the caller commits.
--           A concurrent duplicate waits on the uncommitted claim row (bounded by
--           p_wait) and then reads the stored result; if the first transaction
--           aborts, the key is free. A committed atomic row is never in progress
--           (a deferred constraint trigger refuses the commit otherwise).
--
--   leased  The effect is outside the database (a payment provider, e-mail, a
--           device). idempotency_claim() grants a lease to a fresh owner id and
--           bumps an ownership counter (epoch); the owner advances a recovery
--           point, extends the lease, and completes, fails or releases. Only the
--           current owner is accepted (PF002 otherwise). After the lease expires
--           (database clock) the next claim takes over and resumes from the
--           recovery point.
--
-- A row's result is kept until expires_at (completed_at + retention); an expired
-- row is treated as absent by the claims and deleted in batches by
-- idempotency_gc. In-progress rows have no expires_at and are never collected.
--
--   pgfence.idempotency_claim_atomic(scope, key, fingerprint, wait, retention)
--       -> (outcome, status, result, failure_code, failure_message, expires_at, retry_after)
--   pgfence.idempotency_claim_atomic_new(scope, key, fingerprint, wait, retention) -> void
--   pgfence.idempotency_complete_atomic(scope, key, result, failure_code DEFAULT NULL,
--       failure_message DEFAULT NULL) -> timestamptz
--   pgfence.idempotency_claim(scope, key, fingerprint, lease, retention, wait DEFAULT '5 seconds')
--       -> (outcome, owner, epoch, lease_expires_at, recovery_point, recovery_data,
--           status, result, failure_code, failure_message, expires_at)
--   pgfence.idempotency_heartbeat(scope, key, owner, lease) -> timestamptz
--   pgfence.idempotency_advance(scope, key, owner, recovery_point, recovery_data, lease) -> timestamptz
--   pgfence.idempotency_complete(scope, key, owner, result, failure_code DEFAULT NULL,
--       failure_message DEFAULT NULL) -> timestamptz
--   pgfence.idempotency_release(scope, key, owner) -> void
--   pgfence.idempotency_gc(batch) -> bigint
--
-- SQLSTATEs: PF002 not the current owner, PF004 key reused with another payload,
-- PF007 key in progress, PF008 invalid argument (or an atomic claim committed
-- without its result), PF010 transaction isolation is not READ COMMITTED, PF015
-- the key already has a stored answer (idempotency_claim_atomic_new only).

-- +goose Up
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- trace_id is the trace of the claim that created or last took over (or
-- reused) the key (see pgfence.current_trace_id): a column default on INSERT,
-- set by the claim's ON CONFLICT DO UPDATE when it bumps the epoch
-- (heartbeats, recovery points and completions keep it).
-- +goose StatementBegin
CREATE TABLE pgfence.idempotency_keys (
    scope            text        NOT NULL,
    key              text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    mode             text        NOT NULL,
    status           text        NOT NULL,
    owner            uuid,
    epoch            bigint      NOT NULL DEFAULT 1,
    lease_expires_at timestamptz,
    recovery_point   text        NOT NULL DEFAULT '',
    recovery_data    bytea,
    result           bytea,
    failure_code     text,
    failure_message  text,
    retention        interval    NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at     timestamptz,
    expires_at       timestamptz,
    trace_id         text        DEFAULT pgfence.current_trace_id(),
    PRIMARY KEY (scope, key)
);
-- +goose StatementEnd

-- The garbage collector reads completed rows by expiry.
-- +goose StatementBegin
CREATE INDEX idempotency_keys_expires_at ON pgfence.idempotency_keys (expires_at)
    WHERE expires_at IS NOT NULL;
-- +goose StatementEnd

-- Completers (idempotency.Store.Recover, pgfence keys abandoned) read the
-- leased keys in progress, a few among millions of completed ones. The
-- indexed column and the predicate never change while a key is in progress,
-- so heartbeats and recovery points stay HOT updates; atomic claims are not
-- in the index at all.
-- +goose StatementBegin
CREATE INDEX idempotency_keys_leased_in_progress ON pgfence.idempotency_keys (scope)
    WHERE status = 'in_progress' AND mode = 'leased';
-- +goose StatementEnd

-- The row invariants, in one plpgsql call: sane sizes, and the state
-- machine: in progress (atomic: no lease; leased: a lease, owner NULL once
-- released) -> succeeded (a result, possibly empty) or failed (a code).
-- Completed rows have no owner or lease and expire after completion. The
-- sizes of results, messages, recovery points and the retention are validated
-- by the functions below.
--
-- PostgreSQL rebuilds (parses and plans) every CHECK expression for each
-- INSERT and UPDATE statement: as two CHECK constraints these conditions cost
-- ~40 µs per statement, and every atomic key writes its row twice. A plpgsql
-- function keeps its compiled expressions for the session, so the same
-- conditions cost a function call. NOT VALID: PostgreSQL checks every row
-- inserted or updated once the constraint exists; NOT VALID only records that
-- rows already there were not scanned.
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

-- +goose StatementBegin
ALTER TABLE pgfence.idempotency_keys
    ADD CONSTRAINT valid_row CHECK (pgfence.idempotency_key_valid(idempotency_keys)) NOT VALID;
-- +goose StatementEnd

-- idempotency_durable makes the calling transaction commit with
-- synchronous_commit on when the session has off or local: an acknowledged
-- claim or result that a crash forgets would let the intent run twice.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_durable() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END;
$$;
-- +goose StatementEnd

-- idempotency_require_read_committed raises PF010 unless the transaction runs
-- in READ COMMITTED: the claims re-read a row a concurrent transaction
-- committed while they waited, which REPEATABLE READ and SERIALIZABLE refuse
-- with 40001.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_require_read_committed() RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfence: idempotency keys need READ COMMITTED, this transaction runs in %',
                upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'PF010',
                  HINT = 'Run the claim in a READ COMMITTED transaction (BEGIN ISOLATION LEVEL READ COMMITTED).';
    END IF;
END;
$$;
-- +goose StatementEnd

-- idempotency_check_name raises PF008 for a scope or key out of bounds. Every
-- function that takes them checks them before the role's grants (a bad name
-- is an argument error, never "not granted").
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_check_name(p_scope text, p_key text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_scope IS NULL OR octet_length(p_scope) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: idempotency scope must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: idempotency key must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_check_args(p_scope text, p_key text, p_fingerprint bytea, p_retention interval)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_check_result(p_result bytea, p_failure_code text, p_failure_message text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
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
-- +goose StatementEnd

-- idempotency_claim_atomic claims (scope, key) inside the caller's READ
-- COMMITTED transaction. outcome is one of:
--   new          the row is claimed by this transaction: do the work, call
--                idempotency_complete_atomic, commit
--   replayed     a committed result exists (status succeeded or failed)
--   mismatch     the key was used with another fingerprint; nothing else is shown
--   in_progress  another transaction holds the key longer than p_wait (or a
--                leased claim holds it; retry_after is its remaining lease)
-- It never raises for these outcomes, so the caller's transaction stays usable.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_claim_atomic(
    p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval)
RETURNS TABLE (outcome text, status text, result bytea, failure_code text, failure_message text,
               expires_at timestamptz, retry_after interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- idempotency_claim_atomic_new is idempotency_claim_atomic for a client that
-- sends it in one message with its BEGIN and reads no rows (the Go Store on a
-- pool or a connection: one round trip instead of two). It returns nothing when
-- this transaction claimed the key (outcome new) and raises for every other
-- outcome, which aborts the transaction: PF004 mismatch, PF007 in progress,
-- PF015 replayed (roll back and claim with idempotency_claim_atomic to read the
-- stored answer). It checks nothing itself: it runs idempotency_claim_atomic,
-- with the caller's rights.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_claim_atomic_new(
    p_scope text, p_key text, p_fingerprint bytea, p_wait interval, p_retention interval)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- idempotency_complete_atomic stores the result of the atomic claim this
-- transaction holds: a success (p_failure_code NULL) or a permanent failure.
-- It returns when the stored result expires. PF002 if this transaction holds no
-- atomic claim on the key.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_complete_atomic(
    p_scope text, p_key text, p_result bytea,
    p_failure_code text DEFAULT NULL, p_failure_message text DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- An atomic claim must be completed in its own transaction: refuse a commit
-- that would leave it in progress forever. The constraint trigger fires for
-- every row inserted and every UPDATE that sets status or mode (no other
-- UPDATE can make a row an atomic claim in progress), without a WHEN
-- clause: a WHEN is read back and planned for every statement that writes
-- the table, which cost more than the function's own test of the row.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_atomic_completed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE CONSTRAINT TRIGGER idempotency_atomic_completed
    AFTER INSERT OR UPDATE OF status, mode ON pgfence.idempotency_keys
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    EXECUTE FUNCTION pgfence.idempotency_atomic_completed();
-- +goose StatementEnd

-- idempotency_claim claims (scope, key) for leased work, in one statement. It
-- returns one row:
--   outcome 'new'       this caller is the owner until lease_expires_at (database
--                       clock); epoch > 1 and recovery_point/recovery_data tell a
--                       takeover where the previous owner got to
--   outcome 'replayed'  the stored result (status succeeded or failed)
-- It raises PF004 when the key was used with another fingerprint (the stored
-- result is never shown), PF007 while another owner's lease is live.
-- A takeover happens only in INSERT ... ON CONFLICT DO UPDATE ... WHERE, whose
-- WHERE is evaluated after the row lock, against the database clock.
--
-- That upsert waits for the row lock of any transaction that has the row
-- locked: an owner completing, failing or heartbeating inside its own longer
-- transaction, or another claim not yet committed. It waits at most p_wait
-- (DEFAULT 5 seconds, the Go Store's default WaitTimeout), as
-- idempotency_claim_atomic does, and then raises PF007 (in progress) like any
-- claim that meets a live owner, so that a duplicate is never blocked for as
-- long as that transaction lasts.
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
-- +goose StatementEnd

-- idempotency_not_owner raises PF002 for the owner-only calls below. Those
-- UPDATEs match on the owner id only (no time predicate): a takeover replaces
-- the owner id under the row lock, so a late call from a replaced owner finds
-- no row, whichever of the two locks the row first.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_not_owner(p_scope text, p_key text, p_owner uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgfence: % is not the current owner of idempotency key %/%', p_owner, p_scope, p_key
        USING ERRCODE = 'PF002',
              DETAIL = 'The lease expired and another attempt took the key over, the claim was released, or the key is completed.';
END;
$$;
-- +goose StatementEnd

-- idempotency_heartbeat extends the owner's lease to now + p_lease and returns
-- the new expiry. PF002 unless p_owner is the current owner.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_heartbeat(p_scope text, p_key text, p_owner uuid, p_lease interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- idempotency_advance records a recovery point (and optional data) reached by
-- the owner and extends its lease; a takeover resumes from the last one
-- recorded. Returns the new lease expiry. PF002 unless p_owner is the owner.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_advance(
    p_scope text, p_key text, p_owner uuid, p_recovery_point text, p_recovery_data bytea, p_lease interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- idempotency_complete stores the owner's result (success when p_failure_code is
-- NULL, else a permanent failure with p_result as its optional data) and ends
-- the lease. Returns when the stored result expires. PF002 unless p_owner is the
-- current owner: a replaced owner's late completion is refused.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_complete(
    p_scope text, p_key text, p_owner uuid, p_result bytea,
    p_failure_code text DEFAULT NULL, p_failure_message text DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- idempotency_release gives the claim up after a transient error: the result
-- stays unset, the recovery point stays, and the next claim takes over at once.
-- PF002 unless p_owner is the current owner.
-- +goose StatementBegin
CREATE FUNCTION pgfence.idempotency_release(p_scope text, p_key text, p_owner uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- +goose StatementEnd

-- Nothing for PUBLIC (functions are created executable by everyone), then
-- each role gets exactly its list.
REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgfence FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;

-- Reads: both roles (the Go clients read idempotency results back after lost
-- replies).
GRANT SELECT ON pgfence.idempotency_keys TO pgfence_app, pgfence_operator;

-- The protocol: both roles.
GRANT EXECUTE ON FUNCTION
    pgfence.idempotency_claim_atomic(text, text, bytea, interval, interval),
    pgfence.idempotency_claim_atomic_new(text, text, bytea, interval, interval),
    pgfence.idempotency_complete_atomic(text, text, bytea, text, text),
    pgfence.idempotency_claim(text, text, bytea, interval, interval, interval),
    pgfence.idempotency_heartbeat(text, text, uuid, interval),
    pgfence.idempotency_advance(text, text, uuid, text, bytea, interval),
    pgfence.idempotency_complete(text, text, uuid, bytea, text, text),
    pgfence.idempotency_release(text, text, uuid)
  TO pgfence_app, pgfence_operator;

-- Operations: the operator role only.
GRANT EXECUTE ON FUNCTION
    pgfence.idempotency_gc(integer)
  TO pgfence_operator;

-- Row-level security: a stored result is readable within the scopes granted
-- to the role only (grant_prefix); operators see every row.
ALTER TABLE pgfence.idempotency_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY granted ON pgfence.idempotency_keys FOR SELECT TO pgfence_app USING (pgfence.may_use(scope));
CREATE POLICY operators ON pgfence.idempotency_keys FOR SELECT TO pgfence_operator USING (true);

-- +goose Down
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
DROP FUNCTION pgfence.idempotency_gc(integer);
DROP FUNCTION pgfence.idempotency_release(text, text, uuid);
DROP FUNCTION pgfence.idempotency_complete(text, text, uuid, bytea, text, text);
DROP FUNCTION pgfence.idempotency_advance(text, text, uuid, text, bytea, interval);
DROP FUNCTION pgfence.idempotency_heartbeat(text, text, uuid, interval);
DROP FUNCTION pgfence.idempotency_not_owner(text, text, uuid);
DROP FUNCTION pgfence.idempotency_claim(text, text, bytea, interval, interval, interval);
DROP TRIGGER idempotency_atomic_completed ON pgfence.idempotency_keys;
DROP FUNCTION pgfence.idempotency_atomic_completed();
DROP FUNCTION pgfence.idempotency_complete_atomic(text, text, bytea, text, text);
DROP FUNCTION pgfence.idempotency_claim_atomic_new(text, text, bytea, interval, interval);
DROP FUNCTION pgfence.idempotency_claim_atomic(text, text, bytea, interval, interval);
DROP FUNCTION pgfence.idempotency_check_result(bytea, text, text);
DROP FUNCTION pgfence.idempotency_check_args(text, text, bytea, interval);
DROP FUNCTION pgfence.idempotency_check_name(text, text);
DROP FUNCTION pgfence.idempotency_require_read_committed();
DROP FUNCTION pgfence.idempotency_durable();
-- A row check's function takes the table's row type: it goes before the table.
ALTER TABLE pgfence.idempotency_keys DROP CONSTRAINT valid_row;
DROP FUNCTION pgfence.idempotency_key_valid(pgfence.idempotency_keys);
DROP TABLE pgfence.idempotency_keys;
