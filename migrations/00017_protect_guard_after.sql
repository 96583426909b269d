-- protect() installs the row guard as an AFTER trigger, and guards the
-- tables below the one it is given.
--
-- The row guard was a BEFORE trigger. BEFORE triggers fire in name order, so
-- a table's own BEFORE trigger named after "pgfence_guard" ran after the
-- check and could change the resource column: a transaction fenced for
-- "jobs:B" stored a row of "jobs:b", a resource it never fenced. A generated
-- resource column is computed after BEFORE triggers, so the guard saw NULL
-- and refused every write. protect() now creates the row guard AFTER INSERT
-- OR UPDATE OR DELETE: it checks the row as stored, and raising undoes the
-- statement. (Measured with a benchmark of fenced single-row and 100-row
-- updates: the difference is within the run-to-run noise.)
--
-- protect() put its triggers on the table it was given. A partition gets the
-- row guard from its parent (PostgreSQL clones row triggers), but TRUNCATE of
-- a partition skips the parent's statement trigger, so it emptied the
-- partition unfenced; an inheritance child got no guard at all, and writes
-- through it (or through the parent, for rows stored in it) were unchecked.
-- protect() now installs the TRUNCATE guard on every partition and both
-- guards on every inheritance child, and unprotect() removes them. A
-- partition attached or a child created later gets only what PostgreSQL
-- clones: `pgfence doctor` (check "protected table guards") lists it, and
-- protecting the parent again covers it.
--
-- Tables protected before keep their triggers (a BEFORE row guard, no
-- guards below them) until they are protected again; `pgfence doctor` lists
-- them. The migration does not re-create them itself: that needs each
-- table's owner and locks each table.
--
-- CREATE OR REPLACE resets a function's settings: search_path is restated as
-- migration 00009 set it. Down restores the bodies of 00014 (protect) and
-- 00003 (unprotect).

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.protect(relation regclass, resource_column text, prefix text DEFAULT '') RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    child regclass;
BEGIN
    IF relation IS NULL OR resource_column IS NULL OR prefix IS NULL THEN
        RAISE EXCEPTION 'pgfence: protect: relation, resource_column and prefix must not be NULL' USING ERRCODE = 'PF008';
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
                          IN ('text'::regtype, 'varchar'::regtype, 'bpchar'::regtype, 'int2'::regtype,
                              'int4'::regtype, 'int8'::regtype, 'numeric'::regtype, 'uuid'::regtype)) THEN
        RAISE EXCEPTION 'pgfence: protect: column % of % must be text, varchar, char, smallint, integer, bigint, numeric or uuid (or a domain over one)',
                quote_ident(resource_column), relation
            USING ERRCODE = 'PF008',
                  HINT = 'Other types print differently under different session settings (TimeZone, extra_float_digits, IntervalStyle): fence a text or integer key column instead.';
    END IF;
    -- The row guard runs AFTER the row is written, at the end of the
    -- statement, on the row as stored: after every BEFORE trigger (one that
    -- changed the resource column ran after a BEFORE guard, and moved the
    -- row past the check) and after generated columns are computed (a BEFORE
    -- guard saw NULL in them). Raising there undoes the statement.
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', relation);
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', relation);
    EXECUTE format('CREATE TRIGGER pgfence_guard AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.guard(%L, %L)',
                   relation, resource_column, prefix);
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
            EXECUTE format('CREATE TRIGGER pgfence_guard AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.guard(%L, %L)',
                           child, resource_column, prefix);
        END IF;
        EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', child);
        EXECUTE format('CREATE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION pgfence.reject_truncate()',
                       child);
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.unprotect(relation regclass) RETURNS boolean
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

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.protect(relation regclass, resource_column text, prefix text DEFAULT '') RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF relation IS NULL OR resource_column IS NULL OR prefix IS NULL THEN
        RAISE EXCEPTION 'pgfence: protect: relation, resource_column and prefix must not be NULL' USING ERRCODE = 'PF008';
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
                          IN ('text'::regtype, 'varchar'::regtype, 'bpchar'::regtype, 'int2'::regtype,
                              'int4'::regtype, 'int8'::regtype, 'numeric'::regtype, 'uuid'::regtype)) THEN
        RAISE EXCEPTION 'pgfence: protect: column % of % must be text, varchar, char, smallint, integer, bigint, numeric or uuid (or a domain over one)',
                quote_ident(resource_column), relation
            USING ERRCODE = 'PF008',
                  HINT = 'Other types print differently under different session settings (TimeZone, extra_float_digits, IntervalStyle): fence a text or integer key column instead.';
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.unprotect(relation regclass) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
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
