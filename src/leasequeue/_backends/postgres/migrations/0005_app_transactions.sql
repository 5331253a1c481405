-- Schema version 4 (leasequeue 0.6) -> 5 (0.7): operations in the
-- application's transaction (conn=; docs/transactions.md).
--
-- Run by PostgresTransport.install() in its one transaction, before
-- schema.sql, which adds leasequeue.app_tx (the mark of an application's
-- transaction) and re-creates announce and ack, which notify without the
-- queue's shared listen lock in such a transaction.  No table changes:
-- nothing stored changes meaning.

UPDATE leasequeue.meta SET value = '5' WHERE key = 'schema_version';
