-- The leasequeue schema for SQLite (schema version 1).
--
-- Loaded by leasequeue._sqlite: each statement below is run, in order, in the
-- one transaction that creates a new database file.  The file is marked with
-- PRAGMA application_id (the magic number) and PRAGMA user_version (the
-- schema version) in the same transaction, so a file is either a complete
-- leasequeue database or untouched.
--
-- The tables hold exactly the state of the in-memory transport
-- (src/leasequeue/_inmemory_py.py): messages in publish order, and per group
-- its priority, round-robin key and the lock state of its head message.

-- One row: the counters every process shares.
CREATE TABLE lq_state (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    magic     TEXT    NOT NULL,  -- 'leasequeue': a second check besides application_id
    version   INTEGER NOT NULL,  -- schema version (also in PRAGMA user_version)
    last_seq  INTEGER NOT NULL,  -- the last seq issued; seqs are never reused
    claims    INTEGER NOT NULL,  -- claim counter: the round-robin key of claimed groups
    now       REAL    NOT NULL,  -- the latest time any operation used (-Inf at first)
    expired   REAL    NOT NULL,  -- the time expiry was last applied at (by claim, stats, group(s))
    messages  INTEGER NOT NULL,  -- messages held        (kept by the triggers below)
    groups    INTEGER NOT NULL,  -- groups with messages (kept by the triggers below)
    leased    INTEGER NOT NULL,  -- groups whose head is leased
    parked    INTEGER NOT NULL,  -- groups whose head is parked
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
    lock            INTEGER NOT NULL,  -- 0 free, 1 leased, 2 parked
    expires_at      REAL,              -- end of the lock; NULL when free
    -- The open delivery's worker (also after its lease ran out, while nobody
    -- claimed the message since), '__parked__' while parked, else NULL.
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
    ready           INTEGER GENERATED ALWAYS AS (messages > 0 AND lock = 0 AND paused = 0) VIRTUAL
);

-- Ready groups in round-robin order: the claim with the common floor (no
-- ready group below it) is the first entry.
CREATE INDEX lq_groups_ready ON lq_groups (rr_key) WHERE ready;
-- Ready groups by priority: the lowest/highest ready priority, and for any
-- other floor a walk over the distinct priorities above it.
CREATE INDEX lq_groups_ready_by_priority ON lq_groups (priority, rr_key) WHERE ready;
-- Locked groups by the end of their lock: expiry is a range search.
CREATE INDEX lq_groups_expiry ON lq_groups (expires_at) WHERE expires_at IS NOT NULL;

-- Messages, clustered by group in publish order (one B-tree: the head of a
-- group, its next message and a purge are range searches).  seq is unique,
-- increasing and never reused: it is taken from lq_state.last_seq.
CREATE TABLE lq_messages (
    gid   INTEGER NOT NULL,
    seq   INTEGER NOT NULL,
    event BLOB,               -- the serialized event (bytes, or text for JSON)
    PRIMARY KEY (gid, seq)
) WITHOUT ROWID;

-- publish() is one INSERT into this view: the trigger takes the next seq,
-- creates the group or counts the message in, and stores the message.
CREATE VIEW lq_publish (group_id, priority, event) AS SELECT NULL, NULL, NULL;

CREATE TRIGGER lq_publish_message INSTEAD OF INSERT ON lq_publish
BEGIN
    UPDATE lq_state SET last_seq = last_seq + 1;
    INSERT INTO lq_groups (group_id, priority, rr_key, messages, head_seq, lock, attempt, open, paused)
    VALUES (new.group_id, new.priority, (SELECT last_seq FROM lq_state) - 4611686018427387904, 1,
            (SELECT last_seq FROM lq_state), 0, 0, 0, 0)
    ON CONFLICT (group_id) DO UPDATE SET
        messages = messages + 1,
        head_seq = coalesce(head_seq, excluded.head_seq),
        -- a group created by pause() gets its round-robin key from its first message
        rr_key = CASE WHEN messages = 0 AND last_claimed_at IS NULL THEN excluded.rr_key ELSE rr_key END;
    INSERT INTO lq_messages (gid, seq, event)
    VALUES ((SELECT gid FROM lq_groups WHERE group_id = new.group_id), (SELECT last_seq FROM lq_state), new.event);
END;

-- Expiry: when an operation that applies expiry (claim, stats, group, groups,
-- claim_many) moves lq_state.expired forward, every lease or park that ended
-- before it (strictly) is freed; an open delivery stays current.  So no lock
-- ever has expires_at < lq_state.expired.  (extend and nack with a delay move
-- only lq_state.now, as the in-memory transports apply no expiry there.)
CREATE TRIGGER lq_expiry AFTER UPDATE OF expired ON lq_state WHEN new.expired > old.expired
BEGIN
    UPDATE lq_groups SET lock = 0, expires_at = NULL, holder = CASE WHEN open THEN holder END
    WHERE expires_at < new.expired;
END;

-- An ack moves a group's head on: the old head message goes.
CREATE TRIGGER lq_head_done AFTER UPDATE OF head_seq ON lq_groups
WHEN old.head_seq IS NOT NULL AND (new.head_seq IS NULL OR new.head_seq > old.head_seq)
BEGIN
    DELETE FROM lq_messages WHERE gid = old.gid AND seq = old.head_seq;
END;

-- A group left with no message and no pause is forgotten (priority and
-- round-robin position go with it).
CREATE TRIGGER lq_group_emptied AFTER UPDATE OF messages, paused ON lq_groups
WHEN new.messages = 0 AND new.paused = 0
BEGIN
    DELETE FROM lq_groups WHERE gid = new.gid;
END;

-- The counters of lq_state follow the rows, whatever statement changed them.
CREATE TRIGGER lq_messages_added AFTER INSERT ON lq_messages
BEGIN
    UPDATE lq_state SET messages = messages + 1;
END;

CREATE TRIGGER lq_messages_removed AFTER DELETE ON lq_messages
BEGIN
    UPDATE lq_state SET messages = messages - 1;
END;

CREATE TRIGGER lq_groups_added AFTER INSERT ON lq_groups
BEGIN
    UPDATE lq_state SET
        groups = groups + (new.messages > 0),
        leased = leased + (new.lock = 1),
        parked = parked + (new.lock = 2),
        paused = paused + new.paused;
END;

CREATE TRIGGER lq_groups_removed AFTER DELETE ON lq_groups
BEGIN
    UPDATE lq_state SET
        groups = groups - (old.messages > 0),
        leased = leased - (old.lock = 1),
        parked = parked - (old.lock = 2),
        paused = paused - old.paused;
END;

CREATE TRIGGER lq_groups_changed AFTER UPDATE OF messages, lock, paused ON lq_groups
WHEN (new.messages > 0) != (old.messages > 0) OR new.lock != old.lock OR new.paused != old.paused
BEGIN
    UPDATE lq_state SET
        groups = groups + (new.messages > 0) - (old.messages > 0),
        leased = leased + (new.lock = 1) - (old.lock = 1),
        parked = parked + (new.lock = 2) - (old.lock = 2),
        paused = paused + new.paused - old.paused;
END;

INSERT INTO lq_state (id, magic, version, last_seq, claims, now, expired, messages, groups, leased, parked, paused)
VALUES (1, 'leasequeue', 1, 0, 0, -9e999, -9e999, 0, 0, 0, 0, 0);
