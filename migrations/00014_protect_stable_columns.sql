-- pgfence.protect() accepts only resource columns whose text does not
-- depend on session settings.
--
-- The guard names each row's resource prefix || the resource column's text,
-- computed in the writer's session. A timestamptz column prints in the
-- writer's TimeZone, a float by extra_float_digits, an interval by
-- IntervalStyle: a writer with another setting fenced another resource for
-- the same row, and a stale writer got past a higher token that way
-- (reproduced with TimeZone). protect() now refuses such columns (PF008);
-- text, varchar, char, the integer types, numeric and uuid (or a domain over
-- one) print the same everywhere. Tables protected before keep their guard:
-- unprotect and protect them on a text or integer key column.
--
-- CREATE OR REPLACE resets a function's settings: search_path is restated
-- as migration 00009 set it.

-- +goose Up
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

-- +goose Down
-- The body of 00003 with the settings of 00009, restored.
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
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard ON %s', relation);
    EXECUTE format('DROP TRIGGER IF EXISTS pgfence_guard_truncate ON %s', relation);
    EXECUTE format('CREATE TRIGGER pgfence_guard BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.guard(%L, %L)',
                   relation, resource_column, prefix);
    EXECUTE format('CREATE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION pgfence.reject_truncate()',
                   relation);
END;
$$;
-- +goose StatementEnd
