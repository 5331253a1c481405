-- Schema version 3 (leasequeue 0.3) -> 4 (0.4): quarantine (bury, skip, peek).
--
-- Run by leasequeue._sqlite on open, statement by statement, in the one
-- transaction that also sets PRAGMA user_version and lq_state.version to 4;
-- a failure rolls all of it back and leaves the file at version 3.
--
-- A buried group is lq_groups.lock = 3 (its head stays, no lock end), so
-- nothing already stored changes meaning: every version-3 row is a valid
-- version-4 row, and the indexes and triggers stay as they are.  The new
-- column goes last, as in schema.sql.

-- The count of buried groups (stats().buried): none yet.
CREATE TABLE lq_quarantine (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    buried  INTEGER NOT NULL
);
INSERT INTO lq_quarantine (id, buried) VALUES (1, 0);

-- The bury reason while buried, else NULL.
ALTER TABLE lq_groups ADD COLUMN reason TEXT;
