-- Schema version 3 (leasequeue 0.5) -> 4 (0.6): later, once, honest attempts
-- (the contract, docs/contract.md, Part 5: delayed publish, idempotency
-- keys, release, retry, fencing by delivery).
--
-- Run by PostgresTransport.install() in its one transaction, before
-- schema.sql (which then creates the keys table, the new indexes and the
-- new functions, and re-creates every other function): a failure rolls all
-- of it back and leaves version 3 as it was.
--
-- Nothing already stored changes meaning: a version-3 message has no due
-- time and no key (both NULL), no group is scheduled (lock_state 4 is new),
-- and an open delivery's number is its group's rr_key already (every claim
-- set it from leasequeue.claims), so a lease issued before the upgrade,
-- rebuilt from its fields, is still matched by them.

-- The due time of a publish with a delay, and the key (last, as in schema.sql).
ALTER TABLE leasequeue.messages ADD COLUMN IF NOT EXISTS due_at double precision;
ALTER TABLE leasequeue.messages ADD COLUMN IF NOT EXISTS key text;

-- Their arguments gain the delivery's number (and nack the release flag),
-- or their results a column (claim and ack_and_claim: the delivery; stats:
-- scheduled; group_info: due_at), which CREATE OR REPLACE cannot change:
-- schema.sql creates them anew.
DROP FUNCTION IF EXISTS leasequeue.ack_and_claim(int, text, bigint, bigint, text, text, double precision, bigint,
                                                 double precision);
DROP FUNCTION IF EXISTS leasequeue.claim(int, text, double precision, bigint, double precision, int, boolean, bigint);
DROP FUNCTION IF EXISTS leasequeue.unclaim(int, text, bigint, bigint, text, bigint, double precision, boolean, text);
DROP FUNCTION IF EXISTS leasequeue.current(int, text, bigint, bigint, text);
DROP FUNCTION IF EXISTS leasequeue.ack(int, text, bigint, bigint, text);
DROP FUNCTION IF EXISTS leasequeue.ack_many(int, text[], bigint[], bigint[], text[]);
DROP FUNCTION IF EXISTS leasequeue.nack(int, text, bigint, bigint, text, double precision, double precision);
DROP FUNCTION IF EXISTS leasequeue.extend(int, text, bigint, bigint, text, double precision, double precision);
DROP FUNCTION IF EXISTS leasequeue.bury(int, text, bigint, bigint, text, text);
DROP FUNCTION IF EXISTS leasequeue.stats(int, double precision);
DROP FUNCTION IF EXISTS leasequeue.group_info(int, text, double precision);

UPDATE leasequeue.meta SET value = '4' WHERE key = 'schema_version';
