-- The guard of protected tables runs with the writer's rights, not the
-- pgfence owner's.
--
-- Migration 00009 made pgfence.guard() SECURITY DEFINER. It turns each row
-- into jsonb (to_jsonb(NEW)) to read the resource column, and to_jsonb calls
-- any cast to json of a column's type. The owner of a table can create a
-- type and such a cast: a member of pgfence_operator who protects its own
-- table had its cast run as the pgfence owner (a superuser, when migrated as
-- postgres) on every write, and could make itself superuser.
--
-- The guard now runs as the role that writes the row, with search_path
-- pinned (so no object of the writer's path can stand in for pg_catalog's).
-- It only reads pgfence.fences, which every role that can present a token
-- may read (pgfence_app, pgfence_operator); a writer that may not read it
-- cannot have called pgfence.fence() either, and is refused with the same
-- PF006 as any unfenced write, without touching pgfence's schema. The PF006
-- errors are raised here, not by pgfence.raise_unfenced(), which writers may
-- not call.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.guard() RETURNS trigger
LANGUAGE plpgsql SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    may_read     boolean := false;
    old_resource text;
    new_resource text;
    res          text;
    fenced       boolean;
BEGIN
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

-- +goose Down
-- The body of 00003 with the attributes of 00009, restored.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgfence.guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
