-- Schema version 4 (leasequeue 0.4 and 0.5) -> 5 (0.6): later and once
-- (SPEC Part 5: delayed publish, idempotency keys; release and retry need
-- no new column).
--
-- Run by leasequeue._backends.sqlite.transport on open, statement by statement, in the one
-- transaction that also sets PRAGMA user_version and lq_state.version to 5;
-- a failure rolls all of it back and leaves the file at version 4.
--
-- A scheduled head is lq_groups.lock = 4 with its due time in expires_at, so
-- nothing already stored changes meaning: every version-4 row is a valid
-- version-5 row (no message of a version-4 file has a delay or a key), and
-- the indexes and triggers of version 4 stay as they are.  The new columns go
-- last, as in schema.sql.

ALTER TABLE lq_messages ADD COLUMN due_at REAL;
ALTER TABLE lq_messages ADD COLUMN key TEXT;

CREATE TABLE lq_keys (
    group_id   TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    held_until REAL    NOT NULL,
    check_at   REAL    NOT NULL,
    PRIMARY KEY (group_id, key)
) WITHOUT ROWID;
CREATE INDEX lq_keys_check_at ON lq_keys (check_at);

CREATE TABLE lq_due (
    seq    INTEGER PRIMARY KEY,
    due_at REAL    NOT NULL
);
CREATE INDEX lq_due_at ON lq_due (due_at);
