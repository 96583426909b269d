-- The token floor leaves tokens room to grow.
--
-- A token is (timeline << 40) | counter and never below floor + 1. A floor
-- near the end of the bigint range (a typo, or a script that took the wrong
-- column) makes every later grant fail with "bigint out of range", and since
-- the floor is never lowered (raise_token_floor refuses, PF009), there was
-- no way back. 2^62 is far above any token a real cluster issues and leaves
-- 2^62 more. The Go API (pgfence.MaxTokenFloor) and the CLI refuse the same
-- before they send anything; this constraint closes the other doors
-- (psql, an UPDATE by the owner).
--
-- NOT VALID: a database whose floor is already above the limit keeps working
-- as well as it did; only a new floor value is checked.

-- +goose Up
-- +goose StatementBegin
ALTER TABLE pgfence.token_floor
    ADD CONSTRAINT floor_leaves_room CHECK (floor <= 4611686018427387904) NOT VALID;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
ALTER TABLE pgfence.token_floor DROP CONSTRAINT floor_leaves_room;
-- +goose StatementEnd
