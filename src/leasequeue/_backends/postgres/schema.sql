-- leasequeue schema for PostgreSQL, version 5.
--
-- Idempotent: PostgresTransport.install(conninfo) runs this whole file in one
-- transaction (under an advisory lock, so concurrent installs do not race).
-- This file is the latest schema: the tables as CREATE ... IF NOT EXISTS (a
-- new database gets them whole), every function as CREATE OR REPLACE.  A
-- database of an older version is first brought up to this one, in the same
-- transaction, by the numbered files of migrations/ (NNNN_name.sql upgrades
-- version NNNN - 1 to NNNN): they hold the table and index changes, and drop
-- the functions whose argument or result types change; this file then
-- (re)creates every function.
-- Every object lives in the schema "leasequeue"; several named queues share
-- the tables, each row carrying its queue's id.
--
-- The model is the in-memory transport's (see _backends/inmemory/transport_py.py):
-- only a group's head (oldest) message can be leased, parked or scheduled, so
-- the lock state, the attempt count and the round-robin key live on the
-- group's row.  A
-- group row exists while the group holds messages, or while it is paused.
--
-- Concurrency (READ COMMITTED, every function one transaction):
--   * claim locks group rows with FOR UPDATE SKIP LOCKED and never waits;
--   * every other write to one group first takes the transaction advisory
--     lock (queue, hashtext(group_id)), then, if it needs it, the group row:
--     publishers to one group are serialised (so seq order is commit order
--     inside a group), and an ack that empties a group cannot race a publish
--     into it.  Nothing waits for an advisory lock while holding a row lock,
--     so these locks cannot deadlock.

CREATE SCHEMA IF NOT EXISTS leasequeue;

CREATE TABLE IF NOT EXISTS leasequeue.meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE IF NOT EXISTS leasequeue.queues (
    id      serial PRIMARY KEY,
    name    text NOT NULL UNIQUE,
    seq_oid oid NOT NULL,                                 -- this queue's message sequence
    latest  double precision NOT NULL DEFAULT '-Infinity' -- injected-clock mode: latest time used
);

-- Round-robin key of claimed groups: the claim order.  One sequence for all
-- queues (gaps do not change the order).  A claim's number also names its
-- delivery (version 4, "fencing by delivery"): while a group's delivery is
-- open, its rr_key is that delivery's number, and an issued lease carries it.
CREATE SEQUENCE IF NOT EXISTS leasequeue.claims;

-- Creation order of groups (groups() lists them in it, decisions.md).
CREATE SEQUENCE IF NOT EXISTS leasequeue.created;

CREATE TABLE IF NOT EXISTS leasequeue.groups (
    queue           int NOT NULL,
    group_id        text NOT NULL,
    priority        bigint NOT NULL,
    rr_key          bigint,            -- first seq - 2^62 if never claimed, else claim number; NULL: paused, never held a message
    has_messages    boolean NOT NULL DEFAULT true,
    paused          boolean NOT NULL DEFAULT false,
    lock_state      smallint NOT NULL DEFAULT 0,  -- 0 free, 1 leased, 2 parked, 3 buried (no end), 4 scheduled
    lock_worker     text,              -- the holder, '__parked__' for a park, the buried delivery's worker
    expires_at      double precision,  -- end of the lease or park, or the scheduled head's due ('Infinity': never)
    attempt         bigint NOT NULL DEFAULT 0,    -- deliveries of the head message so far
    open            boolean NOT NULL DEFAULT false, -- the head's latest delivery is current
    lease_seq       bigint,            -- the delivery's message (the head)
    lease_worker    text,              -- the delivery's worker
    last_claimed_at double precision,
    claim_token     bigint,            -- set by a waiting claim: lets it give the lease back if interrupted
    created         bigint NOT NULL DEFAULT nextval('leasequeue.created'),
    -- Version 2: the bury reason while buried (lock_state 3), else NULL.  A
    -- buried group is not ready (lock_state <> 0) and has no lock end
    -- (expires_at NULL): the indexes need no change.  Last, as migration 0002 adds it.
    reason          text,
    PRIMARY KEY (queue, group_id)
);
ALTER TABLE leasequeue.groups ADD COLUMN IF NOT EXISTS claim_token bigint;
ALTER TABLE leasequeue.groups ADD COLUMN IF NOT EXISTS created bigint NOT NULL DEFAULT nextval('leasequeue.created');

-- A database installed by a pre-release of this schema counted attempts in
-- an int: a lease's attempt is in the signed 64-bit range (decisions.md,
-- "Part 3"), so the column and the functions that take or return one are
-- bigint now.  The old functions go (their replacements differ in argument
-- or result types, which CREATE OR REPLACE cannot change).
DO $$
BEGIN
    IF (SELECT a.atttypid FROM pg_attribute a
        WHERE a.attrelid = 'leasequeue.groups'::regclass AND a.attname = 'attempt') = 'int4'::regtype THEN
        ALTER TABLE leasequeue.groups ALTER COLUMN attempt TYPE bigint;
        DROP FUNCTION IF EXISTS leasequeue.claim(int, text, double precision, bigint, double precision, int,
                                                 boolean, bigint);
        DROP FUNCTION IF EXISTS leasequeue.unclaim(int, text, bigint, int, text, bigint, double precision,
                                                   boolean, text);
        DROP FUNCTION IF EXISTS leasequeue.nack(int, text, bigint, int, text, double precision, double precision);
        DROP FUNCTION IF EXISTS leasequeue.extend(int, text, bigint, int, text, double precision,
                                                  double precision);
        DROP FUNCTION IF EXISTS leasequeue.current(int, text, bigint, int, text);
        DROP FUNCTION IF EXISTS leasequeue.ack(int, text, bigint, int, text);
        DROP FUNCTION IF EXISTS leasequeue.ack_many(int, text[], bigint[], int[], text[]);
        DROP FUNCTION IF EXISTS leasequeue.group_info(int, text, double precision);
    END IF;
END $$;

-- Ready groups by round-robin key (the claim's main index), and by priority
-- level for claims with a floor above some ready group's priority.
CREATE INDEX IF NOT EXISTS groups_ready ON leasequeue.groups (queue, rr_key)
    WHERE lock_state = 0 AND has_messages AND NOT paused;
CREATE INDEX IF NOT EXISTS groups_ready_level ON leasequeue.groups (queue, priority, rr_key)
    WHERE lock_state = 0 AND has_messages AND NOT paused;
-- Locks by expiry: expired locks are found without a scan.
CREATE INDEX IF NOT EXISTS groups_locked ON leasequeue.groups (queue, expires_at)
    WHERE lock_state <> 0;

CREATE TABLE IF NOT EXISTS leasequeue.messages (
    queue    int NOT NULL,
    group_id text NOT NULL,
    seq      bigint NOT NULL,
    payload  bytea NOT NULL,
    -- Version 4 (last, as migration 0004 adds them): the due time of a
    -- publish with a delay (NULL: none), and the idempotency key (NULL: none).
    due_at   double precision,
    key      text,
    PRIMARY KEY (queue, group_id, seq)
);

-- Version 4.  A scheduled head is a lock of its group (lock_state 4,
-- expires_at = its due): the expiry machinery frees it once due, and
-- waiting claims sleep until the earliest lock end, so it needs no index of
-- its own.  stats().scheduled counts the messages whose due is not past,
-- wherever they stand: a range of this partial index (messages published
-- without a delay are not in it).
CREATE INDEX IF NOT EXISTS messages_due ON leasequeue.messages (queue, due_at) WHERE due_at IS NOT NULL;
-- A key is held while its message is (the held check: one probe of this
-- index; unique, so two messages of a group never share a key) ...
CREATE UNIQUE INDEX IF NOT EXISTS messages_key ON leasequeue.messages (queue, group_id, key)
    WHERE key IS NOT NULL;
-- ... and, for a publish made with dedup_window > 0, until held_until
-- (its time + the window), also after its message left: one row per key,
-- written by that publish, dropped lazily once the time is past held_until
-- (a later publish of the key, or a sweep of a few rows by keyed publishes).
CREATE TABLE IF NOT EXISTS leasequeue.keys (
    queue      int NOT NULL,
    group_id   text NOT NULL,
    key        text NOT NULL,
    seq        bigint NOT NULL,            -- the message that used the key
    held_until double precision NOT NULL,  -- held while the time is before this ('Infinity': for ever)
    PRIMARY KEY (queue, group_id, key)
);
CREATE INDEX IF NOT EXISTS keys_held_until ON leasequeue.keys (queue, held_until);

-- Connections that LISTEN for a queue's notifications (one row per listening
-- backend).  Writers send NOTIFY only while a queue has listeners: a NOTIFY
-- serialises the commits of every notifying transaction of the database.
CREATE TABLE IF NOT EXISTS leasequeue.listeners (
    queue int NOT NULL,
    pid   int NOT NULL,
    PRIMARY KEY (queue, pid)
);

-- ------------------------------------------------------------------ queues

CREATE OR REPLACE FUNCTION leasequeue.register_queue(p_name text, OUT queue_id int, OUT queue_seq oid)
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
BEGIN
    SELECT q.id, q.seq_oid INTO queue_id, queue_seq FROM leasequeue.queues q WHERE q.name = p_name;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('leasequeue.register_queue'));
    SELECT q.id, q.seq_oid INTO queue_id, queue_seq FROM leasequeue.queues q WHERE q.name = p_name;
    IF FOUND THEN
        RETURN;
    END IF;
    queue_id := nextval(pg_get_serial_sequence('leasequeue.queues', 'id'));
    v_name := 'leasequeue.seq_' || queue_id;
    EXECUTE format('CREATE SEQUENCE %s', v_name);
    queue_seq := v_name::regclass::oid;
    INSERT INTO leasequeue.queues (id, name, seq_oid) VALUES (queue_id, p_name, queue_seq);
END $$;

-- ------------------------------------------------------------------ notifications

-- The advisory lock that orders announcements against listener sign-ups.
CREATE OR REPLACE FUNCTION leasequeue.listen_key(p_queue int) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT 4294967296 + p_queue $$;

-- Version 5: marks the transaction as the application's (an operation
-- given conn=): returns p_queue, so that the transport's statement passes
-- its queue through it, and the mark is set before the operation runs (an
-- argument is evaluated before its function).  Transaction-local: gone at
-- the commit or rollback.
CREATE OR REPLACE FUNCTION leasequeue.app_tx(p_queue int) RETURNS int
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('leasequeue.app_tx', 'on', true);
    RETURN p_queue;
END $$;

-- Tell this queue's waiting claims (on every machine) that a message of
-- this priority became claimable, if anybody listens.  The check runs under
-- the queue's shared listen lock, and a sign-up (listen_register) takes it
-- exclusively before it commits: either the sign-up waited for this
-- transaction to commit (so the new listener's first claim sees its
-- change), or this check sees the sign-up (and notifies).
-- In an application's transaction (version 5, leasequeue.app_tx) it
-- notifies without that lock or check: held until an application's commit,
-- the lock would hold up every sign-up, and every announcement queued
-- behind one, for as long as the application's transaction lasts.  A
-- notification is always safe to send (a listener that gets it looks once
-- more), and one sent at the commit reaches every listener that signed up
-- before the commit; one that signs up later sees the commit when it looks.
CREATE OR REPLACE FUNCTION leasequeue.announce(p_queue int, p_payload text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('leasequeue.app_tx', true) = 'on' THEN
        PERFORM pg_notify('leasequeue_' || p_queue, p_payload);
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(4294967296 + p_queue);
    IF EXISTS (SELECT 1 FROM leasequeue.listeners WHERE queue = p_queue) THEN
        PERFORM pg_notify('leasequeue_' || p_queue, p_payload);
    END IF;
    RETURN true;
END $$;

-- Called by a listening connection after its LISTEN: records it (and drops
-- the records of backends that are gone), then waits for every transaction
-- that may have decided not to notify before this sign-up.
CREATE OR REPLACE FUNCTION leasequeue.listen_register(p_queue int)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM leasequeue.listeners l
    WHERE l.queue = p_queue AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid);
    INSERT INTO leasequeue.listeners (queue, pid) VALUES (p_queue, pg_backend_pid())
    ON CONFLICT DO NOTHING;
    PERFORM pg_advisory_xact_lock(4294967296 + p_queue);
END $$;

-- The same for the listening connection p_pid, called on another
-- connection of its process: a process signs up only while one of its
-- waiting claims is about to sleep (docs/postgres.md, "Waiting").
CREATE OR REPLACE FUNCTION leasequeue.listen_register(p_queue int, p_pid int)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM leasequeue.listeners l
    WHERE l.queue = p_queue AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid);
    INSERT INTO leasequeue.listeners (queue, pid) VALUES (p_queue, p_pid)
    ON CONFLICT DO NOTHING;
    PERFORM pg_advisory_xact_lock(4294967296 + p_queue);
END $$;

CREATE OR REPLACE FUNCTION leasequeue.listen_unregister(p_queue int)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM leasequeue.listeners WHERE queue = p_queue AND pid = pg_backend_pid();
END $$;

-- ------------------------------------------------------------------ time

-- The time an operation acts at.  Server-clock mode (p_now NULL): the
-- server's clock_timestamp() in epoch seconds.  Injected-clock mode: the
-- caller's reading, but never before the latest time this queue used.
CREATE OR REPLACE FUNCTION leasequeue.time_now(p_queue int, p_now double precision)
RETURNS double precision LANGUAGE plpgsql AS $$
DECLARE
    v_latest double precision;
BEGIN
    IF p_now IS NULL THEN
        RETURN extract(epoch FROM clock_timestamp())::double precision;
    END IF;
    SELECT latest INTO v_latest FROM leasequeue.queues WHERE id = p_queue;
    RETURN GREATEST(p_now, v_latest);
END $$;

-- Injected-clock mode: record that an operation that succeeded used p_used.
CREATE OR REPLACE FUNCTION leasequeue.time_used(p_queue int, p_now double precision, p_used double precision)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_now IS NOT NULL THEN
        UPDATE leasequeue.queues SET latest = p_used WHERE id = p_queue AND latest < p_used;
    END IF;
END $$;

-- ------------------------------------------------------------------ expiry

-- Free every lock with expires_at < p_now (locks another transaction holds
-- are skipped: it is changing them).  The group keeps its round-robin key
-- and its open delivery; a group that becomes claimable is announced.
CREATE OR REPLACE FUNCTION leasequeue.expire(p_queue int, p_now double precision)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM leasequeue.groups e
                   WHERE e.queue = p_queue AND e.lock_state <> 0 AND e.expires_at < p_now) THEN
        RETURN;
    END IF;
    WITH freed AS (
        UPDATE leasequeue.groups g
        SET lock_state = 0, lock_worker = NULL, expires_at = NULL
        FROM (SELECT e.group_id FROM leasequeue.groups e
              WHERE e.queue = p_queue AND e.lock_state <> 0 AND e.expires_at < p_now
              FOR UPDATE SKIP LOCKED) x
        WHERE g.queue = p_queue AND g.group_id = x.group_id
        RETURNING g.priority, g.lease_seq, g.has_messages, g.paused
    )
    SELECT count(leasequeue.announce(p_queue, f.priority || ':' || coalesce(f.lease_seq, 0)))
    INTO v_n FROM freed f WHERE f.has_messages AND NOT f.paused;
END $$;

-- ------------------------------------------------------------------ publish

CREATE OR REPLACE FUNCTION leasequeue.publish(p_queue int, p_seq_oid oid, p_group text, p_payload bytea,
                                              p_priority bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_seq bigint;
    v_found boolean;
    v_has boolean;
    v_paused boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, hashtext(p_group));
    SELECT has_messages, paused INTO v_has, v_paused
    FROM leasequeue.groups WHERE queue = p_queue AND group_id = p_group;
    v_found := FOUND;
    v_seq := nextval(p_seq_oid::regclass);
    IF NOT v_found THEN
        INSERT INTO leasequeue.groups (queue, group_id, priority, rr_key)
        VALUES (p_queue, p_group, p_priority, v_seq - 4611686018427387904);
        PERFORM leasequeue.announce(p_queue, p_priority || ':' || v_seq);
    ELSIF NOT v_has THEN
        -- A paused group that holds nothing: it takes this message (its
        -- priority stays; one that never held a message is keyed by it).
        UPDATE leasequeue.groups
        SET has_messages = true,
            rr_key = coalesce(rr_key, v_seq - 4611686018427387904)
        WHERE queue = p_queue AND group_id = p_group;
    END IF;
    INSERT INTO leasequeue.messages (queue, group_id, seq, payload) VALUES (p_queue, p_group, v_seq, p_payload);
    RETURN v_seq;
END $$;

-- Items in order, as successive publishes would: the groups' advisory locks
-- are taken first, in a fixed order (two batches cannot deadlock), then
-- seqs are drawn in item order and the rows written with set statements.
CREATE OR REPLACE FUNCTION leasequeue.publish_many(p_queue int, p_seq_oid oid, p_groups text[],
                                                   p_payloads bytea[], p_priorities bigint[])
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    v_seqs bigint[];
    v_n bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, h)
    FROM (SELECT DISTINCT hashtext(g) AS h FROM unnest(p_groups) g ORDER BY 1) x;
    -- nextval runs once per row, in generate_series order: seqs follow the items.
    SELECT coalesce(array_agg(x.v ORDER BY x.i), '{}') INTO v_seqs
    FROM (SELECT i, nextval(p_seq_oid::regclass) AS v
          FROM generate_series(1, coalesce(array_length(p_groups, 1), 0)) i) x;
    -- Groups that do not exist yet: made by their first item (its priority,
    -- never claimed, keyed by its seq), and announced.
    WITH firsts AS (
        SELECT DISTINCT ON (k.group_id) k.group_id, k.priority, k.seq
        FROM unnest(p_groups, p_priorities, v_seqs) WITH ORDINALITY AS k(group_id, priority, seq, pos)
        ORDER BY k.group_id, k.pos
    ), made AS (
        INSERT INTO leasequeue.groups (queue, group_id, priority, rr_key)
        SELECT p_queue, f.group_id, f.priority, f.seq - 4611686018427387904 FROM firsts f
        WHERE NOT EXISTS (SELECT 1 FROM leasequeue.groups g WHERE g.queue = p_queue AND g.group_id = f.group_id)
        ORDER BY f.seq  -- creation order (the "created" counter) follows the items
        RETURNING priority, rr_key
    )
    SELECT count(leasequeue.announce(p_queue, m.priority || ':' || (m.rr_key + 4611686018427387904)))
    INTO v_n FROM made m;
    -- Paused groups that held nothing take their first message (their
    -- priority stays; one that never held a message is keyed by it).
    UPDATE leasequeue.groups g
    SET has_messages = true,
        rr_key = coalesce(g.rr_key, f.seq - 4611686018427387904)
    FROM (SELECT DISTINCT ON (k.group_id) k.group_id, k.priority, k.seq
          FROM unnest(p_groups, p_priorities, v_seqs) WITH ORDINALITY AS k(group_id, priority, seq, pos)
          ORDER BY k.group_id, k.pos) f
    WHERE g.queue = p_queue AND g.group_id = f.group_id AND NOT g.has_messages;
    INSERT INTO leasequeue.messages (queue, group_id, seq, payload)
    SELECT p_queue, k.group_id, k.seq, k.payload
    FROM unnest(p_groups, v_seqs, p_payloads) AS k(group_id, seq, payload);
    RETURN QUERY SELECT unnest(v_seqs);
END $$;

-- ------------------------------------------------------------------ later and once (version 4)

-- The time a publish with a delay or a key acts at: the caller's reading
-- (p_now), else the server's clock (p_server), else (an injected clock that
-- this publish did not read: a key with dedup_window 0) the latest time the
-- queue used, to test the hold of keys other publishers kept past their
-- messages.
CREATE OR REPLACE FUNCTION leasequeue.publish_time(p_queue int, p_now double precision, p_server boolean)
RETURNS double precision LANGUAGE plpgsql AS $$
DECLARE
    v_latest double precision;
BEGIN
    IF p_now IS NOT NULL OR p_server THEN
        RETURN leasequeue.time_now(p_queue, p_now);
    END IF;
    SELECT latest INTO v_latest FROM leasequeue.queues WHERE id = p_queue;
    RETURN v_latest;
END $$;

-- One message with a due time (p_due, NULL: none) and/or a key (p_key,
-- NULL: none), by a caller holding the group's advisory lock.  A held key
-- publishes nothing and returns its holder's seq (no seq used, no group
-- made, nobody woken).  p_held_until: how long the key stays held after its
-- message left (NULL: not at all, dedup_window 0).  A new head with a due
-- time is a lock of its group (lock_state 4) until due: it wakes nobody,
-- but the timekeepers of waiting claims learn the new lock end ('expiry').
CREATE OR REPLACE FUNCTION leasequeue.publish_one(p_queue int, p_seq_oid oid, p_group text, p_payload bytea,
                                                  p_priority bigint, p_due double precision, p_key text,
                                                  p_held_until double precision, p_now double precision)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_seq bigint;
    v_until double precision;
    v_found boolean;
    v_has boolean;
    v_paused boolean;
BEGIN
    IF p_key IS NOT NULL THEN
        SELECT seq INTO v_seq FROM leasequeue.messages
        WHERE queue = p_queue AND group_id = p_group AND key = p_key;
        IF FOUND THEN
            RETURN v_seq;
        END IF;
        SELECT seq, held_until INTO v_seq, v_until FROM leasequeue.keys
        WHERE queue = p_queue AND group_id = p_group AND key = p_key;
        IF FOUND THEN
            IF v_until > p_now THEN
                RETURN v_seq;
            END IF;
            DELETE FROM leasequeue.keys WHERE queue = p_queue AND group_id = p_group AND key = p_key;
        END IF;
    END IF;
    SELECT has_messages, paused INTO v_has, v_paused
    FROM leasequeue.groups WHERE queue = p_queue AND group_id = p_group;
    v_found := FOUND;
    v_seq := nextval(p_seq_oid::regclass);
    IF NOT v_found THEN
        INSERT INTO leasequeue.groups (queue, group_id, priority, rr_key, lock_state, expires_at)
        VALUES (p_queue, p_group, p_priority, v_seq - 4611686018427387904,
                CASE WHEN p_due IS NULL THEN 0 ELSE 4 END, p_due);
        IF p_due IS NULL THEN
            PERFORM leasequeue.announce(p_queue, p_priority || ':' || v_seq);
        ELSE
            PERFORM leasequeue.announce(p_queue, 'expiry');
        END IF;
    ELSIF NOT v_has THEN
        -- A paused group that holds nothing: it takes this message (its
        -- priority stays; one that never held a message is keyed by it).
        UPDATE leasequeue.groups
        SET has_messages = true,
            rr_key = coalesce(rr_key, v_seq - 4611686018427387904),
            lock_state = CASE WHEN p_due IS NULL THEN 0 ELSE 4 END,
            lock_worker = NULL,
            expires_at = p_due
        WHERE queue = p_queue AND group_id = p_group;
    END IF;
    INSERT INTO leasequeue.messages (queue, group_id, seq, payload, due_at, key)
    VALUES (p_queue, p_group, v_seq, p_payload, p_due, p_key);
    IF p_key IS NOT NULL AND p_held_until IS NOT NULL THEN
        INSERT INTO leasequeue.keys (queue, group_id, key, seq, held_until)
        VALUES (p_queue, p_group, p_key, v_seq, p_held_until);
    END IF;
    RETURN v_seq;
END $$;

-- Drop a few keys whose hold is over (the hold of a key whose message is
-- still there is that message's: its row here is not needed either).
CREATE OR REPLACE FUNCTION leasequeue.sweep_keys(p_queue int, p_now double precision)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM leasequeue.keys k
    WHERE k.ctid = ANY (ARRAY(SELECT x.ctid FROM leasequeue.keys x
                              WHERE x.queue = p_queue AND x.held_until <= p_now
                              ORDER BY x.held_until LIMIT 8));
END $$;

-- publish(..., delay=, key=): queue, seq oid, group, payload, priority,
-- delay (0: none), key (NULL: none), the transport's dedup_window, the
-- caller's clock reading (NULL: none, or the server's clock: p_server).
CREATE OR REPLACE FUNCTION leasequeue.publish_ext(p_queue int, p_seq_oid oid, p_group text, p_payload bytea,
                                                  p_priority bigint, p_delay double precision, p_key text,
                                                  p_window double precision, p_now double precision,
                                                  p_server boolean)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_now double precision;
    v_seq bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, hashtext(p_group));
    v_now := leasequeue.publish_time(p_queue, p_now, p_server);
    v_seq := leasequeue.publish_one(p_queue, p_seq_oid, p_group, p_payload, p_priority,
                                    CASE WHEN p_delay > 0 THEN v_now + p_delay END, p_key,
                                    CASE WHEN p_key IS NOT NULL AND p_window > 0 THEN v_now + p_window END, v_now);
    IF p_key IS NOT NULL AND p_window > 0 THEN
        PERFORM leasequeue.sweep_keys(p_queue, v_now);
    END IF;
    PERFORM leasequeue.time_used(p_queue, p_now, v_now);
    RETURN v_seq;
END $$;

-- publish_many(items, delay=) with keys: the groups' advisory locks first,
-- in a fixed order (as publish_many), one time for the batch, then each item
-- as publish_ext would publish it, in order: an item whose key is held (or
-- repeats an earlier item's in its group) gets the holder's seq.
CREATE OR REPLACE FUNCTION leasequeue.publish_many_ext(p_queue int, p_seq_oid oid, p_groups text[],
                                                       p_payloads bytea[], p_priorities bigint[], p_keys text[],
                                                       p_delay double precision, p_window double precision,
                                                       p_now double precision, p_server boolean)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    v_now double precision;
    v_due double precision;
    v_keyed boolean := false;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, h)
    FROM (SELECT DISTINCT hashtext(g) AS h FROM unnest(p_groups) g ORDER BY 1) x;
    v_now := leasequeue.publish_time(p_queue, p_now, p_server);
    v_due := CASE WHEN p_delay > 0 THEN v_now + p_delay END;
    FOR i IN 1 .. coalesce(array_length(p_groups, 1), 0) LOOP
        RETURN NEXT leasequeue.publish_one(
            p_queue, p_seq_oid, p_groups[i], p_payloads[i], p_priorities[i], v_due, p_keys[i],
            CASE WHEN p_keys[i] IS NOT NULL AND p_window > 0 THEN v_now + p_window END, v_now);
        v_keyed := v_keyed OR p_keys[i] IS NOT NULL;
    END LOOP;
    IF v_keyed AND p_window > 0 THEN
        PERFORM leasequeue.sweep_keys(p_queue, v_now);
    END IF;
    PERFORM leasequeue.time_used(p_queue, p_now, v_now);
END $$;

-- ------------------------------------------------------------------ claim

-- Up to p_count successive claims at one time (claim: p_count = 1).  Each
-- serves the ready group with the smallest round-robin key among those with
-- priority >= p_min_priority, skipping rows another transaction holds.
--
-- The time of the leases is read once the claim holds every group it
-- takes.  The reading taken first (which frees the expired locks) may be
-- older than an operation that committed on one of those groups while this
-- claim was held up between the two (a busy server): a lease made at it
-- would begin "before" the previous lease of its group and could even be
-- over before it was granted (docs/decisions.md, "The transport's time
-- never runs backwards"; tests/postgres/test_pg_claim_time.py).  Reading
-- later only moves the time forward, so the locks freed at the first
-- reading are expired at the second too.
CREATE OR REPLACE FUNCTION leasequeue.claim(p_queue int, p_worker text, p_visibility double precision,
                                            p_min_priority bigint, p_now double precision, p_count int,
                                            p_report boolean, p_token bigint)
RETURNS TABLE (seq bigint, group_id text, payload bytea, expires_at double precision, attempt bigint,
               prev_rr bigint, prev_last double precision, prev_open boolean, prev_worker text, delivery bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now double precision;
    v_delivery bigint;
    v_n int := 0;
    v_g leasequeue.groups%ROWTYPE;
    v_c leasequeue.groups%ROWTYPE;
    v_taken leasequeue.groups[] := '{}';  -- the groups this call leases, locked, in claim order
    v_ids text[] := '{}';                 -- their ids
    v_got boolean;
    v_lowest bigint;
    v_level bigint;
    v_seq bigint;
    v_payload bytea;
    v_batch refcursor;
    v_batching boolean := false;
    v_searched boolean := false;  -- the hot path found the answer (or that there is none)
BEGIN
    IF p_now IS NULL THEN
        v_now := extract(epoch FROM clock_timestamp())::double precision;
    ELSE
        v_now := leasequeue.time_now(p_queue, p_now);
    END IF;
    IF EXISTS (SELECT 1 FROM leasequeue.groups e
               WHERE e.queue = p_queue AND e.lock_state <> 0 AND e.expires_at < v_now) THEN
        PERFORM leasequeue.expire(p_queue, v_now);
    END IF;
    IF p_count = 1 THEN
        -- One claim (the hot path): the ready group claimed least recently
        -- that no other transaction holds.  If the floor admits it, it is
        -- the answer (it comes first among the admitted groups too); if
        -- there is none, nothing is claimable.  Only a group under the floor
        -- needs the search below (which will not take it: it stays locked
        -- by this transaction until it ends, as the search's own probes do).
        SELECT * INTO v_g FROM leasequeue.groups g
        WHERE g.queue = p_queue AND g.lock_state = 0 AND g.has_messages AND NOT g.paused
        ORDER BY g.rr_key LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            v_searched := true;
        ELSIF v_g.priority >= p_min_priority THEN
            v_taken := ARRAY[v_g];
            v_n := 1;
            v_searched := true;
        END IF;
    ELSIF p_count > 1 THEN
        -- A batch whose floor admits every ready group: the p_count ready
        -- groups with the smallest keys, in one index walk, are exactly what
        -- p_count successive claims take (each claimed group moves to the
        -- back).  The search below would walk past the rows this transaction
        -- already claimed at every step.
        SELECT g.priority INTO v_lowest FROM leasequeue.groups g
        WHERE g.queue = p_queue AND g.lock_state = 0 AND g.has_messages AND NOT g.paused
        ORDER BY g.priority LIMIT 1;
        IF FOUND AND v_lowest >= p_min_priority THEN
            OPEN v_batch FOR
                SELECT * FROM leasequeue.groups g
                WHERE g.queue = p_queue AND g.lock_state = 0 AND g.has_messages AND NOT g.paused
                ORDER BY g.rr_key LIMIT p_count
                FOR UPDATE SKIP LOCKED;
            v_batching := true;
        END IF;
    END IF;
    -- First take (lock) the groups, then read the time, then lease them.
    WHILE v_n < p_count AND NOT v_searched LOOP
        IF v_batching THEN
            FETCH v_batch INTO v_g;
            EXIT WHEN NOT FOUND;  -- nothing else is claimable now
        ELSE
            -- The groups already taken are still "ready" in the table (they
            -- are leased below): each has a priority >= the floor, so they
            -- do not change which way the next group is looked for.
            SELECT g.priority INTO v_lowest FROM leasequeue.groups g
            WHERE g.queue = p_queue AND g.lock_state = 0 AND g.has_messages AND NOT g.paused
            ORDER BY g.priority LIMIT 1;
            EXIT WHEN NOT FOUND;
            v_got := false;
            IF v_lowest >= p_min_priority THEN
                -- The floor admits every ready group: one walk of the ready index.
                SELECT * INTO v_g FROM leasequeue.groups g
                WHERE g.queue = p_queue AND g.lock_state = 0 AND g.has_messages AND NOT g.paused
                  AND g.group_id <> ALL (v_ids)
                ORDER BY g.rr_key LIMIT 1
                FOR UPDATE SKIP LOCKED;
                v_got := FOUND;
            ELSE
                -- Visit each priority level >= the floor (a loose index scan) and
                -- keep the best head of each: O(L log G) for L levels.
                SELECT g.priority INTO v_level FROM leasequeue.groups g
                WHERE g.queue = p_queue AND g.lock_state = 0 AND g.has_messages AND NOT g.paused
                  AND g.priority >= p_min_priority
                ORDER BY g.priority LIMIT 1;
                WHILE FOUND LOOP
                    SELECT * INTO v_c FROM leasequeue.groups g
                    WHERE g.queue = p_queue AND g.lock_state = 0 AND g.has_messages AND NOT g.paused
                      AND g.priority = v_level AND g.group_id <> ALL (v_ids)
                    ORDER BY g.rr_key LIMIT 1
                    FOR UPDATE SKIP LOCKED;
                    IF FOUND AND (NOT v_got OR v_c.rr_key < v_g.rr_key) THEN
                        v_g := v_c;
                        v_got := true;
                    END IF;
                    SELECT g.priority INTO v_level FROM leasequeue.groups g
                    WHERE g.queue = p_queue AND g.lock_state = 0 AND g.has_messages AND NOT g.paused
                      AND g.priority > v_level
                    ORDER BY g.priority LIMIT 1;
                END LOOP;
            END IF;
            EXIT WHEN NOT v_got;
        END IF;
        v_taken := v_taken || v_g;
        v_ids := v_ids || v_g.group_id;
        v_n := v_n + 1;
    END LOOP;
    IF v_n > 0 THEN
        -- Every operation on these groups before this claim has committed
        -- (this transaction holds their rows): a reading now is not older
        -- than any of them.
        IF p_now IS NULL THEN
            v_now := GREATEST(v_now, extract(epoch FROM clock_timestamp())::double precision);
        ELSE
            v_now := GREATEST(v_now, leasequeue.time_now(p_queue, p_now));
        END IF;
    END IF;
    IF p_now IS NOT NULL THEN
        PERFORM leasequeue.time_used(p_queue, p_now, v_now);
    END IF;
    FOREACH v_g IN ARRAY v_taken LOOP
        SELECT m.seq, m.payload INTO v_seq, v_payload FROM leasequeue.messages m
        WHERE m.queue = p_queue AND m.group_id = v_g.group_id
        ORDER BY m.seq LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'leasequeue: group % of queue % has no message', v_g.group_id, p_queue;
        END IF;
        -- The claim's number: the group's round-robin key, and the delivery's name.
        v_delivery := nextval('leasequeue.claims');
        UPDATE leasequeue.groups g
        SET lock_state = 1, lock_worker = p_worker, expires_at = v_now + p_visibility,
            attempt = v_g.attempt + 1, open = true, lease_seq = v_seq, lease_worker = p_worker,
            rr_key = v_delivery, last_claimed_at = v_now,
            claim_token = p_token
        WHERE g.queue = p_queue AND g.group_id = v_g.group_id;
        seq := v_seq;
        group_id := v_g.group_id;
        payload := v_payload;
        expires_at := v_now + p_visibility;
        attempt := v_g.attempt + 1;
        prev_rr := v_g.rr_key;
        prev_last := v_g.last_claimed_at;
        prev_open := v_g.open;
        prev_worker := v_g.lease_worker;
        delivery := v_delivery;
        RETURN NEXT;
    END LOOP;
    IF p_report AND v_n < p_count THEN
        -- For a waiting claim that got nothing: one more row (seq NULL) with
        -- the earliest lock end (expires_at), the time used (prev_last), and
        -- whether a claimable group was skipped because another transaction
        -- held its row (prev_open).
        seq := NULL;
        group_id := NULL;
        payload := NULL;
        attempt := NULL;
        prev_rr := NULL;
        prev_worker := NULL;
        delivery := NULL;
        prev_last := v_now;
        SELECT g.expires_at INTO expires_at FROM leasequeue.groups g
        WHERE g.queue = p_queue AND g.lock_state <> 0 ORDER BY g.expires_at LIMIT 1;
        prev_open := leasequeue.claimable(p_queue, p_min_priority);
        RETURN NEXT;
    END IF;
END $$;

-- Is any group claimable under this floor right now?  (A waiting claim asks
-- after an empty claim: a row another transaction held was skipped.)
CREATE OR REPLACE FUNCTION leasequeue.claimable(p_queue int, p_min_priority bigint)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM leasequeue.groups g
                   WHERE g.queue = p_queue AND g.lock_state = 0 AND g.has_messages AND NOT g.paused
                     AND g.priority >= p_min_priority);
END $$;

-- Undo a claim whose caller was cancelled before it got the lease: the
-- group's state before the claim comes back (attempt, round-robin key,
-- the previous delivery), and the message is announced again.
CREATE OR REPLACE FUNCTION leasequeue.unclaim(p_queue int, p_group text, p_seq bigint, p_attempt bigint,
                                              p_worker text, p_delivery bigint, p_prev_rr bigint,
                                              p_prev_last double precision, p_prev_open boolean, p_prev_worker text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_g leasequeue.groups%ROWTYPE;
BEGIN
    SELECT * INTO v_g FROM leasequeue.groups
    WHERE queue = p_queue AND group_id = p_group FOR UPDATE;
    IF NOT FOUND OR NOT v_g.open OR v_g.attempt <> p_attempt OR v_g.lease_seq IS DISTINCT FROM p_seq
       OR v_g.lease_worker IS DISTINCT FROM p_worker OR v_g.rr_key IS DISTINCT FROM p_delivery
       OR v_g.lock_state <> 1 THEN
        RETURN false;
    END IF;
    UPDATE leasequeue.groups
    SET lock_state = 0, lock_worker = NULL, expires_at = NULL, attempt = p_attempt - 1,
        open = p_prev_open, lease_worker = CASE WHEN p_prev_open THEN p_prev_worker END,
        lease_seq = CASE WHEN p_prev_open THEN p_seq END,
        rr_key = p_prev_rr, last_claimed_at = p_prev_last
    WHERE queue = p_queue AND group_id = p_group;
    IF NOT v_g.paused THEN
        PERFORM leasequeue.announce(p_queue, v_g.priority || ':' || p_seq);
    END IF;
    RETURN true;
END $$;

-- Give back the lease a waiting claim made if the caller was interrupted
-- before it got the answer (it may or may not have committed): the
-- message is free again (that delivery counts as an attempt, as a crash
-- would) and announced.  Rare: a scan of the queue's locked groups.
CREATE OR REPLACE FUNCTION leasequeue.release_token(p_queue int, p_token bigint)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    v_n int := 0;
    v_g record;
BEGIN
    FOR v_g IN
        UPDATE leasequeue.groups g
        SET lock_state = 0, lock_worker = NULL, expires_at = NULL, open = false, claim_token = NULL
        WHERE g.queue = p_queue AND g.lock_state = 1 AND g.open AND g.claim_token = p_token
        RETURNING g.priority, g.lease_seq, g.paused
    LOOP
        v_n := v_n + 1;
        IF NOT v_g.paused THEN
            PERFORM leasequeue.announce(p_queue, v_g.priority || ':' || v_g.lease_seq);
        END IF;
    END LOOP;
    RETURN v_n;
END $$;

-- ------------------------------------------------------------------ settle

-- The group row of a current delivery, locked; NULL fields if not current.
-- A lease names its delivery by its fields (seq, attempt, worker) and, if
-- the transport issued it, by the delivery's number (p_delivery; NULL for a
-- lease built by hand): while a delivery is open, the group's rr_key is its
-- number, so a closed delivery is never current again, whatever its attempt.
CREATE OR REPLACE FUNCTION leasequeue.current(p_queue int, p_group text, p_seq bigint, p_attempt bigint,
                                              p_worker text, p_delivery bigint)
RETURNS leasequeue.groups LANGUAGE plpgsql AS $$
DECLARE
    v_g leasequeue.groups%ROWTYPE;
BEGIN
    SELECT * INTO v_g FROM leasequeue.groups
    WHERE queue = p_queue AND group_id = p_group FOR UPDATE;
    IF NOT FOUND OR NOT v_g.open OR v_g.attempt <> p_attempt OR v_g.lease_seq IS DISTINCT FROM p_seq
       OR v_g.lease_worker IS DISTINCT FROM p_worker OR v_g.rr_key IS DISTINCT FROM coalesce(p_delivery, v_g.rr_key) THEN
        RETURN NULL;
    END IF;
    RETURN v_g;
END $$;

CREATE OR REPLACE FUNCTION leasequeue.ack(p_queue int, p_group text, p_seq bigint, p_attempt bigint,
                                          p_worker text, p_delivery bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_next bigint;
    v_due double precision;
    v_priority bigint;
    v_paused boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, hashtext(p_group));
    -- The message after the delivery's (its group's head): publishers to the
    -- group wait for the advisory lock, so it stays the next one.
    SELECT seq, due_at INTO v_next, v_due FROM leasequeue.messages
    WHERE queue = p_queue AND group_id = p_group AND seq > p_seq ORDER BY seq LIMIT 1;
    -- Free the group if the delivery is current; if it is not, this changes
    -- nothing and finds no row.  (One statement: no separate FOR UPDATE,
    -- which costs a second write of the row.)  A next message published
    -- with a delay is a scheduled head (lock_state 4) until its due; ack
    -- reads no clock: if it is due already, the next operation that reads
    -- one frees it (expire), as a lock that ran out.
    UPDATE leasequeue.groups
    SET lock_state = CASE WHEN v_due IS NULL THEN 0 ELSE 4 END, lock_worker = NULL, expires_at = v_due,
        attempt = 0, open = false, lease_seq = NULL, lease_worker = NULL, has_messages = (v_next IS NOT NULL)
    WHERE queue = p_queue AND group_id = p_group AND open AND attempt = p_attempt AND lease_seq = p_seq
      AND lease_worker = p_worker AND rr_key = coalesce(p_delivery, rr_key)
    RETURNING priority, paused INTO v_priority, v_paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM leasequeue.messages WHERE queue = p_queue AND group_id = p_group AND seq = p_seq;
    IF v_next IS NULL THEN
        IF NOT v_paused THEN
            DELETE FROM leasequeue.groups WHERE queue = p_queue AND group_id = p_group;
        END IF;
    ELSIF NOT v_paused THEN
        -- leasequeue.announce, inlined (the hot path: one call less).
        IF current_setting('leasequeue.app_tx', true) = 'on' THEN
            PERFORM pg_notify('leasequeue_' || p_queue,
                              CASE WHEN v_due IS NULL THEN v_priority || ':' || v_next ELSE 'expiry' END);
            RETURN true;
        END IF;
        PERFORM pg_advisory_xact_lock_shared(4294967296 + p_queue);
        IF EXISTS (SELECT 1 FROM leasequeue.listeners WHERE queue = p_queue) THEN
            PERFORM pg_notify('leasequeue_' || p_queue,
                              CASE WHEN v_due IS NULL THEN v_priority || ':' || v_next ELSE 'expiry' END);
        END IF;
    END IF;
    RETURN true;
END $$;

-- Version 3: ack, then claim at the same time, in one transaction (one
-- commit per job for a worker's loop).  No rows: the lease was not current,
-- nothing changed (the ack's locks are the transaction's, and it found
-- nothing to change).  Else the claim's row, or one row of NULLs when the
-- claim found nothing (the ack stands).  The ack announces the group's next
-- message as a lone ack does (only while somebody listens): the claim may
-- then take it itself, which costs a sleeping claim one look, never a
-- missed wake-up.
CREATE OR REPLACE FUNCTION leasequeue.ack_and_claim(p_queue int, p_group text, p_seq bigint, p_attempt bigint,
                                                    p_worker text, p_delivery bigint, p_claimer text,
                                                    p_visibility double precision, p_min_priority bigint,
                                                    p_now double precision)
RETURNS TABLE (seq bigint, group_id text, payload bytea, expires_at double precision, attempt bigint,
               prev_rr bigint, prev_last double precision, prev_open boolean, prev_worker text, delivery bigint)
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT leasequeue.ack(p_queue, p_group, p_seq, p_attempt, p_worker, p_delivery) THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM leasequeue.claim(p_queue, p_claimer, p_visibility, p_min_priority, p_now, 1,
                                                 false, NULL);
    IF NOT FOUND THEN
        RETURN NEXT;  -- every column NULL: acked, nothing claimed
    END IF;
END $$;

-- Returns the 1-based positions of the leases that were not current.  All
-- the groups' advisory locks are taken first, in a fixed order; then the
-- batch is settled with set statements (one ack per group at most: after
-- it, the group's next message has no open delivery).
CREATE OR REPLACE FUNCTION leasequeue.ack_many(p_queue int, p_groups text[], p_seqs bigint[],
                                               p_attempts bigint[], p_workers text[], p_deliveries bigint[])
RETURNS SETOF int LANGUAGE plpgsql AS $$
DECLARE
    v_pos int[];
    v_groups text[];
    v_seqs bigint[];
    v_n bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, h)
    FROM (SELECT DISTINCT hashtext(g) AS h FROM unnest(p_groups) g ORDER BY 1) x;
    PERFORM 1 FROM leasequeue.groups g
    WHERE g.queue = p_queue AND g.group_id = ANY (p_groups)
    ORDER BY g.group_id FOR UPDATE;
    -- The current leases: for each group, the first position naming its open delivery.
    SELECT coalesce(array_agg(c.pos), '{}'), coalesce(array_agg(c.group_id), '{}'),
           coalesce(array_agg(c.seq), '{}')
    INTO v_pos, v_groups, v_seqs
    FROM (SELECT DISTINCT ON (k.group_id) k.pos::int AS pos, k.group_id, k.seq
          FROM unnest(p_groups, p_seqs, p_attempts, p_workers, p_deliveries) WITH ORDINALITY
               AS k(group_id, seq, attempt, worker, delivery, pos)
          JOIN leasequeue.groups g ON g.queue = p_queue AND g.group_id = k.group_id
          WHERE g.open AND g.attempt = k.attempt AND g.lease_seq = k.seq AND g.lease_worker = k.worker
            AND g.rr_key = coalesce(k.delivery, g.rr_key)
          ORDER BY k.group_id, k.pos) c;
    DELETE FROM leasequeue.messages m
    USING unnest(v_groups, v_seqs) AS c(group_id, seq)
    WHERE m.queue = p_queue AND m.group_id = c.group_id AND m.seq = c.seq;
    -- Groups with a next message (or paused) stay, free (or scheduled, as
    -- after ack); the others are forgotten.
    WITH nxt AS (
        SELECT c.group_id, h.seq AS head, h.due_at AS due
        FROM unnest(v_groups) AS c(group_id)
        LEFT JOIN LATERAL (SELECT m.seq, m.due_at FROM leasequeue.messages m
                           WHERE m.queue = p_queue AND m.group_id = c.group_id
                           ORDER BY m.seq LIMIT 1) h ON true
    ), freed AS (
        UPDATE leasequeue.groups g
        SET lock_state = CASE WHEN n.due IS NULL THEN 0 ELSE 4 END, lock_worker = NULL, expires_at = n.due,
            attempt = 0, open = false, lease_seq = NULL, lease_worker = NULL, has_messages = (n.head IS NOT NULL)
        FROM nxt n
        WHERE g.queue = p_queue AND g.group_id = n.group_id AND (n.head IS NOT NULL OR g.paused)
        RETURNING g.priority, g.paused, n.head, n.due
    )
    SELECT count(leasequeue.announce(p_queue, CASE WHEN f.due IS NULL THEN f.priority || ':' || f.head
                                                   ELSE 'expiry' END)) INTO v_n
    FROM freed f WHERE f.head IS NOT NULL AND NOT f.paused;
    DELETE FROM leasequeue.groups g
    USING unnest(v_groups) AS c(group_id)
    WHERE g.queue = p_queue AND g.group_id = c.group_id AND NOT g.paused
      AND NOT EXISTS (SELECT 1 FROM leasequeue.messages m WHERE m.queue = p_queue AND m.group_id = g.group_id);
    RETURN QUERY
    SELECT i FROM generate_series(1, coalesce(array_length(p_groups, 1), 0)) i
    WHERE NOT (i = ANY (v_pos)) ORDER BY i;
END $$;

-- nack, and (p_release, version 4) release: the same, then the delivery
-- does not count (the attempt count goes back to p_attempt - 1).
CREATE OR REPLACE FUNCTION leasequeue.nack(p_queue int, p_group text, p_seq bigint, p_attempt bigint,
                                           p_worker text, p_delivery bigint, p_delay double precision,
                                           p_now double precision, p_release boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_g leasequeue.groups%ROWTYPE;
    v_now double precision;
BEGIN
    v_g := leasequeue.current(p_queue, p_group, p_seq, p_attempt, p_worker, p_delivery);
    IF v_g.group_id IS NULL THEN
        RETURN false;
    END IF;
    IF p_release THEN
        UPDATE leasequeue.groups SET attempt = p_attempt - 1 WHERE queue = p_queue AND group_id = p_group;
    END IF;
    IF p_delay = 0 THEN
        UPDATE leasequeue.groups
        SET lock_state = 0, lock_worker = NULL, expires_at = NULL, open = false
        WHERE queue = p_queue AND group_id = p_group;
        IF NOT v_g.paused THEN
            PERFORM leasequeue.announce(p_queue, v_g.priority || ':' || p_seq);
        END IF;
    ELSE
        v_now := leasequeue.time_now(p_queue, p_now);
        UPDATE leasequeue.groups
        SET lock_state = 2, lock_worker = '__parked__', expires_at = v_now + p_delay, open = false
        WHERE queue = p_queue AND group_id = p_group;
        PERFORM leasequeue.time_used(p_queue, p_now, v_now);
        -- Waiting claims elsewhere learn the new expiry.
        PERFORM leasequeue.announce(p_queue, 'expiry');
    END IF;
    RETURN true;
END $$;

-- The new expires_at, or NULL if the lease is not current.
CREATE OR REPLACE FUNCTION leasequeue.extend(p_queue int, p_group text, p_seq bigint, p_attempt bigint,
                                             p_worker text, p_delivery bigint, p_visibility double precision,
                                             p_now double precision)
RETURNS double precision LANGUAGE plpgsql AS $$
DECLARE
    v_g leasequeue.groups%ROWTYPE;
    v_now double precision;
BEGIN
    v_g := leasequeue.current(p_queue, p_group, p_seq, p_attempt, p_worker, p_delivery);
    IF v_g.group_id IS NULL THEN
        RETURN NULL;
    END IF;
    v_now := leasequeue.time_now(p_queue, p_now);
    UPDATE leasequeue.groups
    SET lock_state = 1, lock_worker = p_worker, expires_at = v_now + p_visibility
    WHERE queue = p_queue AND group_id = p_group;
    PERFORM leasequeue.time_used(p_queue, p_now, v_now);
    RETURN v_now + p_visibility;
END $$;

-- ------------------------------------------------------------------ reading

CREATE OR REPLACE FUNCTION leasequeue.stats(p_queue int, p_now double precision,
    OUT messages bigint, OUT groups bigint, OUT leased bigint, OUT parked bigint, OUT paused bigint,
    OUT buried bigint, OUT scheduled bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now double precision;
BEGIN
    v_now := leasequeue.time_now(p_queue, p_now);
    PERFORM leasequeue.time_used(p_queue, p_now, v_now);
    PERFORM leasequeue.expire(p_queue, v_now);
    SELECT count(*) INTO messages FROM leasequeue.messages m WHERE m.queue = p_queue;
    -- Not yet due, wherever they stand: a range of messages_due.
    SELECT count(*) INTO scheduled FROM leasequeue.messages m WHERE m.queue = p_queue AND m.due_at >= v_now;
    SELECT count(*) FILTER (WHERE g.has_messages),
           count(*) FILTER (WHERE g.lock_state = 1 AND g.expires_at >= v_now),
           count(*) FILTER (WHERE g.lock_state = 2 AND g.expires_at >= v_now),
           count(*) FILTER (WHERE g.paused),
           count(*) FILTER (WHERE g.lock_state = 3)
    INTO groups, leased, parked, paused, buried
    FROM leasequeue.groups g WHERE g.queue = p_queue;
END $$;

-- The earliest lock end of the queue, and the server's time now.
CREATE OR REPLACE FUNCTION leasequeue.next_expiry(p_queue int, OUT expires_at double precision,
                                                  OUT server_now double precision)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    SELECT g.expires_at INTO expires_at FROM leasequeue.groups g
    WHERE g.queue = p_queue AND g.lock_state <> 0 ORDER BY g.expires_at LIMIT 1;
    server_now := extract(epoch FROM clock_timestamp())::double precision;
END $$;

-- ------------------------------------------------------------------ control plane

CREATE OR REPLACE FUNCTION leasequeue.pause(p_queue int, p_group text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_paused boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, hashtext(p_group));
    SELECT paused INTO v_paused FROM leasequeue.groups
    WHERE queue = p_queue AND group_id = p_group FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO leasequeue.groups (queue, group_id, priority, rr_key, has_messages, paused)
        VALUES (p_queue, p_group, 0, NULL, false, true);
        RETURN true;
    END IF;
    IF v_paused THEN
        RETURN false;
    END IF;
    UPDATE leasequeue.groups SET paused = true WHERE queue = p_queue AND group_id = p_group;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION leasequeue.resume(p_queue int, p_group text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_g leasequeue.groups%ROWTYPE;
    v_head bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, hashtext(p_group));
    SELECT * INTO v_g FROM leasequeue.groups
    WHERE queue = p_queue AND group_id = p_group FOR UPDATE;
    IF NOT FOUND OR NOT (v_g.paused OR v_g.lock_state IN (2, 3)) THEN
        RETURN false;
    END IF;
    IF NOT v_g.has_messages THEN
        DELETE FROM leasequeue.groups WHERE queue = p_queue AND group_id = p_group;  -- forgotten
        RETURN true;
    END IF;
    -- A park ends and a bury (lock_state 3) is lifted: the head is claimable
    -- again, its next delivery attempt + 1.
    UPDATE leasequeue.groups
    SET paused = false,
        lock_state = CASE WHEN lock_state IN (2, 3) THEN 0 ELSE lock_state END,
        lock_worker = CASE WHEN lock_state IN (2, 3) THEN NULL ELSE lock_worker END,
        expires_at = CASE WHEN lock_state = 2 THEN NULL ELSE expires_at END,
        reason = NULL
    WHERE queue = p_queue AND group_id = p_group;
    IF v_g.lock_state NOT IN (1, 4) THEN  -- a scheduled head: the timekeepers know its due already
        SELECT seq INTO v_head FROM leasequeue.messages
        WHERE queue = p_queue AND group_id = p_group ORDER BY seq LIMIT 1;
        PERFORM leasequeue.announce(p_queue, v_g.priority || ':' || v_head);
    END IF;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION leasequeue.purge(p_queue int, p_group text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, hashtext(p_group));
    PERFORM 1 FROM leasequeue.groups WHERE queue = p_queue AND group_id = p_group FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    WITH gone AS (DELETE FROM leasequeue.messages WHERE queue = p_queue AND group_id = p_group RETURNING 1)
    SELECT count(*) INTO v_n FROM gone;
    DELETE FROM leasequeue.groups WHERE queue = p_queue AND group_id = p_group;
    RETURN v_n;
END $$;

CREATE OR REPLACE FUNCTION leasequeue.set_priority(p_queue int, p_group text, p_priority bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_g leasequeue.groups%ROWTYPE;
BEGIN
    UPDATE leasequeue.groups SET priority = p_priority
    WHERE queue = p_queue AND group_id = p_group
    RETURNING * INTO v_g;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_g.lock_state = 0 AND v_g.has_messages AND NOT v_g.paused THEN
        PERFORM leasequeue.announce(p_queue, p_priority || ':' || coalesce(v_g.rr_key, 0) || ':p');
    END IF;
    RETURN true;
END $$;

-- One group (p_group) or every group (p_group NULL), as of now.
CREATE OR REPLACE FUNCTION leasequeue.group_info(p_queue int, p_group text, p_now double precision)
RETURNS TABLE (group_id text, priority bigint, messages bigint, paused boolean, lock_state smallint,
               head_seq bigint, lock_worker text, expires_at double precision, attempt bigint,
               last_claimed_at double precision, reason text, due_at double precision)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now double precision;
BEGIN
    v_now := leasequeue.time_now(p_queue, p_now);
    PERFORM leasequeue.time_used(p_queue, p_now, v_now);
    PERFORM leasequeue.expire(p_queue, v_now);
    RETURN QUERY
    SELECT g.group_id, g.priority, coalesce(m.n, 0), g.paused,
           CASE WHEN g.lock_state <> 0 AND g.expires_at < v_now THEN 0::smallint ELSE g.lock_state END,
           m.head, g.lock_worker, g.expires_at, g.attempt, g.last_claimed_at, g.reason,
           CASE WHEN g.lock_state = 4 AND g.expires_at >= v_now THEN g.expires_at END
    FROM leasequeue.groups g
    LEFT JOIN LATERAL (SELECT count(*) AS n, min(x.seq) AS head FROM leasequeue.messages x
                       WHERE x.queue = g.queue AND x.group_id = g.group_id) m ON true
    WHERE g.queue = p_queue AND (p_group IS NULL OR g.group_id = p_group)
    ORDER BY g.created;
END $$;

-- ------------------------------------------------------------------ quarantine (version 2)

-- Bury the current delivery (else false, nothing changed): it ends, its
-- message stays at the group's head, and the group is served by no claim
-- (lock_state 3: not ready, no end) until resume or skip.  The worker and
-- attempt stay for group_info.
CREATE OR REPLACE FUNCTION leasequeue.bury(p_queue int, p_group text, p_seq bigint, p_attempt bigint,
                                           p_worker text, p_delivery bigint, p_reason text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_g leasequeue.groups%ROWTYPE;
BEGIN
    v_g := leasequeue.current(p_queue, p_group, p_seq, p_attempt, p_worker, p_delivery);
    IF v_g.group_id IS NULL THEN
        RETURN false;
    END IF;
    UPDATE leasequeue.groups
    SET lock_state = 3, lock_worker = p_worker, expires_at = NULL, open = false, reason = p_reason
    WHERE queue = p_queue AND group_id = p_group;
    RETURN true;
END $$;

-- Remove the group's head unless a lease that has not expired (at the
-- operation's time) holds it; any park, bury or delivery of it ends with
-- it.  The next message becomes the head (claimable and announced unless
-- the group is paused); an emptied group is forgotten unless paused.  A
-- group never claimed is ordered by its oldest message: it is keyed by its
-- new head (an emptied one by its next publish).  False, nothing changed,
-- for an unknown group, an empty paused one, or a live lease.
CREATE OR REPLACE FUNCTION leasequeue.skip(p_queue int, p_group text, p_now double precision)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_g leasequeue.groups%ROWTYPE;
    v_now double precision;
    v_head bigint;
    v_next bigint;
    v_due double precision;
    v_scheduled boolean;
BEGIN
    -- The group's advisory lock first (then rows: expire skips the rows others
    -- hold and never waits), as every other write to one group takes them.
    PERFORM pg_advisory_xact_lock(p_queue, hashtext(p_group));
    v_now := leasequeue.time_now(p_queue, p_now);
    PERFORM leasequeue.time_used(p_queue, p_now, v_now);
    PERFORM leasequeue.expire(p_queue, v_now);
    SELECT * INTO v_g FROM leasequeue.groups
    WHERE queue = p_queue AND group_id = p_group FOR UPDATE;
    IF NOT FOUND OR NOT v_g.has_messages OR (v_g.lock_state = 1 AND v_g.expires_at >= v_now) THEN
        RETURN false;
    END IF;
    SELECT seq INTO v_head FROM leasequeue.messages
    WHERE queue = p_queue AND group_id = p_group ORDER BY seq LIMIT 1;
    DELETE FROM leasequeue.messages WHERE queue = p_queue AND group_id = p_group AND seq = v_head;
    SELECT seq, due_at INTO v_next, v_due FROM leasequeue.messages
    WHERE queue = p_queue AND group_id = p_group ORDER BY seq LIMIT 1;
    v_scheduled := v_due >= v_now;  -- the next head is scheduled, not due
    IF v_next IS NULL AND NOT v_g.paused THEN
        DELETE FROM leasequeue.groups WHERE queue = p_queue AND group_id = p_group;
        RETURN true;
    END IF;
    UPDATE leasequeue.groups
    SET has_messages = (v_next IS NOT NULL), lock_state = CASE WHEN v_scheduled THEN 4 ELSE 0 END,
        lock_worker = NULL, expires_at = CASE WHEN v_scheduled THEN v_due END,
        attempt = 0, open = false, lease_seq = NULL, lease_worker = NULL, reason = NULL,
        rr_key = CASE WHEN v_g.last_claimed_at IS NOT NULL THEN rr_key
                      WHEN v_next IS NULL THEN NULL
                      ELSE v_next - 4611686018427387904 END
    WHERE queue = p_queue AND group_id = p_group;
    IF v_next IS NOT NULL AND NOT v_g.paused THEN
        PERFORM leasequeue.announce(p_queue, CASE WHEN v_scheduled THEN 'expiry'
                                                  ELSE v_g.priority || ':' || v_next END);
    END IF;
    RETURN true;
END $$;

-- ------------------------------------------------------------------ retry (version 4)

-- The operator's "run it again from scratch" (decisions.md, "Honest
-- attempts"): false, nothing changed (but the time and the expiry applied),
-- for an unknown group, one holding no message, or a head under a lease
-- that has not expired.  Otherwise the head's attempt count goes back to 0,
-- a bury is lifted, a park ends, an expired lease's delivery closes; a
-- pause, a schedule, the round-robin key and last_claimed_at stay.  A head
-- that is then claimable is announced.
CREATE OR REPLACE FUNCTION leasequeue.retry(p_queue int, p_group text, p_now double precision)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_g leasequeue.groups%ROWTYPE;
    v_now double precision;
    v_scheduled boolean;
    v_head bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, hashtext(p_group));
    v_now := leasequeue.time_now(p_queue, p_now);
    PERFORM leasequeue.time_used(p_queue, p_now, v_now);
    PERFORM leasequeue.expire(p_queue, v_now);
    SELECT * INTO v_g FROM leasequeue.groups
    WHERE queue = p_queue AND group_id = p_group FOR UPDATE;
    IF NOT FOUND OR NOT v_g.has_messages OR (v_g.lock_state = 1 AND v_g.expires_at >= v_now) THEN
        RETURN false;
    END IF;
    v_scheduled := v_g.lock_state = 4 AND v_g.expires_at >= v_now;
    UPDATE leasequeue.groups
    SET attempt = 0, reason = NULL, open = false, lease_seq = NULL, lease_worker = NULL,
        lock_state = CASE WHEN v_scheduled THEN 4 ELSE 0 END, lock_worker = NULL,
        expires_at = CASE WHEN v_scheduled THEN expires_at END
    WHERE queue = p_queue AND group_id = p_group;
    IF NOT v_scheduled AND NOT v_g.paused THEN
        SELECT seq INTO v_head FROM leasequeue.messages
        WHERE queue = p_queue AND group_id = p_group ORDER BY seq LIMIT 1;
        PERFORM leasequeue.announce(p_queue, v_g.priority || ':' || v_head);
    END IF;
    RETURN true;
END $$;

-- A restored pg_dump holds each queue's message sequence as the number
-- (OID) it had in the dumped database, which names another object, or
-- none, here: re-derive it from the sequence's name (register_queue's
-- 'leasequeue.seq_<id>').  Run by every install(); a no-op otherwise.
UPDATE leasequeue.queues q
SET seq_oid = to_regclass('leasequeue.seq_' || q.id)::oid
WHERE to_regclass('leasequeue.seq_' || q.id) IS NOT NULL
  AND q.seq_oid IS DISTINCT FROM to_regclass('leasequeue.seq_' || q.id)::oid;

INSERT INTO leasequeue.meta (key, value) VALUES ('schema_version', '5')
ON CONFLICT (key) DO NOTHING;
