-- pgfence.protected_tables() reports each protected table's resource column
-- and prefix exactly as pgfence.protect() was given them.
--
-- The version of 00003_fence.sql decoded the trigger arguments with
-- encode(tgargs, 'escape'), which turns every byte above 0x7f into an octal
-- escape and doubles backslashes: a column named "cöl" was listed as
-- c\303\266l, and a prefix containing the four characters \000 was cut there.
-- This version splits the raw bytes at their NUL separators and decodes each
-- argument in the server encoding. The signature is unchanged; settings and
-- SECURITY DEFINER that a later migration or an operator put on the function
-- are kept (CREATE OR REPLACE would otherwise reset them).

-- +goose Up
-- +goose StatementBegin
DO $migration$
DECLARE
    cfg    text[];
    secdef boolean;
    item   text;
    gucname text;
    val    text;
BEGIN
    SELECT p.proconfig, p.prosecdef INTO cfg, secdef
      FROM pg_catalog.pg_proc p WHERE p.oid = 'pgfence.protected_tables()'::regprocedure;
    EXECUTE $fn$
CREATE OR REPLACE FUNCTION pgfence.protected_tables() RETURNS TABLE (relation regclass, resource_column text, prefix text)
LANGUAGE sql STABLE AS $$
    SELECT t.tgrelid::regclass,
           convert_from(substring(t.tgargs FROM 1 FOR greatest(a.sep1 - 1, 0)), current_setting('server_encoding')),
           convert_from(substring(a.rest FROM 1 FOR greatest(position('\x00'::bytea IN a.rest) - 1, 0)), current_setting('server_encoding'))
      FROM pg_catalog.pg_trigger t
     CROSS JOIN LATERAL (SELECT position('\x00'::bytea IN t.tgargs) AS sep1,
                                substring(t.tgargs FROM position('\x00'::bytea IN t.tgargs) + 1) AS rest) a
     WHERE t.tgname = 'pgfence_guard' AND t.tgfoid = 'pgfence.guard()'::regprocedure
     ORDER BY t.tgrelid::regclass::text;
$$
$fn$;
    -- Put back what CREATE OR REPLACE reset.
    IF secdef THEN
        ALTER FUNCTION pgfence.protected_tables() SECURITY DEFINER;
    END IF;
    FOREACH item IN ARRAY coalesce(cfg, '{}'::text[]) LOOP
        gucname := split_part(item, '=', 1);
        val := substr(item, strpos(item, '=') + 1);
        EXECUTE format('ALTER FUNCTION pgfence.protected_tables() SET %s = %s', gucname,
                       CASE WHEN gucname = 'search_path' AND val = '""' THEN quote_literal('')
                            WHEN gucname = 'search_path' THEN val -- a list, already quoted as identifiers
                            ELSE quote_literal(val) END);
    END LOOP;
END;
$migration$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $migration$
DECLARE
    cfg    text[];
    secdef boolean;
    item   text;
    gucname text;
    val    text;
BEGIN
    SELECT p.proconfig, p.prosecdef INTO cfg, secdef
      FROM pg_catalog.pg_proc p WHERE p.oid = 'pgfence.protected_tables()'::regprocedure;
    EXECUTE $fn$
CREATE OR REPLACE FUNCTION pgfence.protected_tables() RETURNS TABLE (relation regclass, resource_column text, prefix text)
LANGUAGE sql STABLE AS $$
    SELECT t.tgrelid::regclass,
           replace(a.args[1], '\\', '\'),
           replace(coalesce(a.args[2], ''), '\\', '\')
      FROM pg_trigger t
     CROSS JOIN LATERAL (SELECT string_to_array(encode(t.tgargs, 'escape'), '\000') AS args) a
     WHERE t.tgname = 'pgfence_guard' AND t.tgfoid = 'pgfence.guard()'::regprocedure
     ORDER BY t.tgrelid::regclass::text;
$$
$fn$;
    -- Put back what CREATE OR REPLACE reset.
    IF secdef THEN
        ALTER FUNCTION pgfence.protected_tables() SECURITY DEFINER;
    END IF;
    FOREACH item IN ARRAY coalesce(cfg, '{}'::text[]) LOOP
        gucname := split_part(item, '=', 1);
        val := substr(item, strpos(item, '=') + 1);
        EXECUTE format('ALTER FUNCTION pgfence.protected_tables() SET %s = %s', gucname,
                       CASE WHEN gucname = 'search_path' AND val = '""' THEN quote_literal('')
                            WHEN gucname = 'search_path' THEN val -- a list, already quoted as identifiers
                            ELSE quote_literal(val) END);
    END LOOP;
END;
$migration$;
-- +goose StatementEnd
