-- The statements of leasequeue._sqlite, each under a "-- name: NAME --" header
-- followed by a one-line description.  Parameters are numbered (?1, ?2, ...)
-- and bound from tuples.  Every statement runs inside the BEGIN IMMEDIATE
-- transaction of one transport operation (see _sqlite.py), except the reads
-- marked "read only".  No statement uses RETURNING: with this SQLite it costs
-- more than a second statement.
--
-- Much of the work happens in the triggers of schema.sql: a publish is one
-- INSERT into the lq_publish view; use_time applies expiry; an
-- ack that moves a group's head on deletes the old head; an emptied group is
-- forgotten; the counters of lq_state follow the rows.
--
-- "The lease is current" is always the same five tests: the group's delivery
-- is open, of that attempt, of its head message, to that worker, and the
-- group is the lease's group (it is looked up by group_id).

-- name: publish --
-- Publish one message (?1 group, ?2 priority if the group is new, ?3 serialized event).
INSERT INTO lq_publish (group_id, priority, event) VALUES (?1, ?2, ?3);

-- name: create_batch_table --
-- Per connection: where publish_many stages its items (numbered in item order).
CREATE TEMP TABLE IF NOT EXISTS lq_batch (
    n        INTEGER PRIMARY KEY,
    group_id TEXT    NOT NULL,
    priority INTEGER NOT NULL,
    event    BLOB
);

-- name: batch_add --
-- Stage one item of publish_many.
INSERT INTO temp.lq_batch (group_id, priority, event) VALUES (?1, ?2, ?3);

-- name: batch_take_seqs --
-- Take one seq per staged item.
UPDATE lq_state SET last_seq = last_seq + (SELECT count(*) FROM temp.lq_batch);

-- name: batch_groups --
-- Create the batch's new groups (priority and round-robin key of their first item;
-- ?1 = the seq before the batch) and count the messages into existing ones.
INSERT INTO lq_groups (group_id, priority, rr_key, messages, head_seq, lock, attempt, open, paused)
SELECT group_id, priority, ?1 + min(n) - 4611686018427387904, count(*), ?1 + min(n), 0, 0, 0, 0
FROM temp.lq_batch GROUP BY group_id ORDER BY min(n)
ON CONFLICT (group_id) DO UPDATE SET
    messages = messages + excluded.messages,
    head_seq = coalesce(head_seq, excluded.head_seq),
    rr_key = CASE WHEN messages = 0 AND last_claimed_at IS NULL THEN excluded.rr_key ELSE rr_key END;

-- name: batch_messages --
-- Store the staged messages with their seqs (?1 = the seq before the batch).
INSERT INTO lq_messages (gid, seq, event)
SELECT g.gid, ?1 + b.n, b.event FROM temp.lq_batch AS b JOIN lq_groups AS g USING (group_id);

-- name: batch_clear --
-- Empty the staging table.
DELETE FROM temp.lq_batch;

-- name: last_seq --
-- The last seq taken (the one a publish just took, inside its transaction).
SELECT last_seq FROM lq_state;

-- name: group_state --
-- Is the group claimable now, and at which priority (for waking waiting claims)?
SELECT messages, ready, priority FROM lq_groups WHERE group_id = ?1;

-- name: use_time --
-- The operation's now: never before a time already used; the trigger applies expiry at it.
UPDATE lq_state SET now = max(now, ?1), expired = max(now, ?1);

-- name: use_time_and_claims --
-- As use_time, and take ?2 claim numbers (round-robin keys).
UPDATE lq_state SET now = max(now, ?1), expired = max(now, ?1), claims = claims + ?2;

-- name: take_claims --
-- Take ?1 claim numbers (round-robin keys) for claim_many.
UPDATE lq_state SET claims = claims + ?1;

-- name: use_time_only --
-- The operation's now, without applying expiry (extend, nack with a delay).
UPDATE lq_state SET now = max(now, ?1);

-- name: now --
-- The transport's time (after use_time).
SELECT now, claims FROM lq_state;

-- name: find_claimable --
-- The head of the ready group claimed least recently among priorities >= ?1, with
-- the transport's time and claim counter.  With the common floor (no ready group
-- below it) that is the first entry of lq_groups_ready; otherwise a walk over the
-- distinct ready priorities >= ?1 takes each level's first group.
SELECT g.gid, g.group_id, g.head_seq, g.attempt + 1, g.priority, m.event, s.now, s.claims
FROM lq_state AS s, lq_groups AS g
JOIN lq_messages AS m ON m.gid = g.gid AND m.seq = g.head_seq
WHERE g.gid = (
    SELECT CASE
        WHEN ?1 <= (SELECT min(priority) FROM lq_groups WHERE ready)
        THEN (SELECT gid FROM lq_groups WHERE ready ORDER BY rr_key LIMIT 1)
        ELSE (
            WITH RECURSIVE level (p) AS (
                SELECT (SELECT min(priority) FROM lq_groups WHERE ready AND priority >= ?1)
                UNION ALL
                SELECT (SELECT min(priority) FROM lq_groups WHERE ready AND priority > level.p)
                FROM level WHERE level.p IS NOT NULL
            )
            SELECT first.gid FROM level
            JOIN lq_groups AS first ON first.gid = (
                SELECT gid FROM lq_groups WHERE ready AND priority = level.p ORDER BY rr_key LIMIT 1)
            ORDER BY first.rr_key LIMIT 1)
    END);

-- name: find_claimable_many --
-- The heads that ?2 successive claims with floor ?1 would take (claiming a group
-- does not change which other groups are eligible): the first ?2 ready groups in
-- round-robin order among priorities >= ?1, in that order.  With the common floor
-- the first ?2 entries of lq_groups_ready; otherwise the first ?2 of each distinct
-- ready priority >= ?1, merged.
WITH RECURSIVE level (p) AS (
    SELECT (SELECT min(priority) FROM lq_groups WHERE ready AND priority >= ?1)
    WHERE ?1 > (SELECT min(priority) FROM lq_groups WHERE ready)
    UNION ALL
    SELECT (SELECT min(priority) FROM lq_groups WHERE ready AND priority > level.p)
    FROM level WHERE level.p IS NOT NULL
),
picked (gid) AS (
    SELECT gid FROM (
        SELECT gid FROM lq_groups
        WHERE ready AND ?1 <= (SELECT min(priority) FROM lq_groups WHERE ready)
        ORDER BY rr_key LIMIT ?2)
    UNION ALL
    SELECT first.gid FROM level
    JOIN lq_groups AS first ON first.gid IN (
        SELECT gid FROM lq_groups WHERE ready AND priority = level.p ORDER BY rr_key LIMIT ?2)
)
SELECT g.gid, g.group_id, g.head_seq, g.attempt + 1, g.priority, m.event
FROM picked
JOIN lq_groups AS g ON g.gid = picked.gid
JOIN lq_messages AS m ON m.gid = g.gid AND m.seq = g.head_seq
ORDER BY g.rr_key LIMIT ?2;

-- name: lease --
-- Lease group ?1's head to worker ?2 until ?3 with round-robin key ?4 at time ?5,
-- remembering what it replaces (for unclaim).
UPDATE lq_groups SET
    lock = 1, expires_at = ?3, holder = ?2, attempt = attempt + 1, open = 1,
    prev_rr_key = rr_key, prev_claimed_at = last_claimed_at,
    prev_holder = CASE WHEN open THEN holder END,
    rr_key = ?4, last_claimed_at = ?5
WHERE gid = ?1;

-- name: unclaim --
-- Undo a claim whose lease (?1 group, ?2 attempt, ?3 seq, ?4 worker) is current and nobody received.
UPDATE lq_groups SET
    lock = 0, expires_at = NULL, attempt = attempt - 1,
    rr_key = prev_rr_key, last_claimed_at = prev_claimed_at,
    holder = prev_holder, open = (prev_holder IS NOT NULL)
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4;

-- name: ack --
-- Close the current delivery (?1 group, ?2 attempt, ?3 seq, ?4 worker) and move the head
-- on (the triggers delete the old head, and forget an emptied group).
UPDATE lq_groups SET
    messages = messages - 1, lock = 0, expires_at = NULL, holder = NULL, attempt = 0, open = 0,
    head_seq = (SELECT min(seq) FROM lq_messages AS m WHERE m.gid = lq_groups.gid AND m.seq > lq_groups.head_seq)
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4;

-- name: nack_now --
-- Close the current delivery (?1 group, ?2 attempt, ?3 seq, ?4 worker): its message is free now.
UPDATE lq_groups SET lock = 0, expires_at = NULL, holder = NULL, open = 0
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4;

-- name: park --
-- Close the current delivery (?1 group, ?2 attempt, ?3 seq, ?4 worker) and park its
-- message for ?5 seconds from the transport's time.
UPDATE lq_groups SET lock = 2, expires_at = (SELECT now FROM lq_state) + ?5, holder = '__parked__', open = 0
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4;

-- name: extend --
-- Lease the current delivery's message (?1 group, ?2 attempt, ?3 seq, ?4 worker) again until ?5.
UPDATE lq_groups SET lock = 1, expires_at = ?5
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4;

-- name: counts --
-- stats(): messages, groups, leased, parked, paused.
SELECT messages, groups, leased, parked, paused FROM lq_state;

-- name: count_messages --
-- len() (read only).
SELECT messages FROM lq_state;

-- name: top_ready_priority --
-- The highest priority among ready groups (NULL: none): can a waiting claim's floor be met?
SELECT max(priority) FROM lq_groups WHERE ready;

-- name: next_expiry --
-- The earliest lock end (read only; the watcher applies expiry when it is due).
SELECT min(expires_at) FROM lq_groups WHERE expires_at IS NOT NULL;

-- name: find_group --
-- One group's control state, by group_id.
SELECT gid, paused, lock, messages FROM lq_groups WHERE group_id = ?1;

-- name: pause_new --
-- Record a pause for a group that holds nothing yet (its first message sets its round-robin key).
INSERT INTO lq_groups (group_id, priority, rr_key, messages, head_seq, lock, attempt, open, paused)
VALUES (?1, 0, 0, 0, NULL, 0, 0, 0, 1);

-- name: pause --
-- Pause an existing group.
UPDATE lq_groups SET paused = 1 WHERE gid = ?1;

-- name: resume --
-- Lift a pause and end a park (the parked message is claimable now, attempt unchanged);
-- the trigger forgets the group if it holds nothing.
UPDATE lq_groups SET
    paused = 0,
    expires_at = CASE WHEN lock = 2 THEN NULL ELSE expires_at END,
    holder = CASE WHEN lock = 2 THEN NULL ELSE holder END,
    lock = CASE WHEN lock = 2 THEN 0 ELSE lock END
WHERE gid = ?1;

-- name: purge_messages --
-- Remove every message of a group.
DELETE FROM lq_messages WHERE gid = ?1;

-- name: forget_group --
-- Drop a group row.
DELETE FROM lq_groups WHERE gid = ?1;

-- name: set_priority --
-- Change a live group's priority; its round-robin position is kept.
UPDATE lq_groups SET priority = ?2 WHERE group_id = ?1;

-- name: group_info --
-- What group() reports.
SELECT group_id, priority, messages, lock, paused, head_seq, holder, expires_at, attempt, last_claimed_at
FROM lq_groups WHERE group_id = ?1;

-- name: groups_info --
-- What groups() reports: every group, in creation order.  gid is the row id,
-- which SQLite makes larger than every row present, so a re-created group
-- goes to the end.
SELECT group_id, priority, messages, lock, paused, head_seq, holder, expires_at, attempt, last_claimed_at
FROM lq_groups ORDER BY gid;
