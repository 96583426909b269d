-- pgfence base schema: the token source and the lease rows.
--
-- Every pgfence object lives in the schema "pgfence". The Go migrator creates
-- the schema before goose runs (its version table, pgfence.goose_db_version,
-- lives there too); the CREATE SCHEMA below is for teams that apply these files
-- with another migration tool.
--
-- SQLSTATEs raised by pgfence (class PF, never ending in 000):
--   PF001 stale token: a fenced write presented a token older than the one accepted
--   PF002 lease not held: a lease-checked write or renewal by a holder that lost its lease
--   PF003 lease held by another holder
--   PF004 idempotency key reused with a different request payload
--   PF005 not a primary: tokens are never issued while the server is in recovery
--   PF006 unfenced write: a write to a protected table without a current token
--   PF007 idempotency key in progress
--   PF008 invalid argument
--   PF009 token floor may only be raised

-- +goose Up
-- +goose StatementBegin
CREATE SCHEMA IF NOT EXISTS pgfence;
-- +goose StatementEnd

-- The token floor: tokens issued from now on are strictly greater than this
-- value. An operator raises it after restoring or rebuilding the schema so that
-- tokens never restart below tokens already stored in business tables.
-- +goose StatementBegin
CREATE TABLE pgfence.token_floor (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    floor      bigint      NOT NULL DEFAULT 0 CHECK (floor >= 0),
    raised_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    reason     text        NOT NULL DEFAULT 'initial' CHECK (length(reason) BETWEEN 1 AND 1000)
);
-- +goose StatementEnd

-- +goose StatementBegin
INSERT INTO pgfence.token_floor DEFAULT VALUES;
-- +goose StatementEnd

-- token_epoch returns the timeline id of the server's WAL insert position. The
-- timeline increases on every standby promotion, so it is the high part of every
-- token (see next_token). It refuses to answer on a standby: tokens are issued by
-- a primary only.
-- +goose StatementBegin
CREATE FUNCTION pgfence.token_epoch() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'pgfence: the server is in recovery; tokens are issued only by a primary'
            USING ERRCODE = 'PF005',
                  HINT = 'Connect to the current primary (target_session_attrs=read-write).';
    END IF;
    RETURN ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
END;
$$;
-- +goose StatementEnd

-- next_token returns the token that follows previous (NULL for a resource that
-- never had one). A token is (timeline << 40) | counter, and never below the
-- floor: it strictly increases per resource, survives crashes (the caller stores
-- it in the granting transaction, so a token that was not committed was never
-- returned) and failovers (a promoted standby runs on a higher timeline, so it
-- cannot reissue a number the old primary acknowledged but did not replicate).
-- +goose StatementBegin
CREATE FUNCTION pgfence.next_token(previous bigint) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT greatest(coalesce(previous, 0) + 1,
                    (pgfence.token_epoch() << 40) + 1,
                    (SELECT f.floor FROM pgfence.token_floor f) + 1);
$$;
-- +goose StatementEnd

-- Lease rows. A row is created by the first grant for a key and is never deleted
-- while tokens matter: "token" is the last token issued for the key and the next
-- grant draws next_token(token) in the same statement that stores it.
--
-- A lease is live iff released_at IS NULL AND expires_at > clock_timestamp().
-- Only the database clock decides; holder is the random id of the current (or
-- last) grant and must be presented to renew or release it.
-- +goose StatementBegin
CREATE TABLE pgfence.leases (
    key          text        PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 512),
    holder       uuid        NOT NULL,
    token        bigint      NOT NULL CHECK (token > 0),
    granted_at   timestamptz NOT NULL,
    renewed_at   timestamptz,
    expires_at   timestamptz NOT NULL,
    released_at  timestamptz,
    holder_info  text        NOT NULL DEFAULT '' CHECK (octet_length(holder_info) <= 1024),
    CHECK (expires_at >= granted_at),
    CHECK (renewed_at IS NULL OR renewed_at >= granted_at),
    CHECK (released_at IS NULL OR released_at >= granted_at)
);
-- +goose StatementEnd

-- Grant history: one row per transition, bounded by pruning (see the leases
-- package). It outlives the lease rows on purpose.
-- +goose StatementBegin
CREATE TABLE pgfence.lease_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key         text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 512),
    event       text        NOT NULL CHECK (event IN ('acquired', 'taken_over', 'released', 'force_released', 'expired')),
    holder      uuid        NOT NULL,
    token       bigint      NOT NULL CHECK (token > 0),
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    reason      text        CHECK (reason IS NULL OR length(reason) BETWEEN 1 AND 1000)
);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE INDEX lease_events_key_id ON pgfence.lease_events (key, id);
-- +goose StatementEnd

-- +goose Down
-- The schema itself stays: goose's version table lives in it.
-- +goose StatementBegin
DROP TABLE pgfence.lease_events;
-- +goose StatementEnd
-- +goose StatementBegin
DROP TABLE pgfence.leases;
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.next_token(bigint);
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgfence.token_epoch();
-- +goose StatementEnd
-- +goose StatementBegin
DROP TABLE pgfence.token_floor;
-- +goose StatementEnd
