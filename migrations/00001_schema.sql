-- pgfence schema: the schema, the roles, the token source and the trace id.
--
-- Every pgfence object lives in the schema "pgfence". The Go migrator creates
-- the schema before goose runs (its version table, pgfence.goose_db_version,
-- and its lock, pgfence.migration_lock, live there too); the CREATE SCHEMA
-- below is for teams that apply these files with another migration tool.
--
-- Trust. The migrating role owns the schema and every object in it: pgfence's
-- SECURITY DEFINER functions run with its rights, so an object that another
-- role owns (the schema itself, a function, a type, a table, ...) would let
-- that role run code as the migrating role, often a superuser. The first
-- statement below refuses to go on, before it changes anything, when:
--   - schema pgfence exists and another role owns it, or owns anything in it,
--     or another role may CREATE in it;
--   - another role may write a pgfence table or add triggers to it;
--   - the migrating role's default privileges would grant such rights (or
--     EXECUTE on functions) on what the migrations create;
--   - role pgfence_app or pgfence_operator exists with LOGIN, SUPERUSER,
--     CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS, or as a member of
--     another role: their members could use them.
-- It also pins search_path to pg_catalog, pg_temp for the rest of the
-- transaction, so no object in another schema is picked up instead of a
-- built-in. The Go migrator runs the same query before every run.
--
-- SQLSTATEs raised by pgfence (class PF, never ending in 000):
--   PF001 stale token: a fenced write presented a token older than the one accepted
--   PF002 lease not held: a lease-checked write or renewal by a holder that lost
--         its lease, or an idempotency call by an attempt that no longer owns the key
--   PF003 lease held by another holder
--   PF004 idempotency key reused with a different request payload
--   PF005 not a primary: tokens are never issued while the server is in recovery
--   PF006 unfenced write: a write to a protected table without a current token
--   PF007 idempotency key in progress
--   PF008 invalid argument
--   PF009 token floor may only be raised
--   PF010 transaction isolation is not READ COMMITTED (idempotency claims)
--   PF011 new grants paused for the key's prefix
--   PF012 token not issued: a fenced write presented a token that the lease
--         named by its resource has not issued (yet): from a grant that has not
--         committed, that rolled back or that a failover lost, or from another
--         key's lease
--   PF013 request abandoned: the request's client gave it up after its reply
--         was lost and was told that it did not happen (abandon_grant,
--         abandon_fence); the request arrived late and is refused
--   PF014 name not granted: the calling role may not use this lease key,
--         resource or idempotency scope (see grant_prefix)
--
-- Roles. Two NOLOGIN group roles; grant them to your login roles:
--
--   pgfence_app       takes part in the protocol through the functions only:
--                     try_acquire/acquire/renew/release, the fair queue,
--                     fence/check_lease/fence_probe, record_fence_rejection,
--                     the idempotency claims, and reads of the pgfence tables
--                     and lease_status. It has no INSERT/UPDATE/DELETE on any
--                     pgfence table, so it can neither mint, move nor lower a
--                     token, a fence or the floor.
--   pgfence_operator  everything pgfence_app can, plus force_release,
--                     raise_token_floor, protect/unprotect (of tables it owns),
--                     pause_grants/resume_grants, prune_lease_events,
--                     prune_fence_rejections and idempotency_gc.
--
--   GRANT pgfence_app TO orders_service;      -- a LOGIN role of the application
--   GRANT pgfence_operator TO oncall;         -- people and the CLI
--
-- Roles are cluster-wide, so this migration creates them only if they are
-- absent (the migrating role needs CREATEROLE then, else it stops with a hint)
-- and its Down never drops them: other databases of the cluster may use them,
-- and dropping them would silently remove their members.
--
-- Privileges. Functions are created executable by PUBLIC: each migration
-- revokes that for every function it creates and grants EXECUTE to the roles
-- above, function by function, and SELECT on its tables. Functions that write
-- pgfence tables run as their owner (SECURITY DEFINER) with search_path pinned
-- to pg_catalog, pg_temp: every pgfence object in their bodies is
-- schema-qualified and every built-in they use (functions, operators, types)
-- lives in pg_catalog, so no object a caller creates can be picked up instead.

-- +goose Up
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
-- The Go migrator runs the query between the "findings" markers on its own
-- (and a SQL script starts with this whole statement): keep the markers.
-- +goose StatementBegin
-- pgfence:trust-check begin
DO $pgfence_trust$
DECLARE
    f        record;
    v_count  integer := 0;
    v_first  text;
    v_detail text := '';
    v_hint   text := '';
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    FOR f IN
        -- pgfence:findings begin
        WITH me AS (
            SELECT r.oid, r.rolname FROM pg_catalog.pg_roles r
             WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER
        ), ns AS (
            SELECT n.oid, n.nspowner, n.nspacl FROM pg_catalog.pg_namespace n
             WHERE n.nspname OPERATOR(pg_catalog.=) 'pgfence'
        ), owned (rank, classid, objid, owner) AS (
            SELECT 1, 'pg_catalog.pg_namespace'::pg_catalog.regclass, n.oid, n.nspowner FROM ns n
            UNION ALL
            SELECT 3, 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid, c.relowner
              FROM pg_catalog.pg_class c JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid
            UNION ALL
            SELECT 3, 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, p.proowner
              FROM pg_catalog.pg_proc p JOIN ns ON p.pronamespace OPERATOR(pg_catalog.=) ns.oid
            UNION ALL
            -- Not a relation's row type nor an array type: those have the
            -- owner of their relation or element.
            SELECT 3, 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid, t.typowner
              FROM pg_catalog.pg_type t JOIN ns ON t.typnamespace OPERATOR(pg_catalog.=) ns.oid
             WHERE t.typrelid OPERATOR(pg_catalog.=) 0::pg_catalog.oid
               AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type e WHERE e.typarray OPERATOR(pg_catalog.=) t.oid)
            UNION ALL
            SELECT 3, 'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid, o.oprowner
              FROM pg_catalog.pg_operator o JOIN ns ON o.oprnamespace OPERATOR(pg_catalog.=) ns.oid
            UNION ALL
            SELECT 3, 'pg_catalog.pg_opclass'::pg_catalog.regclass, o.oid, o.opcowner
              FROM pg_catalog.pg_opclass o JOIN ns ON o.opcnamespace OPERATOR(pg_catalog.=) ns.oid
            UNION ALL
            SELECT 3, 'pg_catalog.pg_opfamily'::pg_catalog.regclass, o.oid, o.opfowner
              FROM pg_catalog.pg_opfamily o JOIN ns ON o.opfnamespace OPERATOR(pg_catalog.=) ns.oid
            UNION ALL
            SELECT 3, 'pg_catalog.pg_collation'::pg_catalog.regclass, o.oid, o.collowner
              FROM pg_catalog.pg_collation o JOIN ns ON o.collnamespace OPERATOR(pg_catalog.=) ns.oid
            UNION ALL
            SELECT 3, 'pg_catalog.pg_conversion'::pg_catalog.regclass, o.oid, o.conowner
              FROM pg_catalog.pg_conversion o JOIN ns ON o.connamespace OPERATOR(pg_catalog.=) ns.oid
            UNION ALL
            SELECT 3, 'pg_catalog.pg_ts_config'::pg_catalog.regclass, o.oid, o.cfgowner
              FROM pg_catalog.pg_ts_config o JOIN ns ON o.cfgnamespace OPERATOR(pg_catalog.=) ns.oid
            UNION ALL
            SELECT 3, 'pg_catalog.pg_ts_dict'::pg_catalog.regclass, o.oid, o.dictowner
              FROM pg_catalog.pg_ts_dict o JOIN ns ON o.dictnamespace OPERATOR(pg_catalog.=) ns.oid
            UNION ALL
            SELECT 3, 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass, o.oid, o.stxowner
              FROM pg_catalog.pg_statistic_ext o JOIN ns ON o.stxnamespace OPERATOR(pg_catalog.=) ns.oid
            UNION ALL
            SELECT 3, 'pg_catalog.pg_extension'::pg_catalog.regclass, o.oid, o.extowner
              FROM pg_catalog.pg_extension o JOIN ns ON o.extnamespace OPERATOR(pg_catalog.=) ns.oid
        ), grantee (oid, name) AS (
            SELECT 0::pg_catalog.oid, 'PUBLIC'::pg_catalog.text
            UNION ALL
            SELECT r.oid, pg_catalog.quote_ident(r.rolname) FROM pg_catalog.pg_roles r
        )
        SELECT o.rank,
               pg_catalog.pg_describe_object(o.classid, o.objid, 0) AS object,
               pg_catalog.format('is owned by role %I, not by the migrating role %I: its owner can %s, and pgfence''s SECURITY DEFINER functions would run %s with the rights of %I',
                   pg_catalog.pg_get_userbyid(o.owner), me.rolname,
                   CASE WHEN o.rank OPERATOR(pg_catalog.=) 1 THEN 'replace any object in it' ELSE 'change it' END,
                   CASE WHEN o.rank OPERATOR(pg_catalog.=) 1 THEN 'the replacement' ELSE 'it' END,
                   me.rolname) AS problem,
               CASE WHEN o.rank OPERATOR(pg_catalog.=) 1
                    THEN pg_catalog.format('Migrate as role %I, its owner; or, if the schema holds no pgfence installation, review what it holds, drop it (DROP SCHEMA pgfence CASCADE) and migrate again. To prepare the schema for the role that migrates: CREATE SCHEMA pgfence AUTHORIZATION that_role.',
                                           pg_catalog.pg_get_userbyid(o.owner))
                    ELSE pg_catalog.format('Drop what pgfence did not create; migrate as the owner of the rest, or hand it to the migrating role (ALTER ... OWNER TO %I).', me.rolname)
               END AS fix
          FROM owned o CROSS JOIN me
         WHERE o.owner OPERATOR(pg_catalog.<>) me.oid
        UNION ALL
        SELECT 2, 'schema pgfence',
               pg_catalog.format('grants CREATE to %s, who could add objects to it', g.name),
               pg_catalog.format('REVOKE CREATE ON SCHEMA pgfence FROM %s;', g.name)
          FROM ns CROSS JOIN LATERAL pg_catalog.aclexplode(ns.nspacl) a
          JOIN grantee g ON g.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
           AND a.grantee OPERATOR(pg_catalog.<>) ns.nspowner
        UNION ALL
        SELECT 4, pg_catalog.pg_describe_object('pg_catalog.pg_class'::pg_catalog.regclass, c.oid, 0),
               pg_catalog.format('grants %s to %s: only pgfence''s functions may write pgfence tables, and a trigger added to one would run with the rights of those functions',
                   a.privilege_type, g.name),
               pg_catalog.format('REVOKE %s ON %s FROM %s;', a.privilege_type, c.oid::pg_catalog.regclass, g.name)
          FROM pg_catalog.pg_class c JOIN ns ON c.relnamespace OPERATOR(pg_catalog.=) ns.oid
         CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a
          JOIN grantee g ON g.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p}'::pg_catalog."char"[])
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND a.privilege_type OPERATOR(pg_catalog.=) ANY ('{INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER}'::pg_catalog.text[])
        UNION ALL
        SELECT 5, pg_catalog.format('default privileges of role %I%s', me.rolname,
                   CASE WHEN d.defaclnamespace OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN '' ELSE ' in schema pgfence' END),
               pg_catalog.format('grant %s on every new %s to %s: the migrations would create pgfence''s %s with it',
                   a.privilege_type, k.kind, g.name, k.kind),
               pg_catalog.format('ALTER DEFAULT PRIVILEGES FOR ROLE %I%s REVOKE %s ON %s FROM %s;', me.rolname,
                   CASE WHEN d.defaclnamespace OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN '' ELSE ' IN SCHEMA pgfence' END,
                   a.privilege_type, pg_catalog.upper(k.kind), g.name)
          FROM pg_catalog.pg_default_acl d CROSS JOIN me
         CROSS JOIN LATERAL pg_catalog.aclexplode(d.defaclacl) a
          JOIN grantee g ON g.oid OPERATOR(pg_catalog.=) a.grantee
          JOIN (VALUES ('r'::pg_catalog."char", 'tables'::pg_catalog.text), ('f', 'functions')) k (objtype, kind)
            ON k.objtype OPERATOR(pg_catalog.=) d.defaclobjtype
         WHERE d.defaclrole OPERATOR(pg_catalog.=) me.oid
           AND (d.defaclnamespace OPERATOR(pg_catalog.=) 0::pg_catalog.oid
                OR d.defaclnamespace OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ns.oid FROM ns)))
           AND a.grantee OPERATOR(pg_catalog.<>) me.oid
           AND CASE WHEN k.objtype OPERATOR(pg_catalog.=) 'r'
                    THEN a.privilege_type OPERATOR(pg_catalog.<>) 'SELECT'
                    ELSE a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
               END
        UNION ALL
        SELECT 6, pg_catalog.format('role %I', r.rolname),
               pg_catalog.format('exists with %s: pgfence''s roles must be NOLOGIN groups without attributes, since pgfence grants them privileges and application roles become their members (whoever logs in as one, or sets it as its role, holds both)',
                   pg_catalog.concat_ws(', ',
                       CASE WHEN r.rolcanlogin THEN 'LOGIN' END, CASE WHEN r.rolsuper THEN 'SUPERUSER' END,
                       CASE WHEN r.rolcreatedb THEN 'CREATEDB' END, CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END,
                       CASE WHEN r.rolreplication THEN 'REPLICATION' END, CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END)),
               pg_catalog.format('If it is pgfence''s role: ALTER ROLE %I %s; otherwise pgfence cannot use that name.', r.rolname,
                   pg_catalog.concat_ws(' ',
                       CASE WHEN r.rolcanlogin THEN 'NOLOGIN' END, CASE WHEN r.rolsuper THEN 'NOSUPERUSER' END,
                       CASE WHEN r.rolcreatedb THEN 'NOCREATEDB' END, CASE WHEN r.rolcreaterole THEN 'NOCREATEROLE' END,
                       CASE WHEN r.rolreplication THEN 'NOREPLICATION' END, CASE WHEN r.rolbypassrls THEN 'NOBYPASSRLS' END))
          FROM pg_catalog.pg_roles r
         WHERE r.rolname OPERATOR(pg_catalog.=) ANY ('{pgfence_app,pgfence_operator}'::pg_catalog.name[])
           AND (r.rolcanlogin OR r.rolsuper OR r.rolcreatedb OR r.rolcreaterole OR r.rolreplication OR r.rolbypassrls)
        UNION ALL
        SELECT 7, pg_catalog.format('role %I', r.rolname),
               pg_catalog.format('is a member of role %I, so every member of %I would get the privileges of %I too', g.rolname, r.rolname, g.rolname),
               pg_catalog.format('REVOKE %I FROM %I;', g.rolname, r.rolname)
          FROM pg_catalog.pg_roles r
          JOIN pg_catalog.pg_auth_members m ON m.member OPERATOR(pg_catalog.=) r.oid
          JOIN pg_catalog.pg_roles g ON g.oid OPERATOR(pg_catalog.=) m.roleid
         WHERE r.rolname OPERATOR(pg_catalog.=) ANY ('{pgfence_app,pgfence_operator}'::pg_catalog.name[])
        ORDER BY 1, 2, 3
        -- pgfence:findings end
    LOOP
        v_count := v_count OPERATOR(pg_catalog.+) 1;
        IF v_count OPERATOR(pg_catalog.=) 1 THEN
            v_first := pg_catalog.concat(f.object, ' ', f.problem);
        END IF;
        v_detail := pg_catalog.concat(v_detail, f.object, ' ', f.problem, E'\n');
        IF pg_catalog.strpos(v_hint, f.fix) OPERATOR(pg_catalog.=) 0 THEN
            v_hint := pg_catalog.concat(v_hint, f.fix, E'\n');
        END IF;
    END LOOP;
    IF v_count OPERATOR(pg_catalog.>) 0 THEN
        RAISE EXCEPTION '%', pg_catalog.format('pgfence: refusing to migrate as role %I: %s%s', CURRENT_USER, v_first,
                CASE WHEN v_count OPERATOR(pg_catalog.>) 1
                     THEN pg_catalog.format(' (and %s more, see DETAIL)', v_count OPERATOR(pg_catalog.-) 1) ELSE '' END)
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.rtrim(v_detail, E'\n'),
                  HINT = pg_catalog.rtrim(v_hint, E'\n');
    END IF;
END
$pgfence_trust$;
-- pgfence:trust-check end
-- +goose StatementEnd

-- +goose StatementBegin
CREATE SCHEMA IF NOT EXISTS pgfence;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgfence_app', 'pgfence_operator'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN
                    NULL; -- created meanwhile by the migration of another database
                WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'pgfence: role % does not exist and role % may not create it', r, current_user
                        USING ERRCODE = '42501',
                              HINT = 'Have a role with CREATEROLE run: CREATE ROLE pgfence_app NOLOGIN; CREATE ROLE pgfence_operator NOLOGIN; then migrate again.';
            END;
        END IF;
    END LOOP;
END;
$$;
-- +goose StatementEnd

GRANT USAGE ON SCHEMA pgfence TO pgfence_app, pgfence_operator;

-- +goose StatementBegin
DO $$
BEGIN
    -- goose's version table, for `pgfence doctor` run as an operator (it is
    -- absent when another tool applied these files).
    IF pg_catalog.to_regclass('pgfence.goose_db_version') IS NOT NULL THEN
        GRANT SELECT ON pgfence.goose_db_version TO pgfence_operator;
    END IF;
END;
$$;
-- +goose StatementEnd

-- Row checks of the hot tables, as domains. A column of one of these types
-- checks a value whenever one is stored in it (an INSERT, or an UPDATE that
-- sets the column), whoever writes it, with SQLSTATE 23514 as a CHECK
-- constraint. PostgreSQL keeps a domain's checks compiled in its type cache,
-- while it reads back and plans a table's CHECK expressions for every
-- statement that writes the table, and a CHECK that calls a function runs a
-- function frame for every row: a fenced write that sets the token and the
-- write count pays for two comparisons, not for a plan or a frame. Checks
-- that compare two columns stay table CHECKs.
--
-- key_name is a lease key, a fenced resource or an idempotency scope or key:
-- 1 to 512 bytes.
-- +goose StatementBegin
CREATE DOMAIN pgfence.key_name AS text CHECK (octet_length(VALUE) BETWEEN 1 AND 512);
-- +goose StatementEnd

-- token_value is a token some grant issued: above 0.
-- +goose StatementBegin
CREATE DOMAIN pgfence.token_value AS bigint CHECK (VALUE > 0);
-- +goose StatementEnd

-- write_count counts writes: 0 or more.
-- +goose StatementBegin
CREATE DOMAIN pgfence.write_count AS bigint CHECK (VALUE >= 0);
-- +goose StatementEnd

-- The token floor: tokens issued from now on are strictly greater than this
-- value. An operator raises it after restoring or rebuilding the schema so that
-- tokens never restart below tokens already stored in business tables.
--
-- retention is the retention floor (advance_retention): tokens issued from now
-- on are greater than it too, and a token at or below it is refused unless it
-- is the newest its key issued, so the rows of ended leases and their fence
-- rows may go (prune_retired) without retiring a live holder's token.
-- +goose StatementBegin
CREATE TABLE pgfence.token_floor (
    singleton    boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    floor        bigint      NOT NULL DEFAULT 0 CHECK (floor >= 0),
    raised_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    reason       text        NOT NULL DEFAULT 'initial' CHECK (length(reason) BETWEEN 1 AND 1000),
    retention    bigint      NOT NULL DEFAULT 0 CHECK (retention >= 0),
    retention_at timestamptz
);
-- +goose StatementEnd

-- +goose StatementBegin
INSERT INTO pgfence.token_floor DEFAULT VALUES;
-- +goose StatementEnd

-- The floor leaves tokens room to grow. A token is (timeline << 40) | counter
-- and never below floor + 1. A floor near the end of the bigint range (a typo,
-- or a script that took the wrong column) would make every later grant fail
-- with "bigint out of range", and since the floor is never lowered
-- (raise_token_floor refuses, PF009), there would be no way back. 2^62 is far
-- above any token a real cluster issues and leaves 2^62 more. The Go API
-- (pgfence.MaxTokenFloor) and the CLI refuse the same before they send
-- anything; this constraint closes the other doors (psql, an UPDATE by the
-- owner).
--
-- NOT VALID, like the row checks of the other pgfence tables: PostgreSQL
-- checks every row inserted or updated once the constraint exists; NOT VALID
-- only records that the rows already there were not scanned.
-- +goose StatementBegin
ALTER TABLE pgfence.token_floor
    ADD CONSTRAINT floor_leaves_room CHECK (floor <= 4611686018427387904 AND retention <= 4611686018427387904) NOT VALID;
-- +goose StatementEnd

-- require_primary raises PF005 on a server in recovery. Every function of the
-- protocol calls it first, so a standby never answers "held", "not granted"
-- or "stale": it says it is not the primary, whatever the state it replicated.
-- +goose StatementBegin
CREATE FUNCTION pgfence.require_primary() RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'pgfence: the server is in recovery (a standby); leases, tokens and fences are decided by the primary only'
            USING ERRCODE = 'PF005',
                  HINT = 'Connect to the current primary (target_session_attrs=read-write).';
    END IF;
END;
$$;
-- +goose StatementEnd

-- max_token is the largest token any function accepts or issues: the floor's
-- maximum (see floor_leaves_room) plus room for 2^61 grants above it. A token
-- above it was never issued; accepting it would fence a resource beyond reach.
-- +goose StatementBegin
CREATE FUNCTION pgfence.max_token() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 6917529027641081856::bigint $$;
-- +goose StatementEnd

-- check_token raises PF008 unless token is a token some grant could have
-- issued: 1 to max_token().
-- +goose StatementBegin
CREATE FUNCTION pgfence.check_token(p_token bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_token IS NULL OR p_token <= 0 OR p_token > 6917529027641081856 THEN
        RAISE EXCEPTION 'pgfence: token must be 1 to 6917529027641081856, got %', coalesce(p_token::text, 'NULL')
            USING ERRCODE = 'PF008';
    END IF;
END;
$$;
-- +goose StatementEnd

-- Abandoned requests. When the reply to a grant or a fenced write is lost,
-- its client cannot tell whether it happened, and the request itself may
-- still be on its way (held in the network, queued in a pooler, waiting for a
-- row lock). The client settles it in two steps, each in its own transaction:
-- abandon_grant(key, holder) or abandon_fence(resource, op) commits a row
-- here, and then grant_probe or fence_probe waits for any transaction still
-- holding the row and reads what committed. A grant and a fence check this
-- table after they hold their row lock, in a statement that starts after the
-- lock is theirs: a request that arrives after the abandonment committed is
-- refused (PF013), and one that got there first is waited for by the probe.
-- So "not applied" is final. The id is the grant's holder id or the write's
-- operation id, both drawn fresh per request, and it is abandoned for the
-- key or resource it was sent for only: a role that abandons an id it
-- learned of another role's request, naming a key of its own, refuses
-- nothing but requests for its own key. Rows are kept for 7 days (a request
-- cannot be in flight for longer); each abandon call prunes older ones.
-- +goose StatementBegin
CREATE TABLE pgfence.abandoned_requests (
    id           uuid        NOT NULL,
    kind         text        NOT NULL CHECK (kind IN ('grant', 'fence')),
    name         text        NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 512),
    abandoned_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    abandoned_by name        NOT NULL DEFAULT session_user,
    PRIMARY KEY (id, kind, name)
);
-- +goose StatementEnd

-- abandon_request records the abandonment of request id (see above) and
-- prunes rows older than 7 days. It returns false when id was abandoned
-- before. The grant and fence wrappers check their arguments first.
-- +goose StatementBegin
CREATE FUNCTION pgfence.abandon_request(p_kind text, p_name text, p_id uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_new integer;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_id IS NULL THEN
        RAISE EXCEPTION 'pgfence: the request id to abandon must not be NULL' USING ERRCODE = 'PF008';
    END IF;
    -- The probe that follows must see this row whatever the session's
    -- default: a request refused only until a crash would not be refused.
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    DELETE FROM pgfence.abandoned_requests a WHERE a.abandoned_at < clock_timestamp() - interval '7 days';
    INSERT INTO pgfence.abandoned_requests (id, kind, name) VALUES (p_id, p_kind, p_name)
        ON CONFLICT (id, kind, name) DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    RETURN v_new > 0;
END;
$$;
-- +goose StatementEnd

-- raise_if_abandoned raises PF013 when request id was abandoned for the
-- key or resource p_name. Grants and fences call it after they hold their
-- row lock.
-- +goose StatementBegin
CREATE FUNCTION pgfence.raise_if_abandoned(p_kind text, p_name text, p_id uuid) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a pgfence.abandoned_requests%ROWTYPE;
BEGIN
    SELECT r.* INTO a FROM pgfence.abandoned_requests r
     WHERE r.id = p_id AND r.kind = p_kind AND r.name = p_name COLLATE pg_catalog."default";
    IF FOUND THEN
        RAISE EXCEPTION 'pgfence: % % of % was abandoned by its client at % and is refused', p_kind, p_id, quote_literal(p_name), a.abandoned_at
            USING ERRCODE = 'PF013',
                  DETAIL = format('id=%s abandoned_at=%s', p_id, a.abandoned_at),
                  HINT = 'Its client lost the reply and was told it did not happen; it arrived late.';
    END IF;
END;
$$;
-- +goose StatementEnd

-- token_epoch returns the timeline id of the server's WAL insert position. The
-- timeline increases on every standby promotion, so it is the high part of every
-- token (see next_token). It refuses to answer on a standby: tokens are issued by
-- a primary only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.token_epoch() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF pg_catalog.pg_is_in_recovery() THEN
        PERFORM pgfence.require_primary();
    END IF;
    RETURN ('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
END;
$$;
-- +goose StatementEnd

-- next_token returns the token that follows previous (NULL for a resource that
-- never had one). A token is (timeline << 40) | counter, and above the floor
-- and the retention floor: it strictly increases per resource, survives crashes (the caller stores
-- it in the granting transaction, so a token that was not committed was never
-- returned) and failovers (a promoted standby runs on a higher timeline, so it
-- cannot reissue a number the old primary acknowledged but did not replicate).
--
-- It is plpgsql, not SQL: a LANGUAGE sql function that cannot be inlined (a
-- subquery in its body) is parsed and planned again for every statement that
-- calls it (PostgreSQL 15 caches its plan for one outer statement only), ~60 µs
-- per grant measured with pg_stat_statements; plpgsql caches its plans per
-- session.
-- +goose StatementBegin
CREATE FUNCTION pgfence.next_token(previous bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_floor bigint;
    v_next  bigint;
BEGIN
    SELECT greatest(f.floor, f.retention) INTO v_floor FROM pgfence.token_floor f;
    v_next := greatest(coalesce(previous, 0) + 1, (pgfence.token_epoch() << 40) + 1, v_floor + 1);
    IF v_next > pgfence.max_token() THEN
        RAISE EXCEPTION 'pgfence: the next token % would exceed the largest token %', v_next, pgfence.max_token()
            USING ERRCODE = 'PF008';
    END IF;
    RETURN v_next;
END;
$$;
-- +goose StatementEnd

-- Prefix grants: which lease keys, fenced resources and idempotency scopes a
-- role may use. Services that share a database are kept apart by name: an
-- operator grants each service's role its prefixes,
--
--   SELECT pgfence.grant_prefix('orders_service', 'orders/');
--
-- and every function of the protocol refuses a name outside the caller's
-- prefixes (PF014), for keys, resources and scopes alike. The rows of the
-- pgfence tables are visible to pgfence_app members within their prefixes
-- only (row-level security). The caller is the role in effect (see
-- acting_role), with the roles whose privileges it has (pg_has_role USAGE:
-- a NOINHERIT role has only its own grants until it SETs ROLE to a role it
-- is a member of); the schema's owner and superusers may use every name. A
-- role with no grant may use nothing: to keep one service's old behaviour,
-- grant it the empty prefix, which covers every name:
-- SELECT pgfence.grant_prefix('pgfence_app', '').
-- +goose StatementBegin
CREATE TABLE pgfence.prefix_grants (
    grantee    regrole     NOT NULL,
    prefix     text        NOT NULL CHECK (octet_length(prefix) <= 512),
    granted_by name        NOT NULL DEFAULT session_user,
    granted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (grantee, prefix)
);
-- +goose StatementEnd

-- acting_role is the role a caller of pgfence acts as: the role its session
-- set with SET ROLE or SET LOCAL ROLE (a gateway or a pooler that switches
-- roles, PostgREST), else the role that logged in (session_user). Inside
-- pgfence's SECURITY DEFINER functions current_user is their owner; the
-- role setting still shows the session's SET ROLE ('none' when unset or
-- after RESET ROLE). A SECURITY DEFINER function of the application that
-- calls pgfence acts as the session's role, not as its own owner: grant
-- that role the names. A role renamed or dropped while a session has SET
-- ROLE to it matches no role: the grant check raises instead of passing.
-- It is one expression, inlined where it is called.
-- +goose StatementBegin
CREATE FUNCTION pgfence.acting_role() RETURNS name
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT CASE WHEN pg_catalog.current_setting('role') OPERATOR(pg_catalog.=) 'none' THEN SESSION_USER
                ELSE pg_catalog.current_setting('role')::pg_catalog.name END;
END;
-- +goose StatementEnd

-- may_use reports whether the role in effect may use p_name (a lease key, a
-- fenced resource or an idempotency scope).
-- +goose StatementBegin
CREATE FUNCTION pgfence.may_use(p_name text) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_role name := pgfence.acting_role();
BEGIN
    -- current_user is this function's owner, the schema's owner: it (and
    -- so a superuser) may use every name.
    IF pg_has_role(v_role, current_user, 'USAGE') THEN
        RETURN true;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pgfence.prefix_grants g
                    WHERE starts_with(p_name COLLATE pg_catalog."default", g.prefix) AND pg_has_role(v_role, g.grantee, 'USAGE'));
END;
$$;
-- +goose StatementEnd

-- may_use_under reports whether the role in effect may use some name that
-- starts with p_prefix: a grant of it starts with p_prefix, or p_prefix
-- starts with a grant of it. The rows of the kill switches (grant_pauses,
-- grant_pause_events) are visible to pgfence_app members by it: a pause of
-- 'orders/' to the roles that may use a name under 'orders/', a pause of ''
-- to every role with a grant.
-- +goose StatementBegin
CREATE FUNCTION pgfence.may_use_under(p_prefix text) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_role name := pgfence.acting_role();
BEGIN
    IF pg_has_role(v_role, current_user, 'USAGE') THEN
        RETURN true;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pgfence.prefix_grants g
                    WHERE (starts_with(p_prefix COLLATE pg_catalog."default", g.prefix) OR starts_with(g.prefix, p_prefix COLLATE pg_catalog."default"))
                      AND pg_has_role(v_role, g.grantee, 'USAGE'));
END;
$$;
-- +goose StatementEnd

-- require_granted raises PF014 unless the role in effect may use p_name;
-- p_what names the kind of name in the message.
--
-- The calls every client makes (grant, renew, release, fence, check_lease,
-- the idempotency claims) test the cheap condition of each check inline and
-- call the helper (require_primary, require_granted, check_token,
-- raise_if_abandoned, the argument checks) only when it is about to refuse:
-- a PL/pgSQL call with a pinned search_path costs microseconds before it does
-- anything, and the helpers stay the one place of each message, code and
-- hint. Their grant check starts with
-- pg_has_role(pgfence.acting_role(), current_user, 'USAGE'): inside those
-- SECURITY DEFINER functions current_user is the function's owner, the role
-- the migrations ran as, which owns the schema and may use every name. A
-- role with its privileges could replace the function itself, so passing
-- it without reading prefix_grants grants nothing new; any other role goes
-- through require_granted.
-- +goose StatementBegin
CREATE FUNCTION pgfence.require_granted(p_what text, p_name text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- A missing name is the argument checks' to refuse (PF008).
    IF p_name IS NOT NULL AND NOT pgfence.may_use(p_name) THEN
        RAISE EXCEPTION 'pgfence: role % may not use % %: no prefix of it is granted to the role', pgfence.acting_role(), p_what, quote_literal(p_name)
            USING ERRCODE = 'PF014',
                  DETAIL = format('role=%s name=%s', pgfence.acting_role(), p_name),
                  HINT = 'An operator grants a role the prefixes it may use: SELECT pgfence.grant_prefix(role, prefix).';
    END IF;
END;
$$;
-- +goose StatementEnd

-- grant_prefix lets p_role (and its members) use every name that starts with
-- p_prefix ('' is every name). It returns false when the grant existed.
-- A prefix that starts another role's, or that another role's starts
-- ('stock' and 'stock:'), shares names with it: both roles may use the
-- names that start with the longer one. It is granted, with a WARNING
-- naming each such grant (`pgfence doctor` lists them too): a service that
-- holds a sub-prefix of another's on purpose is a legitimate design.
-- Operator only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.grant_prefix(p_role regrole, p_prefix text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_new integer;
    o     record;
BEGIN
    PERFORM pgfence.require_primary();
    IF p_role IS NULL OR p_prefix IS NULL OR octet_length(p_prefix) > 512 THEN
        RAISE EXCEPTION 'pgfence: grant_prefix needs a role and a prefix of at most 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    INSERT INTO pgfence.prefix_grants (grantee, prefix) VALUES (p_role, p_prefix) ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    FOR o IN SELECT g.grantee, g.prefix FROM pgfence.prefix_grants g
              WHERE g.grantee <> p_role
                AND (starts_with(g.prefix, p_prefix COLLATE pg_catalog."default") OR starts_with(p_prefix COLLATE pg_catalog."default", g.prefix))
              ORDER BY g.grantee::text, g.prefix LOOP
        RAISE WARNING 'pgfence: prefix % of role % overlaps prefix % of role %: both roles may use the names that start with %',
                quote_literal(p_prefix), p_role, quote_literal(o.prefix), o.grantee,
                quote_literal(CASE WHEN octet_length(o.prefix) > octet_length(p_prefix) THEN o.prefix ELSE p_prefix END)
            USING DETAIL = format('role=%s prefix=%s overlapping_role=%s overlapping_prefix=%s', p_role, p_prefix, o.grantee, o.prefix),
                  HINT = 'If the names are not meant to be shared, revoke the grant (pgfence.revoke_prefix) and grant prefixes that end with a separator and do not start one another (''stock:'', ''orders:'').';
    END LOOP;
    RETURN v_new > 0;
END;
$$;
-- +goose StatementEnd

-- revoke_prefix removes a grant_prefix; it returns whether there was one.
-- Leases and fences already granted stay as they are: their holders keep
-- them until they end, but cannot renew, release or write under them.
-- Operator only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.revoke_prefix(p_role regrole, p_prefix text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgfence.require_primary();
    IF p_role IS NULL OR p_prefix IS NULL OR octet_length(p_prefix) > 512 THEN
        RAISE EXCEPTION 'pgfence: revoke_prefix needs a role and a prefix of at most 512 bytes' USING ERRCODE = 'PF008';
    END IF;
    DELETE FROM pgfence.prefix_grants g WHERE g.grantee = p_role AND g.prefix = p_prefix COLLATE pg_catalog."default";
    RETURN FOUND;
END;
$$;
-- +goose StatementEnd

-- raise_token_floor makes every token issued from now on greater than
-- new_floor, and retires every token at or below it: fence() refuses them
-- (PF001), so holders of leases granted before must acquire again before
-- they write, and prune_retired may delete the rows of keys whose tokens are
-- all retired. It refuses to lower the floor (PF009); raising it to its
-- current value is a no-op. It returns the floor before.
-- +goose StatementBegin
CREATE FUNCTION pgfence.raise_token_floor(new_floor bigint, reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    old_floor bigint;
BEGIN
    PERFORM pgfence.require_primary();
    IF new_floor IS NULL OR new_floor < 0 OR new_floor > 4611686018427387904 THEN
        RAISE EXCEPTION 'pgfence: new_floor must be 0 to 4611686018427387904 (2^62), got %', coalesce(new_floor::text, 'NULL')
            USING ERRCODE = 'PF008';
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

-- Trace ids. The trace id of the request that caused a lease event, the last
-- accepted fenced write, a rejected fenced write or an idempotency claim is
-- stored beside it (the trace_id columns of pgfence.lease_events,
-- pgfence.fences, pgfence.fence_rejections and pgfence.idempotency_keys), so
-- that one query joins a lock grant to the business write it protected:
--
--   SELECT e.key, e.event, e.token AS lease_token, e.at, f.resource, f.token AS fence_token, f.accepted_at
--     FROM pgfence.lease_events e JOIN pgfence.fences f USING (trace_id)
--    WHERE e.trace_id = '4bf92f3577b34da6a3ce929d0e0e4736';
--
-- A client names its trace for the current transaction only:
--
--   SELECT set_config('pgfence.trace_id', '4bf92f3577b34da6a3ce929d0e0e4736', true);
--
-- (the Go packages do it in the same pipeline as the statement when the
-- context carries a valid OpenTelemetry span context: no extra round trip).
-- Anything but 32 lowercase hex digits is ignored (stored as NULL): a bad
-- setting never makes a grant or a write fail.
--
-- current_trace_id returns the setting if well-formed, else NULL. It is one
-- expression without a FROM clause, so the planner inlines it into the column
-- defaults that call it; a FROM clause cost ~25 µs per lease event and per
-- new fence row, planned again for every statement.
-- +goose StatementBegin
CREATE FUNCTION pgfence.current_trace_id() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN current_setting('pgfence.trace_id', true) ~ '^[0-9a-f]{32}$'
                 AND current_setting('pgfence.trace_id', true) <> '00000000000000000000000000000000'
                THEN current_setting('pgfence.trace_id', true) END
$$;
-- +goose StatementEnd

-- Nothing for PUBLIC (functions are created executable by everyone), then
-- each role gets exactly its list.
REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgfence FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;

GRANT SELECT ON pgfence.token_floor TO pgfence_app, pgfence_operator;

GRANT SELECT ON pgfence.abandoned_requests, pgfence.prefix_grants TO pgfence_operator;

GRANT EXECUTE ON FUNCTION
    pgfence.current_trace_id(),
    pgfence.max_token(),
    pgfence.may_use(text),
    pgfence.may_use_under(text)
  TO pgfence_app, pgfence_operator;

-- Operations: the operator role only.
GRANT EXECUTE ON FUNCTION
    pgfence.raise_token_floor(bigint, text),
    pgfence.grant_prefix(regrole, text),
    pgfence.revoke_prefix(regrole, text),
    pgfence.next_token(bigint),
    pgfence.token_epoch()
  TO pgfence_operator;

-- +goose Down
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
-- The schema itself stays: goose's version table lives in it. So do the
-- roles (see above).
DROP FUNCTION pgfence.revoke_prefix(regrole, text);
DROP FUNCTION pgfence.grant_prefix(regrole, text);
DROP FUNCTION pgfence.require_granted(text, text);
DROP FUNCTION pgfence.may_use_under(text);
DROP FUNCTION pgfence.may_use(text);
DROP FUNCTION pgfence.acting_role();
DROP TABLE pgfence.prefix_grants;
DROP FUNCTION pgfence.raise_if_abandoned(text, text, uuid);
DROP FUNCTION pgfence.abandon_request(text, text, uuid);
DROP TABLE pgfence.abandoned_requests;
DROP FUNCTION pgfence.check_token(bigint);
DROP FUNCTION pgfence.max_token();
DROP FUNCTION pgfence.require_primary();
DROP FUNCTION pgfence.current_trace_id();
DROP FUNCTION pgfence.raise_token_floor(bigint, text);
DROP FUNCTION pgfence.next_token(bigint);
DROP FUNCTION pgfence.token_epoch();
DROP TABLE pgfence.token_floor;
DROP DOMAIN pgfence.write_count;
DROP DOMAIN pgfence.token_value;
DROP DOMAIN pgfence.key_name;

-- +goose StatementBegin
DO $$
BEGIN
    IF pg_catalog.to_regclass('pgfence.goose_db_version') IS NOT NULL THEN
        REVOKE SELECT ON pgfence.goose_db_version FROM pgfence_operator;
    END IF;
END;
$$;
-- +goose StatementEnd

REVOKE USAGE ON SCHEMA pgfence FROM pgfence_app, pgfence_operator;
