-- Schema version 1 (leasequeue 0.3) -> 2 (0.4): quarantine (bury, skip, peek).
--
-- Run by PostgresTransport.install() in its one transaction, before
-- schema.sql (which then creates bury and skip and re-creates every other
-- function): a failure rolls all of it back and leaves version 1 as it was.
--
-- A buried group is lock_state 3 (its head stays, no lock end), so nothing
-- already stored changes meaning: every version-1 row is a valid version-2
-- row, and the indexes stay as they are.

-- The bury reason while buried, else NULL (last, as in schema.sql).
ALTER TABLE leasequeue.groups ADD COLUMN IF NOT EXISTS reason text;

-- Their results gain a column (stats: buried; group_info: reason), which
-- CREATE OR REPLACE cannot change: schema.sql creates them anew.
DROP FUNCTION IF EXISTS leasequeue.stats(int, double precision);
DROP FUNCTION IF EXISTS leasequeue.group_info(int, text, double precision);

UPDATE leasequeue.meta SET value = '2' WHERE key = 'schema_version';
