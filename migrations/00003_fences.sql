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
--   pgfence.fence(resource, token, op DEFAULT NULL) -> bigint   raises PF001 when stale,
--                                                               PF012 when not issued, PF013 when abandoned
--   pgfence.check_lease(key, holder, token) -> void             raises PF002 when not held
--   pgfence.abandon_fence(resource, op) -> boolean              gives up a write whose reply was lost
--   pgfence.fence_probe(resource) -> (token, writes, op)
--   pgfence.lower_fence(resource, token, reason) -> bigint      operators: undo a fence set too high
--   pgfence.protect(relation, resource_column, prefix DEFAULT '') -> void
--   pgfence.unprotect(relation) -> boolean
--   pgfence.protected_tables() -> (relation, resource_column, prefix)
--   pgfence.max_stored_token() -> bigint
--   pgfence.record_fence_rejection(resource, presented_token, accepted_token,
--       reason, lease_reason, operation, op, trace_id) -> void
--   pgfence.prune_fence_rejections(max_age DEFAULT '7 days') -> bigint
--
-- Protected tables (pgfence.protect): a row trigger admits INSERT/UPDATE/DELETE
-- of a row only if pgfence.fences has the row's resource with fenced_xid = the
-- current transaction, i.e. pgfence.fence() accepted a token for it in this
-- transaction (not in a savepoint rolled back since). No session setting is
-- trusted, so a client cannot present a stale token by setting one by hand;
-- and the fence table itself refuses to lower or forget a token.
--
-- protect and unprotect are SECURITY INVOKER on purpose: CREATE TRIGGER and
-- DROP TRIGGER then check the caller's own rights on the table (owner or
-- TRIGGER privilege), so nobody can put a guard on, or take it off, a table
-- they do not own. Business tables should be owned by a migration/owner role,
-- and the application's login role should get DML on them only: then the
-- application can neither drop nor disable the guard trigger.

-- +goose Up
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- One row per fenced resource: the highest token accepted so far. Rows are
-- never deleted and their token never decreases (triggers fences_before_update,
-- fences_no_delete and fences_no_truncate). trace_id is the trace of the last
-- accepted write (see pgfence.current_trace_id), set by the function that
-- accepts it; it is deliberately not indexed, so fence updates stay HOT. The
-- columns' types check their values (see pgfence.key_name): a resource of 1
-- to 512 bytes, a token above 0, a write count of 0 or more.
-- +goose StatementBegin
CREATE TABLE pgfence.fences (
    resource     pgfence.key_name    PRIMARY KEY,
    token        pgfence.token_value NOT NULL,
    accepted_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    writes       pgfence.write_count NOT NULL DEFAULT 1,
    -- the operation id of the last accepted write, for read-back after an
    -- unknown commit outcome (NULL when the writer gave none)
    op           uuid,
    -- the transaction that last accepted a token: protected-table triggers
    -- admit a row write only in that transaction
    fenced_xid   xid8        NOT NULL DEFAULT pg_current_xact_id(),
    trace_id     text        DEFAULT pgfence.current_trace_id()
) WITH (fillfactor = 50); -- room for HOT updates: every accepted write updates its row
-- +goose StatementEnd

-- fences_before_update refuses an UPDATE that would lower an accepted token or
-- move it to another resource: a stale writer must not be able to reset the
-- fence. It fires for an UPDATE that sets token or resource (UPDATE OF): no
-- other UPDATE can change them. pgfence.fence() sets token only when a
-- higher token is accepted, not for the next write with the same token, so
-- the writes of one holder run no trigger (a BEFORE UPDATE trigger without
-- a column list ran a PL/pgSQL frame for every fenced write; a WHEN clause
-- is read back and planned for every statement, which costs more).
-- +goose StatementBegin
CREATE FUNCTION pgfence.fences_before_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.resource <> OLD.resource THEN
        RAISE EXCEPTION 'pgfence: the fence of resource % may not be moved to resource %', OLD.resource, NEW.resource
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', OLD.token, NEW.token, OLD.resource);
    END IF;
    IF NEW.token < OLD.token THEN
        -- The one exception is an operator's lower_fence, which records the
        -- change in pgfence.fence_resets in the same transaction first.
        -- (A separate IF: one expression with the EXISTS would be planned
        -- again for every row, its cheapest plan depending on the tokens.)
        IF EXISTS (SELECT 1 FROM pgfence.fence_resets r
                    WHERE r.resource = OLD.resource AND r.xid = pg_current_xact_id() AND r.to_token = NEW.token) THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'pgfence: token for resource % may not be lowered from % to %', OLD.resource, OLD.token, NEW.token
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', OLD.token, NEW.token, OLD.resource);
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER fences_before_update BEFORE UPDATE OF token, resource ON pgfence.fences
    FOR EACH ROW EXECUTE FUNCTION pgfence.fences_before_update();
-- +goose StatementEnd

-- reject_fence_change refuses DELETE and TRUNCATE on pgfence.fences: they
-- would forget an accepted token and let a stale writer in. A row whose token
-- is at or below the floor or the retention floor carries nothing a later
-- write needs (fence() refuses every such token but its key's newest, which
-- is never stale), so it may go (prune_retired).
-- +goose StatementBegin
CREATE FUNCTION pgfence.reject_fence_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.token <= (SELECT greatest(f.floor, f.retention) FROM pgfence.token_floor f) THEN
            RETURN OLD;
        END IF;
    ELSIF TG_OP = 'UPDATE' THEN
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
--
-- The accepted write costs one read (the lease row and the floors), one
-- UPDATE of the fence row and one read of pgfence.abandoned_requests after
-- the row lock; the checks that only tell which error to raise run after a
-- refusal. A resource fenced before with the same token is updated without
-- setting token, so the fence's UPDATE OF token trigger does not fire; a
-- higher token sets it. Otherwise one INSERT ... ON CONFLICT DO UPDATE ...
-- WHERE f.token <= excluded.token decides: its WHERE is evaluated on the
-- newest row version after the row lock, so no retry loop is needed.
-- +goose StatementBegin
CREATE FUNCTION pgfence.fence(resource text, token bigint, op uuid DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    accepted  bigint;
    issued    bigint;
    retired   bigint;
    retention bigint;
    trace     text;
    done    boolean := false;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF fence.resource IS NULL OR octet_length(fence.resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    IF fence.token IS NULL OR fence.token <= 0 OR fence.token > 6917529027641081856 THEN
        PERFORM pgfence.check_token(fence.token);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('resource', fence.resource);
    END IF;
    -- The token must come from the lease named by the resource, and its grant
    -- must have committed (or be this transaction's own): the lease row holds
    -- the newest token the key issued. A token above it is from a grant that
    -- has not committed, that rolled back (its number is issued again), that
    -- a failover lost, or from another key's lease: counted per key, it says
    -- nothing about this resource. Tokens at or below the floor are retired
    -- (raise_token_floor): their rows may have been pruned, so nothing else
    -- would remember them. At or below the retention floor only the newest
    -- token of its key is taken: an older one was superseded by a later
    -- grant, and the fence row that would have refused it may have been
    -- pruned (advance_retention). The newest token is never stale: no later
    -- one exists to have written.
    --
    -- The common case first: the resource's fence row holds this token
    -- already, above both floors. The lease was checked when the row took
    -- it, and still holds: a key's newest token never goes down, and
    -- prune_retired deletes a lease row only once its newest token is at or
    -- below a floor (and so every token the key issued is). Under READ
    -- COMMITTED a row changed by a concurrent writer is waited for and the
    -- WHERE is re-checked on its newest version, so a higher token committed
    -- meanwhile is never overwritten. The row stays locked until our
    -- transaction ends.
    SELECT f.floor, f.retention INTO retired, retention FROM pgfence.token_floor f;
    -- An accepted token must survive a crash as long as the write it guards.
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    -- The trace of the accepted write (see pgfence.current_trace_id), NULL
    -- when the transaction names none.
    IF current_setting('pgfence.trace_id', true) <> '' THEN
        trace := pgfence.current_trace_id();
    END IF;
    IF fence.token > retired AND fence.token > retention THEN
        UPDATE pgfence.fences AS f
           SET accepted_at = clock_timestamp(), writes = f.writes + 1,
               op = fence.op, fenced_xid = pg_current_xact_id(), trace_id = trace
         WHERE f.resource = fence.resource COLLATE pg_catalog."default" AND f.token = fence.token;
        done := FOUND;
    END IF;
    IF NOT done THEN
        SELECT l.token INTO issued FROM pgfence.leases l WHERE l.key = fence.resource COLLATE pg_catalog."default";
    END IF;
    IF NOT done AND (issued IS NULL OR NOT (issued >= fence.token AND fence.token > retired AND (fence.token > retention OR fence.token = issued))) THEN
        IF issued IS NULL OR issued < fence.token THEN
            RAISE EXCEPTION 'pgfence: token % was not issued by lease %', fence.token, quote_literal(fence.resource)
                USING ERRCODE = 'PF012',
                      DETAIL = format('issued=%s presented=%s resource=%s', coalesce(issued, 0), fence.token, fence.resource),
                      HINT = CASE WHEN issued IS NULL
                                  THEN 'The key has no lease row: no lease of it was granted, or its ended lease was pruned (prune_retired). Fence a resource with a token of the lease whose key is the resource, acquired anew.'
                                  ELSE 'Use the token after its grant committed, of the lease whose key is the resource.' END;
        END IF;
        IF fence.token <= retired THEN
            RAISE EXCEPTION 'pgfence: stale token % for resource %: tokens up to the floor % are retired', fence.token, quote_literal(fence.resource), retired
                USING ERRCODE = 'PF001',
                      DETAIL = format('accepted=%s presented=%s resource=%s', retired, fence.token, fence.resource),
                      HINT = 'The token floor was raised above this token: acquire the lease again.';
        END IF;
        RAISE EXCEPTION 'pgfence: stale token % for resource %: the lease has issued % since, and superseded tokens up to % are retired', fence.token, quote_literal(fence.resource), issued, retention
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', issued, fence.token, fence.resource),
                  HINT = 'A later grant superseded this token: this holder lost its lease and must acquire it again.';
    END IF;
    -- The resource fenced before with this token, when the fast path above
    -- did not try (the token is its key's newest, at or below the retention
    -- floor), then with a lower one.
    IF NOT done AND NOT (fence.token > retired AND fence.token > retention) THEN
        UPDATE pgfence.fences AS f
           SET accepted_at = clock_timestamp(), writes = f.writes + 1,
               op = fence.op, fenced_xid = pg_current_xact_id(), trace_id = trace
         WHERE f.resource = fence.resource COLLATE pg_catalog."default" AND f.token = fence.token;
        done := FOUND;
    END IF;
    IF NOT done THEN
        UPDATE pgfence.fences AS f
           SET token = fence.token, accepted_at = clock_timestamp(), writes = f.writes + 1,
               op = fence.op, fenced_xid = pg_current_xact_id(), trace_id = trace
         WHERE f.resource = fence.resource COLLATE pg_catalog."default" AND f.token < fence.token;
        done := FOUND;
    END IF;
    IF done THEN
        -- The row is ours now; a write whose client abandoned it must not
        -- commit (checked in a statement of its own: a snapshot taken after
        -- the lock). See pgfence.abandoned_requests.
        IF fence.op IS NOT NULL THEN
            PERFORM FROM pgfence.abandoned_requests ab
             WHERE ab.id = fence.op AND ab.kind = 'fence' AND ab.name = fence.resource COLLATE pg_catalog."default";
            IF FOUND THEN
                PERFORM pgfence.raise_if_abandoned('fence', fence.resource, fence.op);
            END IF;
        END IF;
        RETURN fence.token;
    END IF;
    -- Stale, a first write, or a row our UPDATE could not see yet (a
    -- concurrent first writer). A committed higher token is final (tokens
    -- never decrease): reject it without waiting for anyone's row lock.
    SELECT f.token INTO accepted FROM pgfence.fences f WHERE f.resource = fence.resource COLLATE pg_catalog."default";
    IF FOUND AND accepted > fence.token THEN
        RAISE EXCEPTION 'pgfence: stale token % for resource %: token % was accepted', fence.token, quote_literal(fence.resource), accepted
            USING ERRCODE = 'PF001',
                  DETAIL = format('accepted=%s presented=%s resource=%s', accepted, fence.token, fence.resource),
                  HINT = 'A newer holder has written this resource; this writer lost its lease and must not write.';
    END IF;
    -- Otherwise ON CONFLICT waits for a concurrent first writer and evaluates
    -- its WHERE on the newest version after the row lock: one statement
    -- decides, no retry loop.
    INSERT INTO pgfence.fences AS f (resource, token, op, trace_id)
    VALUES (fence.resource, fence.token, fence.op, trace)
    ON CONFLICT (resource) DO UPDATE
       SET token = excluded.token, accepted_at = clock_timestamp(), writes = f.writes + 1,
           op = excluded.op, fenced_xid = pg_current_xact_id(), trace_id = excluded.trace_id
     WHERE f.token <= excluded.token;
    IF FOUND THEN
        IF fence.op IS NOT NULL THEN
            PERFORM FROM pgfence.abandoned_requests ab
             WHERE ab.id = fence.op AND ab.kind = 'fence' AND ab.name = fence.resource COLLATE pg_catalog."default";
            IF FOUND THEN
                PERFORM pgfence.raise_if_abandoned('fence', fence.resource, fence.op);
            END IF;
        END IF;
        RETURN fence.token;
    END IF;
    -- Stale: a higher token committed while we waited. The row is locked by
    -- us now and this read (a new snapshot) sees it.
    SELECT f.token INTO accepted FROM pgfence.fences f WHERE f.resource = fence.resource COLLATE pg_catalog."default";
    RAISE EXCEPTION 'pgfence: stale token % for resource %: token % was accepted', fence.token, quote_literal(fence.resource), accepted
        USING ERRCODE = 'PF001',
              DETAIL = format('accepted=%s presented=%s resource=%s', accepted, fence.token, fence.resource),
              HINT = 'A newer holder has written this resource; this writer lost its lease and must not write.';
END;
$$;
-- +goose StatementEnd

-- fence_probe is pgfence.Resolve's read-back after an unknown commit outcome:
-- it waits for any transaction that holds (or is inserting) the resource's
-- fence row, and returns the newest committed state: writes = 0 means no
-- token was ever accepted. Its probe row is rolled back inside the function,
-- so it changes nothing, and the application role needs no INSERT on fences.
-- +goose StatementBegin
CREATE FUNCTION pgfence.fence_probe(p_resource text)
RETURNS TABLE (token bigint, writes bigint, op uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_token  bigint;
    v_writes bigint;
    v_op     uuid;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.require_granted('resource', p_resource);
    BEGIN
        INSERT INTO pgfence.fences AS f (resource, token, writes) VALUES (p_resource, 1, 0)
            ON CONFLICT (resource) DO UPDATE SET writes = f.writes
        RETURNING f.token, f.writes, f.op INTO v_token, v_writes, v_op;
        -- Undo the probe: variables keep their values when the block's
        -- subtransaction rolls back.
        RAISE EXCEPTION USING ERRCODE = 'PFZ99';
    EXCEPTION WHEN SQLSTATE 'PFZ99' THEN
        NULL;
    END;
    RETURN QUERY SELECT v_token, v_writes, v_op;
END;
$$;
-- +goose StatementEnd

-- check_lease raises PF002 unless holder holds the live lease key with token.
-- It takes FOR SHARE on the lease row (not FOR KEY SHARE: a takeover's ON
-- CONFLICT DO UPDATE must wait for it), so no takeover can commit before the
-- caller's transaction ends; expiry is judged by the database clock.
-- +goose StatementBegin
CREATE FUNCTION pgfence.check_lease(key text, holder uuid, token bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    l pgfence.leases%ROWTYPE;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    IF check_lease.key IS NULL OR octet_length(check_lease.key) NOT BETWEEN 1 AND 512 OR check_lease.holder IS NULL THEN
        RAISE EXCEPTION 'pgfence: check_lease needs a key of 1 to 512 bytes and a holder' USING ERRCODE = 'PF008';
    END IF;
    IF check_lease.token IS NULL OR check_lease.token <= 0 OR check_lease.token > 6917529027641081856 THEN
        PERFORM pgfence.check_token(check_lease.token);
    END IF;
    IF NOT pg_has_role(pgfence.acting_role(), current_user, 'USAGE') THEN
        PERFORM pgfence.require_granted('lease', check_lease.key);
    END IF;
    SELECT * INTO l FROM pgfence.leases WHERE key = check_lease.key COLLATE pg_catalog."default" FOR SHARE;
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
--
-- It runs with the rights of the role that writes the row, not the pgfence
-- owner's, with search_path pinned (so no object of the writer's path can
-- stand in for pg_catalog's). It turns each row into jsonb (to_jsonb(NEW)) to
-- read the resource column, and to_jsonb calls any cast to json of a
-- column's type; the owner of a table can create a type and such a cast, and
-- as SECURITY DEFINER that cast would run as the pgfence owner (a superuser,
-- when migrated as postgres) on every write. It only reads pgfence.fences,
-- which every role that can present a token may read (pgfence_app,
-- pgfence_operator); a writer that may not read it cannot have called
-- pgfence.fence() either, and is refused with the same PF006 as any unfenced
-- write, without touching pgfence's schema.
-- +goose StatementBegin
CREATE FUNCTION pgfence.guard() RETURNS trigger
LANGUAGE plpgsql SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    may_read     boolean := false;
    old_resource text;
    new_resource text;
    res          text;
    fenced       boolean;
BEGIN
    -- A table that came below a protected one after protect (a partition
    -- has this trigger as a clone of its parent's) has no TRUNCATE guard
    -- unless pgfence_guard_new_tables gave it one: every write into it is
    -- refused until it has, so no fenced row lands where TRUNCATE could
    -- remove it without a token. TG_ARGV[2] lists the tables protect
    -- guarded; only another one costs a look at the catalog.
    IF TG_NARGS < 3 OR position(',' || TG_RELID::oid::text || ',' IN TG_ARGV[2]) = 0 THEN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger x
                        WHERE x.tgrelid = TG_RELID AND x.tgname = 'pgfence_guard_truncate' AND x.tgenabled <> 'D') THEN
            RAISE EXCEPTION 'pgfence: % came below a protected table after it was protected, and TRUNCATE of it is not refused: no write to it is accepted', TG_RELID::regclass
                USING ERRCODE = 'PF006',
                      HINT = 'Protect the table it belongs to again (pgfence.protect); with the event trigger pgfence_guard_new_tables, which the migrations install when run as a superuser, new partitions and children are guarded when created.';
        END IF;
    END IF;
    -- Checked one after the other: naming pgfence.fences needs USAGE first.
    IF has_schema_privilege('pgfence', 'USAGE') THEN
        may_read := has_table_privilege('pgfence.fences', 'SELECT');
    END IF;
    IF TG_OP <> 'INSERT' THEN
        old_resource := TG_ARGV[1] || (to_jsonb(OLD) ->> TG_ARGV[0]);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        new_resource := TG_ARGV[1] || (to_jsonb(NEW) ->> TG_ARGV[0]);
    END IF;
    -- The old row's resource, then the new row's if it is another one (an
    -- INSERT, or a row moved to another resource).
    FOREACH res IN ARRAY CASE
            WHEN TG_OP = 'INSERT' THEN ARRAY[new_resource]
            WHEN TG_OP = 'DELETE' OR new_resource IS NOT DISTINCT FROM old_resource THEN ARRAY[old_resource]
            ELSE ARRAY[old_resource, new_resource]
        END
    LOOP
        fenced := false;
        IF may_read AND res IS NOT NULL THEN
            fenced := EXISTS (SELECT 1 FROM pgfence.fences f
                               WHERE f.resource = res AND f.fenced_xid = pg_current_xact_id());
        END IF;
        IF NOT fenced THEN
            IF res IS NULL THEN
                RAISE EXCEPTION 'pgfence: unfenced write to %: the row has no resource', TG_RELID::regclass
                    USING ERRCODE = 'PF006';
            END IF;
            RAISE EXCEPTION 'pgfence: unfenced write to % for resource %: this transaction presented no accepted token', TG_RELID::regclass, quote_literal(res)
                USING ERRCODE = 'PF006',
                      DETAIL = format('resource=%s', res),
                      HINT = 'Call pgfence.fence(resource, token) in the same transaction before writing.';
        END IF;
    END LOOP;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- reject_truncate is the statement trigger of protected tables: TRUNCATE is
-- never fenced.
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
--
-- The resource column must be text or varchar with a deterministic
-- collation, smallint, integer, bigint or uuid (or a domain over one), else
-- PF008: the guard names each row's resource prefix || the column's text, so
-- one row must have one text, whoever writes it. A char(n) prints with its
-- blank padding ('ab   '), a numeric with its scale (1 and 1.00 are one key
-- and two texts), a nondeterministic collation makes 'ALICE' and 'Alice' one
-- key and two texts; a timestamptz prints in the writer's TimeZone, a float
-- by extra_float_digits, an interval by IntervalStyle. With any of them a
-- stale writer could present a token for another text of the same row and
-- get past a higher token.
--
-- The row guard is an AFTER INSERT OR UPDATE OR DELETE trigger: it checks the
-- row as stored, and raising undoes the statement. As a BEFORE trigger it ran
-- before the table's own BEFORE triggers named after it (which could move the
-- row to a resource the transaction never fenced), and before generated
-- columns are computed (a generated resource column read NULL).
--
-- protect also guards every table below relation: a partition gets the row
-- guard from its parent (PostgreSQL clones row triggers), but TRUNCATE of a
-- partition skips the parent's statement trigger, so every partition gets the
-- TRUNCATE guard; an inheritance child gets no trigger from its parent, so it
-- gets both. Tables that come below it later (a partition created or
-- attached, an inheritance child) are guarded when they come by the event
-- trigger pgfence_guard_new_tables, which protects the table again; where it
-- is missing (the migrations ran as a role that may not create event
-- triggers), a new partition refuses every write until the table is
-- protected again, and a new inheritance child is not guarded:
-- `pgfence doctor` (check "protected table guards") lists both.
-- +goose StatementBegin
CREATE FUNCTION pgfence.protect(relation regclass, resource_column text, prefix text DEFAULT '') RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    child   regclass;
    guarded text;
BEGIN
    IF relation IS NULL OR resource_column IS NULL OR prefix IS NULL OR octet_length(prefix) > 512 THEN
        RAISE EXCEPTION 'pgfence: protect: relation, resource_column and a prefix of at most 512 bytes are required' USING ERRCODE = 'PF008';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a
                    WHERE a.attrelid = relation AND a.attname = resource_column AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'pgfence: protect: % has no column %', relation, quote_ident(resource_column) USING ERRCODE = 'PF008';
    END IF;
    -- The resource is the column's text. A timestamptz, float or interval
    -- prints differently under each session's TimeZone, extra_float_digits or
    -- IntervalStyle, so one row would be several resources, fenced apart.
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                    WHERE a.attrelid = relation AND a.attname = resource_column AND a.attnum > 0 AND NOT a.attisdropped
                      AND (CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END)
                          IN ('text'::regtype, 'varchar'::regtype, 'int2'::regtype,
                              'int4'::regtype, 'int8'::regtype, 'uuid'::regtype)) THEN
        RAISE EXCEPTION 'pgfence: protect: column % of % must be text, varchar, smallint, integer, bigint or uuid (or a domain over one)',
                quote_ident(resource_column), relation
            USING ERRCODE = 'PF008',
                  HINT = 'The guard names a row''s resource by the column''s text: char(n) pads it, numeric keeps its scale, and timestamptz, float or interval print by session settings, so one row would be several resources. Fence a text or integer key column.';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
                WHERE a.attrelid = relation AND a.attname = resource_column AND NOT c.collisdeterministic) THEN
        RAISE EXCEPTION 'pgfence: protect: column % of % has a nondeterministic collation',
                quote_ident(resource_column), relation
            USING ERRCODE = 'PF008',
                  HINT = 'Equal keys of such a collation have several texts (''ALICE'' and ''Alice''), so one row would be several resources. Use a deterministic collation, or fence a normalised key column.';
    END IF;
    -- The tables it guards: relation and every table below it, listed in
    -- the row guard's arguments (see guard).
    WITH RECURSIVE tree(relid) AS (
        SELECT relation::oid
        UNION
        SELECT i.inhrelid FROM tree t JOIN pg_inherits i ON i.inhparent = t.relid
    )
    SELECT ',' || string_agg(t.relid::text, ',') || ',' INTO guarded
      FROM tree t JOIN pg_class c ON c.oid = t.relid WHERE c.relkind IN ('r', 'p');
    -- The row guard runs AFTER the row is written, at the end of the
    -- statement, on the row as stored: after every BEFORE trigger (one that
    -- changed the resource column ran after a BEFORE guard, and moved the
    -- row past the check) and after generated columns are computed (a BEFORE
    -- guard saw NULL in them). Raising there undoes the statement.
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', relation);
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', relation);
    EXECUTE format('CREATE TRIGGER pgfence_guard AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.guard(%L, %L, %L)',
                   relation, resource_column, prefix, guarded);
    EXECUTE format('CREATE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION pgfence.reject_truncate()',
                   relation);
    -- Every table below it. A partition gets the row guard from its parent
    -- (PostgreSQL clones row triggers) but TRUNCATE of the partition itself
    -- skips the parent's statement trigger; an inheritance child gets no
    -- trigger at all.
    FOR child IN
        WITH RECURSIVE tree(relid) AS (
            SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = relation
            UNION
            SELECT i.inhrelid FROM tree t JOIN pg_inherits i ON i.inhparent = t.relid
        )
        SELECT t.relid::regclass FROM tree t JOIN pg_class c ON c.oid = t.relid WHERE c.relkind IN ('r', 'p')
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_trigger x
                        WHERE x.tgrelid = child AND x.tgname = 'pgfence_guard' AND x.tgparentid <> 0) THEN
            EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', child);
            EXECUTE format('CREATE TRIGGER pgfence_guard AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.guard(%L, %L, %L)',
                           child, resource_column, prefix, guarded);
        END IF;
        EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', child);
        EXECUTE format('CREATE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION pgfence.reject_truncate()',
                       child);
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- unprotect removes the guard from relation and the tables below it; it
-- returns whether relation had one.
-- +goose StatementBegin
CREATE FUNCTION pgfence.unprotect(relation regclass) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    had   boolean;
    child regclass;
BEGIN
    SELECT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = relation AND t.tgname = 'pgfence_guard') INTO had;
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', relation);
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', relation);
    -- The triggers protect() put on the tables below it (a partition's row
    -- guard, a clone, went with its parent's).
    FOR child IN
        WITH RECURSIVE tree(relid) AS (
            SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = relation
            UNION
            SELECT i.inhrelid FROM tree t JOIN pg_inherits i ON i.inhparent = t.relid
        )
        SELECT t.relid::regclass FROM tree t JOIN pg_class c ON c.oid = t.relid WHERE c.relkind IN ('r', 'p')
    LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', child);
        EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', child);
    END LOOP;
    RETURN had;
END;
$$;
-- +goose StatementEnd

-- guard_new_tables is the function of the event trigger
-- pgfence_guard_new_tables: after a CREATE TABLE or ALTER TABLE that puts a
-- table below a protected one (a partition created or attached, an
-- inheritance child created or added) without a TRUNCATE guard, it protects
-- the protected table above it again, which guards every table below that.
-- It reads only the catalog otherwise, so the statements of roles that do
-- not use pgfence are not affected. It runs as the role that ran the
-- statement, which owns the protected table (PostgreSQL requires that for a
-- new partition or child); a role that may not protect (not a member of
-- pgfence_operator) has its statement refused: nothing comes below a
-- protected table unguarded.
-- +goose StatementBegin
CREATE FUNCTION pgfence.guard_new_tables() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    anc regclass;
    col text;
    pre text;
BEGIN
    FOR anc IN
        WITH RECURSIVE touched(relid) AS (
            SELECT c.objid FROM pg_event_trigger_ddl_commands() c WHERE c.classid = 'pg_class'::regclass
            UNION
            SELECT i.inhrelid FROM touched t JOIN pg_inherits i ON i.inhparent = t.relid
        ), above(relid, anc) AS (
            SELECT t.relid, i.inhparent FROM touched t JOIN pg_inherits i ON i.inhrelid = t.relid
            UNION
            SELECT a.relid, i.inhparent FROM above a JOIN pg_inherits i ON i.inhrelid = a.anc
        )
        SELECT DISTINCT a.anc::regclass
          FROM above a JOIN pg_class c ON c.oid = a.relid
         WHERE c.relkind IN ('r', 'p')
           AND NOT EXISTS (SELECT 1 FROM pg_trigger x WHERE x.tgrelid = a.relid AND x.tgname = 'pgfence_guard_truncate')
           AND EXISTS (SELECT 1 FROM pg_trigger x WHERE x.tgrelid = a.anc AND x.tgname = 'pgfence_guard' AND x.tgparentid = 0)
           AND EXISTS (SELECT 1 FROM pg_trigger x WHERE x.tgrelid = a.anc AND x.tgname = 'pgfence_guard_truncate')
    LOOP
        SELECT p.resource_column, p.prefix INTO col, pre FROM pgfence.protected_tables() p WHERE p.relation = anc;
        PERFORM pgfence.protect(anc, col, pre);
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- The event trigger needs a superuser to create it: a migration run by
-- another role goes without, and new tables below a protected one are then
-- refused writes (partitions) or left unguarded (inheritance children) until
-- the table is protected again.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
        CREATE EVENT TRIGGER pgfence_guard_new_tables ON ddl_command_end
            WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE')
            EXECUTE FUNCTION pgfence.guard_new_tables();
    ELSE
        RAISE NOTICE 'pgfence: not a superuser: the event trigger pgfence_guard_new_tables is not installed; protect a table again after adding a partition or child to it';
    END IF;
END;
$$;
-- +goose StatementEnd

-- protected_tables lists the tables guarded by protect, read from the catalog
-- (so it never disagrees with the triggers that are really installed), with
-- each resource column and prefix exactly as protect() was given them: it
-- splits the raw trigger arguments at their NUL separators and decodes each
-- in the server encoding. (encode(tgargs, 'escape') would turn every byte
-- above 0x7f into an octal escape and double backslashes: a column named "cöl"
-- would be listed as c\303\266l, and a prefix containing the four characters
-- \000 cut there.)
--
-- It lists the tables the role in effect has a privilege on, or every one
-- for operators and the schema's owner, as row-level security shows the
-- other tables' rows: a service sees the tables it writes, not the names
-- and prefixes of other services' tables. (The trigger arguments stay in
-- pg_catalog.pg_trigger, which PostgreSQL lets every role read: this keeps
-- them out of sight, not secret.)
-- +goose StatementBegin
CREATE FUNCTION pgfence.protected_tables() RETURNS TABLE (relation regclass, resource_column text, prefix text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT t.tgrelid::regclass,
           convert_from(substring(t.tgargs FROM 1 FOR greatest(a.sep1 - 1, 0)), current_setting('server_encoding')),
           convert_from(substring(a.rest FROM 1 FOR greatest(position('\x00'::bytea IN a.rest) - 1, 0)), current_setting('server_encoding'))
      FROM pg_catalog.pg_trigger t
     CROSS JOIN LATERAL (SELECT position('\x00'::bytea IN t.tgargs) AS sep1,
                                substring(t.tgargs FROM position('\x00'::bytea IN t.tgargs) + 1) AS rest) a
     WHERE t.tgname = 'pgfence_guard' AND t.tgfoid = 'pgfence.guard()'::regprocedure
       AND (has_table_privilege(t.tgrelid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
            OR pg_has_role('pgfence_operator', 'USAGE')
            OR pg_has_role((SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgfence'), 'USAGE'))
     ORDER BY t.tgrelid::regclass::text;
$$;
-- +goose StatementEnd

-- max_stored_token is the highest token pgfence itself has stored (fences,
-- leases, lease history, the floors): the least floor to restore after a rebuild.
-- Tokens in the application's own fence columns are added by the caller.
-- +goose StatementBegin
CREATE FUNCTION pgfence.max_stored_token() RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT greatest((SELECT max(token) FROM pgfence.fences),
                    (SELECT max(token) FROM pgfence.leases),
                    (SELECT max(token) FROM pgfence.lease_events),
                    (SELECT greatest(floor, retention) FROM pgfence.token_floor),
                    0);
$$;
-- +goose StatementEnd

-- Rejected fenced writes. A rejected write rolls back with its transaction,
-- so it cannot leave a row in that transaction. The Go helpers (package
-- pgfence) record it afterwards, best effort, in one extra statement that
-- runs only on a rejection, when the write ran in its own transaction (not
-- inside a caller's pgx.Tx, whose transaction the rejection aborts). Any other
-- client can call record_fence_rejection after its own rejected write
-- (outside the rejected transaction, or in a fresh one). Rows carry the trace
-- id the caller passes, else the transaction's pgfence.trace_id setting
-- (pgfence.current_trace_id()).
--
-- A row is an audit hint, not a guarantee: record_fence_rejection commits
-- with synchronous_commit off (a crash may forget the newest rows; it never
-- waits for a flush) and never raises for a malformed trace id (stored as
-- NULL). Every 128th row it prunes the rows older than 7 days, at most 1000
-- at a time, by scanning the oldest ids only (ids and timestamps grow
-- together), so there is no index on the timestamp alone and no background
-- job.
--
-- One query then follows a trace from its lease grant to the write it got
-- accepted and to the writes that were refused:
--
--   SELECT e.key, e.event, e.token AS lease_token, f.resource, f.token AS accepted_token,
--          r.resource AS rejected_resource, r.presented_token, r.accepted_token AS rejected_by, r.reason
--     FROM pgfence.lease_events e
--     LEFT JOIN pgfence.fences f ON f.trace_id = e.trace_id
--     LEFT JOIN pgfence.fence_rejections r ON r.trace_id = e.trace_id
--    WHERE e.trace_id = $1 AND e.event IN ('acquired', 'taken_over');
-- +goose StatementBegin
CREATE TABLE pgfence.fence_rejections (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource        text        NOT NULL CHECK (length(resource) BETWEEN 1 AND 1024),
    presented_token bigint      NOT NULL,
    accepted_token  bigint,
    reason          text        NOT NULL CHECK (reason IN ('stale_token', 'lease_not_held', 'token_not_issued')),
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
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_deleted bigint;
BEGIN
    PERFORM pgfence.require_primary();
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
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 OR p_presented_token IS NULL
       OR p_reason IS NULL OR p_reason NOT IN ('stale_token', 'lease_not_held', 'token_not_issued') THEN
        RAISE EXCEPTION 'pgfence: record_fence_rejection needs a resource, the presented token and a reason (stale_token, lease_not_held or token_not_issued)'
            USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.require_granted('resource', p_resource);
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

-- abandon_fence gives up the fenced write with operation id p_op on
-- p_resource, whose reply its client lost (see pgfence.abandoned_requests):
-- from its commit on, that write is refused if it arrives. Then fence_probe
-- tells, in a transaction of its own, whether it got there first. It returns
-- false when the write was abandoned before.
-- +goose StatementBegin
CREATE FUNCTION pgfence.abandon_fence(p_resource text, p_op uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgfence.require_primary();
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.require_granted('resource', p_resource);
    RETURN pgfence.abandon_request('fence', p_resource, p_op);
END;
$$;
-- +goose StatementEnd

-- Operators' corrections of a fence set too high (say, by a token from
-- before the floor was raised, or by hand): one row per lower_fence, kept.
-- +goose StatementBegin
CREATE TABLE pgfence.fence_resets (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource   text        NOT NULL,
    from_token bigint      NOT NULL,
    to_token   bigint      NOT NULL,
    reason     text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    reset_by   name        NOT NULL DEFAULT session_user,
    reset_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    xid        xid8        NOT NULL DEFAULT pg_current_xact_id()
);
-- +goose StatementEnd

-- lower_fence sets the accepted token of p_resource to p_token, lower than
-- the one it has, and records who did it and why in pgfence.fence_resets. It
-- is the recovery path for a resource fenced with a token its lease will not
-- reach again: every holder would be refused (PF001) until then. Lowering a
-- fence lets writers with tokens between p_token and the old one in again:
-- pick p_token at or above every token a live holder may still present (the
-- lease's current token). It returns the token it replaced. Operator only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.lower_fence(p_resource text, p_token bigint, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_old bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'pgfence: resource must be 1 to 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    PERFORM pgfence.check_token(p_token);
    IF p_reason IS NULL OR length(p_reason) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgfence: lower_fence needs a reason of 1 to 1000 characters' USING ERRCODE = 'PF008';
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    SELECT f.token INTO v_old FROM pgfence.fences f WHERE f.resource = p_resource COLLATE pg_catalog."default" FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: no token was accepted for resource %', quote_literal(p_resource)
            USING ERRCODE = 'PF008';
    END IF;
    IF p_token >= v_old THEN
        RAISE EXCEPTION 'pgfence: lower_fence: token % is not below the accepted token % of %', p_token, v_old, quote_literal(p_resource)
            USING ERRCODE = 'PF008';
    END IF;
    INSERT INTO pgfence.fence_resets (resource, from_token, to_token, reason) VALUES (p_resource, v_old, p_token, p_reason);
    UPDATE pgfence.fences f SET token = p_token, trace_id = pgfence.current_trace_id()
     WHERE f.resource = p_resource COLLATE pg_catalog."default";
    RETURN v_old;
END;
$$;
-- +goose StatementEnd

-- prune_retired deletes, at most p_batch rows of each table at a time, what
-- the token floors have retired: lease rows whose token is at or below a
-- floor and that are not live (a later grant of the key starts above both
-- floors), their history, fence rows at or below a floor (fence() refuses
-- such tokens, but a key's newest, which no row is needed to accept), and
-- queue places that expired. Rows retired by the retention floor only go an
-- hour after their lease ended or their write was accepted, so a client that
-- lost a reply still finds them when it settles. It is the retention of
-- tables that otherwise keep a row per key ever used: advance_retention,
-- then prune (or, after a restore, raise_token_floor, which retires live
-- leases' tokens too). It returns what it deleted. Operator only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.prune_retired(p_batch integer DEFAULT 1000)
RETURNS TABLE (leases bigint, events bigint, fences bigint, waiters bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_floor   bigint;
    v_retired bigint;
    v_leases  bigint;
    v_events  bigint;
    v_fences  bigint;
    v_waiters bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'pgfence: prune_retired batch must be 1 to 100000, got %', p_batch USING ERRCODE = 'PF008';
    END IF;
    SELECT f.floor, greatest(f.floor, f.retention) INTO v_floor, v_retired FROM pgfence.token_floor f;
    WITH gone AS (
        DELETE FROM pgfence.leases l
         WHERE l.key IN (SELECT x.key FROM pgfence.leases x
                          WHERE x.token <= v_retired
                            AND least(x.released_at, x.expires_at) <= clock_timestamp()
                                - CASE WHEN x.token <= v_floor THEN interval '0' ELSE interval '1 hour' END
                          LIMIT p_batch FOR UPDATE SKIP LOCKED)
        RETURNING l.key)
    SELECT count(*) INTO v_leases FROM gone;
    WITH gone AS (
        DELETE FROM pgfence.lease_events e
         WHERE e.id IN (SELECT x.id FROM pgfence.lease_events x
                         WHERE x.token <= v_retired AND NOT EXISTS (SELECT 1 FROM pgfence.leases l WHERE l.key = x.key)
                         LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) INTO v_events FROM gone;
    WITH gone AS (
        DELETE FROM pgfence.fences f
         WHERE f.resource IN (SELECT x.resource FROM pgfence.fences x
                               WHERE x.token <= v_retired
                                 AND (x.token <= v_floor OR x.accepted_at <= clock_timestamp() - interval '1 hour')
                               LIMIT p_batch FOR UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*) INTO v_fences FROM gone;
    WITH gone AS (
        DELETE FROM pgfence.lease_waiters w
         WHERE (w.key, w.waiter) IN (SELECT x.key, x.waiter FROM pgfence.lease_waiters x
                                      WHERE x.expires_at <= clock_timestamp() LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) INTO v_waiters FROM gone;
    RETURN QUERY SELECT v_leases, v_events, v_fences, v_waiters;
END;
$$;
-- +goose StatementEnd

-- advance_retention raises the retention floor to the highest token granted
-- so far, and returns it. From then on a token at or below it is refused once
-- a later grant of its key superseded it (its holder lost the lease; the
-- fence row that would refuse it may be pruned), while the newest token of
-- every key keeps working, so no live holder has to acquire again (unlike
-- raise_token_floor); every later grant is above it. prune_retired then
-- deletes the rows of leases that ended over an hour ago and the fence rows
-- written over an hour ago. Run on a schedule (pgfence maintenance schedule)
-- with prune_retired, it keeps pgfence's tables to the keys and resources
-- used recently, however many are used once and never again. It reads the
-- highest token of the leases table (a scan of the rows kept). Operator only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.advance_retention() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_next bigint;
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM set_config('synchronous_commit', 'on', true);
    SELECT greatest(f.retention, f.floor, (SELECT max(l.token) FROM pgfence.leases l)) INTO v_next
      FROM pgfence.token_floor f FOR UPDATE;
    IF v_next > 4611686018427387904 THEN
        RAISE EXCEPTION 'pgfence: the retention floor may not pass 4611686018427387904 (2^62), the highest token granted is %', v_next
            USING ERRCODE = 'PF008',
                  HINT = 'Tokens this high come from a floor raised near the end of the range; the retention floor cannot follow them.';
    END IF;
    UPDATE pgfence.token_floor SET retention = v_next, retention_at = clock_timestamp();
    RETURN v_next;
END;
$$;
-- +goose StatementEnd

-- Nothing for PUBLIC (functions are created executable by everyone), then
-- each role gets exactly its list.
REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgfence FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;

-- Reads: both roles (the Go clients read fence state back after lost
-- replies).
GRANT SELECT ON pgfence.fences, pgfence.fence_rejections TO pgfence_app, pgfence_operator;
GRANT SELECT ON pgfence.fence_resets TO pgfence_operator;

-- The protocol: both roles.
GRANT EXECUTE ON FUNCTION
    pgfence.fence(text, bigint, uuid),
    pgfence.check_lease(text, uuid, bigint),
    pgfence.fence_probe(text),
    pgfence.abandon_fence(text, uuid),
    pgfence.protected_tables(),
    pgfence.record_fence_rejection(text, bigint, bigint, text, text, text, uuid, text)
  TO pgfence_app, pgfence_operator;

-- Operations: the operator role only. CREATE TRIGGER needs EXECUTE on the
-- trigger functions, so protect needs guard and reject_truncate.
GRANT EXECUTE ON FUNCTION
    pgfence.prune_fence_rejections(interval),
    pgfence.prune_retired(integer),
    pgfence.advance_retention(),
    pgfence.lower_fence(text, bigint, text),
    pgfence.max_stored_token(),
    pgfence.protect(regclass, text, text),
    pgfence.unprotect(regclass),
    pgfence.guard(),
    pgfence.reject_truncate()
  TO pgfence_operator;

-- Row-level security, as for the lease tables. The guard of protected tables
-- reads pgfence.fences with the writer's rights: it finds the rows of the
-- resources the writer may fence, which are the only ones it fenced.
ALTER TABLE pgfence.fences ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.fence_rejections ENABLE ROW LEVEL SECURITY;
CREATE POLICY granted ON pgfence.fences FOR SELECT TO pgfence_app USING (pgfence.may_use(resource));
CREATE POLICY granted ON pgfence.fence_rejections FOR SELECT TO pgfence_app USING (pgfence.may_use(resource));
CREATE POLICY operators ON pgfence.fences FOR SELECT TO pgfence_operator USING (true);
CREATE POLICY operators ON pgfence.fence_rejections FOR SELECT TO pgfence_operator USING (true);

-- +goose Down
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
DROP EVENT TRIGGER IF EXISTS pgfence_guard_new_tables;
DROP FUNCTION pgfence.guard_new_tables();
-- The guards go first: their triggers depend on guard and reject_truncate.
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
DROP FUNCTION pgfence.advance_retention();
DROP FUNCTION pgfence.prune_retired(integer);
DROP FUNCTION pgfence.lower_fence(text, bigint, text);
DROP TABLE pgfence.fence_resets;
DROP FUNCTION pgfence.abandon_fence(text, uuid);
DROP FUNCTION pgfence.record_fence_rejection(text, bigint, bigint, text, text, text, uuid, text);
DROP FUNCTION pgfence.prune_fence_rejections(interval);
DROP TABLE pgfence.fence_rejections;
DROP FUNCTION pgfence.max_stored_token();
DROP FUNCTION pgfence.protected_tables();
DROP FUNCTION pgfence.unprotect(regclass);
DROP FUNCTION pgfence.protect(regclass, text, text);
DROP FUNCTION pgfence.reject_truncate();
DROP FUNCTION pgfence.guard();
DROP FUNCTION pgfence.check_lease(text, uuid, bigint);
DROP FUNCTION pgfence.fence_probe(text);
DROP FUNCTION pgfence.fence(text, bigint, uuid);
-- The table goes before its trigger functions.
DROP TABLE pgfence.fences;
DROP FUNCTION pgfence.reject_fence_change();
DROP FUNCTION pgfence.fences_before_update();
