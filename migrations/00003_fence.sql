-- pgfence fenced writes: the database itself rejects a stale token (PF001), a
-- lost lease (PF002) and, on protected tables, a write that presented no current
-- token at all (PF006) -- atomically with the business write, whatever client
-- sends it.
--
-- Protocol, for any client:
--   BEGIN;
--   SELECT pgfence.fence('orders:42', 1099511627781);  -- PF001 if a higher token was accepted
--   UPDATE orders SET ... WHERE id = 42;               -- the business write
--   COMMIT;
-- pgfence.fence() records the token and keeps the fence row locked until the
-- transaction ends, so no other writer of that resource can commit in between,
-- and a writer holding a lower token is rejected after this one commits.
--
-- Protected tables (pgfence.protect): a row trigger admits INSERT/UPDATE/DELETE
-- of a row only if pgfence.fences has the row's resource with fenced_xid = the
-- current transaction, i.e. pgfence.fence() accepted a token for it in this
-- transaction (not in a savepoint rolled back since). No session setting is
-- trusted, so a client cannot present a stale token by setting one by hand;
-- and the fence table itself refuses to lower or forget a token.

-- +goose Up

-- One row per fenced resource: the highest token accepted so far. Rows are
-- never deleted and their token never decreases (trigger fences_monotonic).
-- +goose StatementBegin
CREATE TABLE pgfence.fences (
    resource     text        PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 512),
    token        bigint      NOT NULL CHECK (token > 0),
    accepted_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    writes       bigint      NOT NULL DEFAULT 1 CHECK (writes >= 0),
    -- the operation id of the last accepted write, for read-back after an
    -- unknown commit outcome (NULL when the writer gave none)
    op           uuid,
    -- the transaction that last accepted a token: protected-table triggers
    -- admit a row write only in that transaction
    fenced_xid   xid8        NOT NULL DEFAULT pg_current_xact_id()
) WITH (fillfactor = 50); -- room for HOT updates: every accepted write updates its row
-- +goose StatementEnd

-- reject_fence_change refuses direct DML on pgfence.fences that would forget or
-- lower an accepted token: a stale writer must not be able to reset the fence.
-- +goose StatementBegin
CREATE FUNCTION pgfence.reject_fence_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'pgfence: token for resource % may not be lowered from % to %', OLD.resource, OLD.token, NEW.token
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', OLD.token, NEW.token, OLD.resource);
    END IF;
    RAISE EXCEPTION 'pgfence: accepted tokens may not be deleted (%)', TG_OP
        USING ERRCODE = 'PF001',
              HINT = 'Fence rows are the memory of the highest accepted token; deleting them would let stale writers in.';
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER fences_monotonic BEFORE UPDATE ON pgfence.fences
    FOR EACH ROW WHEN (NEW.token < OLD.token OR NEW.resource <> OLD.resource)
    EXECUTE FUNCTION pgfence.reject_fence_change();
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER fences_no_delete BEFORE DELETE ON pgfence.fences
    FOR EACH ROW EXECUTE FUNCTION pgfence.reject_fence_change();
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER fences_no_truncate BEFORE TRUNCATE ON pgfence.fences
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence.reject_fence_change();
-- +goose StatementEnd

-- fence accepts token for resource iff it is not lower than the last accepted
-- token (equal passes: one holder may write several times), records it and
-- returns it (so it can feed a fence column: SET fence = pgfence.fence(r, t)).
-- Otherwise it raises PF001. It runs in the caller's transaction and keeps the fence row
-- locked until that transaction ends. op is an optional operation id stored for
-- read-back after a commit with unknown outcome.
-- +goose StatementBegin
CREATE FUNCTION pgfence.fence(resource text, token bigint, op uuid DEFAULT NULL) RETURNS bigint
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

-- check_lease raises PF002 unless holder holds the live lease key with token.
-- It takes FOR SHARE on the lease row (not FOR KEY SHARE: a takeover's ON
-- CONFLICT DO UPDATE must wait for it), so no takeover can commit before the
-- caller's transaction ends; expiry is judged by the database clock.
-- +goose StatementBegin
CREATE FUNCTION pgfence.check_lease(key text, holder uuid, token bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    l pgfence.leases%ROWTYPE;
BEGIN
    SELECT * INTO l FROM pgfence.leases WHERE key = check_lease.key FOR SHARE;
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
-- +goose StatementEnd

-- guard is the row trigger of protected tables (see protect). It admits a row
-- write only if this transaction called pgfence.fence() for the row's resource
-- and that call was accepted (and not rolled back to a savepoint): the fence
-- row's fenced_xid is the current transaction. The check is against
-- pgfence.fences, so no session setting can smuggle in a stale token.
-- TG_ARGV: resource column, resource prefix.
-- +goose StatementBegin
CREATE FUNCTION pgfence.guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    old_resource text;
    new_resource text;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        old_resource := TG_ARGV[1] || (to_jsonb(OLD) ->> TG_ARGV[0]);
        PERFORM 1 FROM pgfence.fences f
         WHERE f.resource = old_resource AND f.fenced_xid = pg_current_xact_id();
        IF NOT FOUND THEN
            PERFORM pgfence.raise_unfenced(old_resource, TG_RELID::regclass);
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
    END IF;
    new_resource := TG_ARGV[1] || (to_jsonb(NEW) ->> TG_ARGV[0]);
    IF new_resource IS NULL OR new_resource IS DISTINCT FROM old_resource THEN -- an INSERT, or a row moved to another resource
        PERFORM 1 FROM pgfence.fences f
         WHERE f.resource = new_resource AND f.fenced_xid = pg_current_xact_id();
        IF NOT FOUND THEN
            PERFORM pgfence.raise_unfenced(new_resource, TG_RELID::regclass);
        END IF;
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- raise_unfenced raises the PF006 rejection of guard.
-- +goose StatementBegin
CREATE FUNCTION pgfence.raise_unfenced(resource text, relation regclass) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF resource IS NULL THEN
        RAISE EXCEPTION 'pgfence: unfenced write to %: the row has no resource', relation
            USING ERRCODE = 'PF006';
    END IF;
    RAISE EXCEPTION 'pgfence: unfenced write to % for resource %: this transaction presented no accepted token', relation, quote_literal(resource)
        USING ERRCODE = 'PF006',
              DETAIL = format('resource=%s', resource),
              HINT = 'Call pgfence.fence(resource, token) in the same transaction before writing.';
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgfence.reject_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgfence: TRUNCATE of protected table %.% is not fenced', TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'PF006',
              HINT = 'Unprotect the table first (pgfence.unprotect).';
END;
$$;
-- +goose StatementEnd

-- protect installs the guard on relation: every INSERT, UPDATE and DELETE must
-- run in a transaction that fenced prefix || resource_column of each row it
-- touches (old and new row); TRUNCATE is refused. Protecting again replaces the
-- settings.
-- +goose StatementBegin
CREATE FUNCTION pgfence.protect(relation regclass, resource_column text, prefix text DEFAULT '') RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF relation IS NULL OR resource_column IS NULL OR prefix IS NULL THEN
        RAISE EXCEPTION 'pgfence: protect: relation, resource_column and prefix must not be NULL' USING ERRCODE = 'PF008';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a
                    WHERE a.attrelid = relation AND a.attname = resource_column AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'pgfence: protect: % has no column %', relation, quote_ident(resource_column) USING ERRCODE = 'PF008';
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', relation);
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', relation);
    EXECUTE format('CREATE TRIGGER pgfence_guard BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.guard(%L, %L)',
                   relation, resource_column, prefix);
    EXECUTE format('CREATE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION pgfence.reject_truncate()',
                   relation);
END;
$$;
-- +goose StatementEnd

-- unprotect removes the guard from relation; it returns whether there was one.
-- +goose StatementBegin
CREATE FUNCTION pgfence.unprotect(relation regclass) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    had boolean;
BEGIN
    SELECT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = relation AND t.tgname = 'pgfence_guard') INTO had;
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', relation);
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', relation);
    RETURN had;
END;
$$;
-- +goose StatementEnd

-- protected_tables lists the tables guarded by protect, read from the catalog
-- (so it never disagrees with the triggers that are really installed).
-- +goose StatementBegin
CREATE FUNCTION pgfence.protected_tables() RETURNS TABLE (relation regclass, resource_column text, prefix text)
LANGUAGE sql STABLE AS $$
    SELECT t.tgrelid::regclass,
           replace(a.args[1], '\\', '\'),
           replace(coalesce(a.args[2], ''), '\\', '\')
      FROM pg_trigger t
     CROSS JOIN LATERAL (SELECT string_to_array(encode(t.tgargs, 'escape'), '\000') AS args) a
     WHERE t.tgname = 'pgfence_guard' AND t.tgfoid = 'pgfence.guard()'::regprocedure
     ORDER BY t.tgrelid::regclass::text;
$$;
-- +goose StatementEnd

-- max_stored_token is the highest token pgfence itself has stored (fences,
-- leases, lease history, the floor): the least floor to restore after a rebuild.
-- Tokens in the application's own fence columns are added by the caller.
-- +goose StatementBegin
CREATE FUNCTION pgfence.max_stored_token() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT greatest((SELECT max(token) FROM pgfence.fences),
                    (SELECT max(token) FROM pgfence.leases),
                    (SELECT max(token) FROM pgfence.lease_events),
                    (SELECT floor FROM pgfence.token_floor),
                    0);
$$;
-- +goose StatementEnd

-- raise_token_floor makes every token issued from now on greater than
-- new_floor. It refuses to lower the floor (PF009); raising it to its current
-- value is a no-op. It returns the floor before.
-- +goose StatementBegin
CREATE FUNCTION pgfence.raise_token_floor(new_floor bigint, reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    old_floor bigint;
BEGIN
    IF new_floor IS NULL OR new_floor < 0 THEN
        RAISE EXCEPTION 'pgfence: new_floor must be >= 0, got %', new_floor USING ERRCODE = 'PF008';
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
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    r regclass;
BEGIN
    FOR r IN SELECT relation FROM pgfence.protected_tables() LOOP
        PERFORM pgfence.unprotect(r);
    END LOOP;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.raise_token_floor(bigint, text);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.max_stored_token();
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.protected_tables();
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.unprotect(regclass);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.protect(regclass, text, text);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.reject_truncate();
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.guard();
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.raise_unfenced(text, regclass);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.check_lease(text, uuid, bigint);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.fence(text, bigint, uuid);
-- +goose StatementEnd
-- +goose StatementBegin
DROP TABLE pgfence.fences;
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.reject_fence_change();
-- +goose StatementEnd
