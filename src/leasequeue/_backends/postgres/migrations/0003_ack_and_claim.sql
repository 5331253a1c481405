-- Schema version 2 (leasequeue 0.4) -> 3 (0.5): ack_and_claim.
--
-- Run by PostgresTransport.install() in its one transaction, before
-- schema.sql (which then creates leasequeue.ack_and_claim and re-creates
-- every other function): a failure rolls all of it back and leaves version
-- 2 as it was.
--
-- No table or index changes: every version-2 row is a valid version-3 row.
-- The version still moves, so that a 0.5 transport refuses a database whose
-- functions lack ack_and_claim ("run install()") instead of failing on its
-- first call.

UPDATE leasequeue.meta SET value = '3' WHERE key = 'schema_version';
