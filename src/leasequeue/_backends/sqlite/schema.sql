-- The leasequeue schema for SQLite (schema version 5).
--
-- Loaded by leasequeue._backends.sqlite.transport: each statement below is run, in order, in the
-- one transaction that creates a new database file.  The file is marked with
-- PRAGMA application_id (the magic number) and PRAGMA user_version (the
-- schema version) in the same transaction, so a file is either a complete
-- leasequeue database or untouched.
--
-- This file is the latest schema, whole: it makes new files.  A file of an
-- older version is brought up to this one on open by the numbered files of
-- migrations/ (NNNN_name.sql upgrades version NNNN - 1 to NNNN), all in one
-- transaction.  A new column goes last, in its table here and in its
-- migration's ALTER TABLE ... ADD COLUMN alike, so that an upgraded file and
-- a new one have the same tables (tests/sqlite/test_sqlite_upgrade.py checks it).
--
-- The tables hold exactly the state of the in-memory transport
-- (src/leasequeue/_backends/inmemory/transport_py.py): messages in publish order, and per group
-- its priority, round-robin key and the lock state of its head message.

-- Each hot operation (publish, claim, ack) fires at most one trigger: a
-- trigger runs as a sub-program whose frame SQLite allocates and zeroes on
-- every firing (even when its WHEN is false), which cost more than the
-- statements themselves.  So the counters are kept by the statements that
-- change them (queries.sql), folded into a statement on lq_state that the
-- operation runs anyway where there is one (lq_lock_changed counts the locks
-- that pause, resume and a nack(0) change), and expiry is a statement the
-- claim runs only when a lock has ended.  stats() reads lq_state alone: O(1).

-- One row: what every process shares.
CREATE TABLE lq_state (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    magic     TEXT    NOT NULL,  -- 'leasequeue': a second check besides application_id
    version   INTEGER NOT NULL,  -- schema version (also in PRAGMA user_version)
    last_seq  INTEGER NOT NULL,  -- the last seq issued; seqs are never reused
    claims    INTEGER NOT NULL,  -- claim counter: the round-robin key of claimed groups
    now       REAL    NOT NULL,  -- the latest time any operation used (-Inf at first)
    messages  INTEGER NOT NULL,  -- messages held
    groups    INTEGER NOT NULL,  -- groups with messages
    leased    INTEGER NOT NULL,  -- groups whose head is leased (lock = 1)
    parked    INTEGER NOT NULL,  -- groups whose head is parked (lock = 2)
    paused    INTEGER NOT NULL   -- groups paused
);



-- One row per group that holds a message or is paused.  Only a group's head
-- (oldest) message can be leased or parked, so the lock lives here.
CREATE TABLE lq_groups (
    gid             INTEGER PRIMARY KEY,
    group_id        TEXT    NOT NULL UNIQUE,
    priority        INTEGER NOT NULL,
    -- Round-robin position: never-claimed groups first seq - 2**62, claimed
    -- groups the number of the claim that last served them.
    rr_key          INTEGER NOT NULL,
    messages        INTEGER NOT NULL,  -- messages held by the group
    head_seq        INTEGER,           -- its oldest message (NULL: none, paused)
    -- 0 free, 1 leased, 2 parked, 3 buried, 4 scheduled (version 5: the head
    -- was published with a delay and is not due; expires_at is its due time,
    -- so expiry makes it free as it ends a park, counting it as neither)
    lock            INTEGER NOT NULL,
    expires_at      REAL,              -- end of the lock; NULL when free or buried
    -- The open delivery's worker (also after its lease ran out, while nobody
    -- claimed the message since), '__parked__' while parked, the buried
    -- delivery's worker while buried, else NULL.
    holder          TEXT,
    attempt         INTEGER NOT NULL,  -- deliveries of the head message so far
    open            INTEGER NOT NULL,  -- the latest delivery is not acked/nacked
    paused          INTEGER NOT NULL,
    last_claimed_at REAL,              -- NULL: never claimed
    -- What a claim replaced, so that a claim made for a waiter that was
    -- cancelled in the meantime can be undone exactly.
    prev_rr_key     INTEGER,
    prev_claimed_at REAL,
    prev_holder     TEXT,
    -- Claimable: holds a message, nothing of it leased or parked, not paused.
    -- (head_seq, not messages: a publish into a group that holds messages
    -- changes only messages, so SQLite leaves the ready indexes alone.)
    ready           INTEGER GENERATED ALWAYS AS (head_seq IS NOT NULL AND lock = 0 AND paused = 0) VIRTUAL,
    -- Version 4: the bury reason while buried (lock = 3), else NULL.  A buried
    -- group is not ready (lock != 0) and has no lock end (expires_at NULL), so
    -- the ready and expiry indexes need no change.
    reason          TEXT
);

-- Ready groups in round-robin order: the claim with the common floor (no
-- ready group below it) is the first entry.
CREATE INDEX lq_groups_ready ON lq_groups (rr_key) WHERE ready;
-- Ready groups by priority: the lowest/highest ready priority, and for any
-- other floor a walk over the distinct priorities above it.
CREATE INDEX lq_groups_ready_by_priority ON lq_groups (priority, rr_key) WHERE ready;
-- Locked groups by the end of their lock: expiry is a range search, and
-- counts the leases and parks it ends in the entries (lock is in the entry).
CREATE INDEX lq_groups_expiry ON lq_groups (expires_at, lock) WHERE expires_at IS NOT NULL;

-- Messages, clustered by group in publish order (one B-tree: the head of a
-- group, its next message and a purge are range searches).  seq is unique,
-- increasing and never reused: it is taken from lq_state.last_seq.
CREATE TABLE lq_messages (
    gid    INTEGER NOT NULL,
    seq    INTEGER NOT NULL,
    event  BLOB,              -- the serialized event (bytes, or text for JSON)
    due_at REAL,              -- version 5: publish(delay=d)'s due time, else NULL
    key    TEXT,              -- version 5: publish(key=k)'s idempotency key, else NULL
    PRIMARY KEY (gid, seq)
) WITHOUT ROWID;

-- publish() is one INSERT into this view, run as its own write transaction
-- (SQLite takes the write lock when the statement starts, as BEGIN IMMEDIATE
-- does): the statement computes the new seq (last_seq + 1) and returns it;
-- the trigger takes it, counts the message (and the group, if it held none)
-- in, creates the group or counts the message into it, and stores the
-- message.  The group's upsert sets only messages (no index entry changes,
-- lq_acked does not fire); a paused group that held nothing gets its head
-- and round-robin key from the statement after it.
CREATE VIEW lq_publish (group_id, priority, event, seq) AS SELECT NULL, NULL, NULL, NULL;

CREATE TRIGGER lq_publish_message INSTEAD OF INSERT ON lq_publish
BEGIN
    UPDATE lq_state SET
        last_seq = new.seq,
        messages = messages + 1,
        groups = groups + NOT EXISTS (SELECT 1 FROM lq_groups WHERE group_id = new.group_id AND head_seq IS NOT NULL)
    WHERE id = 1;
    INSERT INTO lq_groups (group_id, priority, rr_key, messages, head_seq, lock, attempt, open, paused)
    VALUES (new.group_id, new.priority, new.seq - 4611686018427387904, 1, new.seq, 0, 0, 0, 0)
    ON CONFLICT (group_id) DO UPDATE SET messages = messages + 1;
    -- a group created by pause() gets its round-robin key from its first message
    UPDATE lq_groups SET
        head_seq = new.seq,
        rr_key = CASE WHEN last_claimed_at IS NULL THEN new.seq - 4611686018427387904 ELSE rr_key END
    WHERE group_id = new.group_id AND head_seq IS NULL;
    INSERT INTO lq_messages (gid, seq, event)
    VALUES ((SELECT gid FROM lq_groups WHERE group_id = new.group_id), new.seq, new.event);
END;

-- An ack moves a group's head on (only ack sets head_seq to a later message
-- or NULL): the old head message goes, it is counted out (and the group, if
-- it is left empty, and its lease, unless it had expired: an acked delivery
-- is open, so its head was leased or free, never parked), and an emptied
-- group that is not paused is forgotten (priority and round-robin position
-- go with it).
CREATE TRIGGER lq_acked AFTER UPDATE OF head_seq ON lq_groups
WHEN old.head_seq IS NOT NULL AND (new.head_seq IS NULL OR new.head_seq > old.head_seq)
BEGIN
    DELETE FROM lq_messages WHERE gid = old.gid AND seq = old.head_seq;
    UPDATE lq_state SET messages = messages - 1, groups = groups - (new.messages = 0), leased = leased - (old.lock = 1)
    WHERE id = 1;
    DELETE FROM lq_groups WHERE gid = new.gid AND new.messages = 0 AND new.paused = 0;
END;

-- A lock change made by a statement that names paused in its SET (pause,
-- resume, and nack_now with "paused = paused", so that a lone nack(0) stays
-- one statement) is counted here.  The hot statements (publish, lease, ack)
-- do not name paused, so this trigger never fires for them: they and the
-- others count leases and parks themselves (queries.sql).
CREATE TRIGGER lq_lock_changed AFTER UPDATE OF paused ON lq_groups
WHEN new.lock != old.lock
BEGIN
    UPDATE lq_state SET
        leased = leased + (new.lock = 1) - (old.lock = 1),
        parked = parked + (new.lock = 2) - (old.lock = 2)
    WHERE id = 1;
END;

INSERT INTO lq_state (id, magic, version, last_seq, claims, now, messages, groups, leased, parked, paused)
VALUES (1, 'leasequeue', 5, 0, 0, -9e999, 0, 0, 0, 0, 0);

-- Version 4: the count of buried groups (lock = 3), stats().buried, in a row of
-- its own, made last (as migration 0004 makes it): only bury, skip, resume and
-- purge change it.  Measured by callgrind (benchmarks/sqlite_callgrind.py's
-- cycle, 1 KiB pages, against 0.3's 339,383 instructions per publish +
-- claim + ack): as a seventh counter of lq_state, 349,237 (+2.9%); this
-- table made before the others (every later table's pages move), 348,069
-- (+2.6%); made here, 0.3 + 0.1% at most (`sqlite_callgrind.py compare`).
CREATE TABLE lq_quarantine (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    buried  INTEGER NOT NULL
);
INSERT INTO lq_quarantine (id, buried) VALUES (1, 0);

-- Version 5: later and once (SPEC Part 5), made last as migration 0005 makes
-- them.  Not one index on lq_messages: every index of a table costs every
-- INSERT and DELETE of it a cursor, even a partial index that skips the row
-- (about 1,300 instructions per publish by callgrind), and a plain publish
-- and ack must cost what they did.  So keys and due times are looked up and
-- counted in tables of their own, which only a keyed or delayed publish
-- writes.
--
-- Keys: one row per key a publish stored, keyed by the group's id (not its
-- row: a held key survives its group being forgotten).  The key is held
-- while its message is stored (seq, looked up through the group: O(log n))
-- or while held_until, the publish's time + the publishing transport's
-- dedup_window, is after the transport's time.  Each keyed publish forgets
-- up to 16 rows that hold nothing any more, found by check_at (first their
-- held_until); a row whose message is still stored is looked at again later,
-- each time after about twice as long (so O(log(lifetime)) looks per key).
CREATE TABLE lq_keys (
    group_id   TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    seq        INTEGER NOT NULL,  -- the message that stored it
    held_until REAL    NOT NULL,
    check_at   REAL    NOT NULL,  -- when to see whether it holds anything
    PRIMARY KEY (group_id, key)
) WITHOUT ROWID;
CREATE INDEX lq_keys_check_at ON lq_keys (check_at);
-- Messages published with a delay whose due time may not have passed:
-- stats().scheduled counts the rows with due_at >= the transport's time, a
-- range of lq_due_at, O(log n + scheduled).  Written by a delayed publish;
-- skip and purge delete the rows of the messages they remove; the rows whose
-- due time has passed count for nothing and are deleted by stats() and by
-- each delayed publish (an acked message was claimed, so its due time had
-- passed: an ack never leaves a row that counts).
CREATE TABLE lq_due (
    seq    INTEGER PRIMARY KEY,  -- the message (seqs are never reused)
    due_at REAL    NOT NULL
);
CREATE INDEX lq_due_at ON lq_due (due_at);
