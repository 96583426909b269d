-- pgfence announcements: a renewal announced on pgfence_lease_changed carries
-- a tag only the database and the roles granted the key can compute, so that
-- a watcher may trust it without reading the lease.
--
--   pgfence.announce_renewal(key, holder, token) -> boolean   NOTIFY the grant's expiry, signed
--   pgfence.announce_key(key) -> bytea                        the key's tag key, for watchers
--
-- Why. Watchers of a lease (followers of an election) sleep until the holder's
-- expiry and read the lease then. A holder that renews announces the new expiry,
-- so watchers move their timer instead of reading at every renewal. Any role
-- that can connect may NOTIFY any channel: an unsigned "renewed" could keep
-- every watcher asleep past a dead holder's expiry, so watchers had to read
-- again at a poll interval whatever they heard, and N idle watchers cost N
-- reads per interval. A signed announcement is believed; a forged or altered
-- one is ignored, and a replayed one cannot move an expiry later than the
-- newest genuine one.
--
-- The tag. One 32-byte secret per database (pgfence.announce_secret, readable
-- by no role but the schema's owner; it replicates, so it survives a
-- failover). The key's tag key is
--     k = sha256(secret || sha256(key))
-- and the announcement of a grant whose expiry is E (microseconds since the
-- Unix epoch, by the database clock) is
--     'renewed:' || remaining µs || ':' || token || ':' || E || ':' || hex(tag) || ':' || key
-- (the key last: it may hold colons), where
--     tag = sha256(k || sha256(token || ':' || E || ':' || key))     (text as UTF-8)
-- Both hashes take fixed-length input after the secret, so no tag extends to
-- another message. announce_key hands k to a role granted the key (such a role
-- could hold the lease itself); announce_renewal signs only what the lease row
-- says, so no caller can make the database sign an expiry it did not grant.

-- +goose Up
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- +goose StatementBegin
CREATE TABLE pgfence.announce_secret (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret   bytea NOT NULL CHECK (octet_length(secret) = 32)
);
-- +goose StatementEnd

-- gen_random_uuid draws 122 random bits from the server's strong random
-- source; three of them make the secret.
INSERT INTO pgfence.announce_secret (secret)
VALUES (sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')));

-- +goose StatementBegin
CREATE FUNCTION pgfence.announce_key(p_key text) RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgfence.require_primary();
    PERFORM pgfence.lease_check_args(p_key, NULL, NULL);
    PERFORM pgfence.require_granted('lease', p_key);
    RETURN sha256((SELECT s.secret FROM pgfence.announce_secret s) || sha256(convert_to(p_key, 'UTF8')));
END;
$$;
-- +goose StatementEnd

-- announce_renewal sends the signed announcement of the grant (holder, token)
-- of key when it is live by the database clock, and returns whether it did. It
-- sends nothing for a grant that ended: watchers read the lease at its expiry.
-- Called in the same statement as the renewal, the announcement leaves only if
-- the renewal commits (NOTIFY is sent at commit).
-- +goose StatementBegin
CREATE FUNCTION pgfence.announce_renewal(p_key text, p_holder uuid, p_token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_expires timestamptz;
    v_now     timestamptz;
    v_micros  text;
    v_msg     text;
    v_key     bytea;
    v_tag     bytea;
BEGIN
    -- announce_key checks the server, the key and the grant first.
    v_key := pgfence.announce_key(p_key);
    SELECT l.expires_at INTO v_expires FROM pgfence.leases l
     WHERE l.key = p_key COLLATE pg_catalog."default" AND l.holder = p_holder AND l.token = p_token AND l.released_at IS NULL;
    v_now := clock_timestamp();
    IF v_expires IS NULL OR v_expires <= v_now THEN
        RETURN false;
    END IF;
    v_micros := ((extract(epoch FROM v_expires) * 1000000)::bigint)::text;
    v_msg := p_token::text || ':' || v_micros || ':' || p_key;
    v_tag := sha256(v_key || sha256(convert_to(v_msg, 'UTF8')));
    -- 'renewed:<remaining µs>:<token>:<expiry µs>:<tag>:<key>': the key last,
    -- since it may hold colons.
    PERFORM pg_notify('pgfence_lease_changed',
        'renewed:' || ((extract(epoch FROM v_expires - v_now) * 1000000)::bigint)::text || ':'
        || p_token::text || ':' || v_micros || ':' || encode(v_tag, 'hex') || ':' || p_key);
    RETURN true;
END;
$$;
-- +goose StatementEnd

REVOKE ALL ON pgfence.announce_secret FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgfence.announce_key(text), pgfence.announce_renewal(text, uuid, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.announce_key(text), pgfence.announce_renewal(text, uuid, bigint)
  TO pgfence_app, pgfence_operator;

-- +goose Down
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
DROP FUNCTION pgfence.announce_renewal(text, uuid, bigint);
DROP FUNCTION pgfence.announce_key(text);
DROP TABLE pgfence.announce_secret;
