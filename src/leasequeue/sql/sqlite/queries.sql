-- The statements of leasequeue._sqlite, each under a "-- name: NAME --" header
-- followed by a one-line description.  Parameters are numbered (?1, ?2, ...)
-- and bound from tuples.  Every statement runs inside the BEGIN IMMEDIATE
-- transaction of one transport operation (see _sqlite.py), except the reads
-- marked "read only".
--
-- "The lease is current" is always the same five tests: the group's delivery
-- is open, of that attempt, of its head message, to that worker, and the
-- group is the lease's group (it is looked up by group_id).

-- name: next_seqs --
-- Take ?1 sequence numbers; returns the last one taken.
UPDATE lq_state SET last_seq = last_seq + ?1 RETURNING last_seq;

-- name: add_to_group --
-- Publish into a group: create it (never claimed, its priority), or count the message in.
INSERT INTO lq_groups (group_id, priority, rr_key, messages, head_seq, lock, attempt, open, paused)
VALUES (?1, ?2, ?3 - 4611686018427387904, 1, ?3, 0, 0, 0, 0)
ON CONFLICT (group_id) DO UPDATE SET
    messages = messages + 1,
    head_seq = coalesce(head_seq, excluded.head_seq),
    -- a group created by pause() gets its round-robin key from its first message
    rr_key = CASE WHEN messages = 0 AND last_claimed_at IS NULL THEN excluded.rr_key ELSE rr_key END
RETURNING gid, messages, ready, priority;

-- name: add_message --
-- Store one message.
INSERT INTO lq_messages (seq, gid, event) VALUES (?1, ?2, ?3);

-- name: use_time --
-- The operation's now: never before a time already used; also the earliest lock end.
UPDATE lq_state SET now = max(now, ?1)
RETURNING now, (SELECT min(expires_at) FROM lq_groups WHERE expires_at IS NOT NULL);

-- name: use_time_and_claims --
-- As use_time, and take ?2 claim numbers (round-robin keys); returns the last one taken.
UPDATE lq_state SET now = max(now, ?1), claims = claims + ?2
RETURNING now, (SELECT min(expires_at) FROM lq_groups WHERE expires_at IS NOT NULL), claims;

-- name: expire --
-- Free every lease or park that ended before ?1 (strictly); an open delivery stays current.
UPDATE lq_groups SET lock = 0, expires_at = NULL, holder = CASE WHEN open THEN holder END
WHERE expires_at < ?1
RETURNING gid, priority, ready;

-- name: claim --
-- Lease the head of the ready group claimed least recently among priorities >= ?5
-- to worker ?1 until ?2, with round-robin key ?3 at time ?4.  With the common floor
-- (no ready group below it) that is the first entry of lq_groups_ready; otherwise
-- a walk over the distinct ready priorities >= ?5 takes each level's first group.
UPDATE lq_groups SET
    lock = 1, expires_at = ?2, holder = ?1, attempt = attempt + 1, open = 1,
    prev_rr_key = rr_key, prev_claimed_at = last_claimed_at,
    prev_holder = CASE WHEN open THEN holder END,
    rr_key = ?3, last_claimed_at = ?4
WHERE gid = (
    SELECT CASE
        WHEN ?5 <= (SELECT min(priority) FROM lq_groups WHERE ready)
        THEN (SELECT gid FROM lq_groups WHERE ready ORDER BY rr_key LIMIT 1)
        ELSE (
            WITH RECURSIVE level (p) AS (
                SELECT (SELECT min(priority) FROM lq_groups WHERE ready AND priority >= ?5)
                UNION ALL
                SELECT (SELECT min(priority) FROM lq_groups WHERE ready AND priority > level.p)
                FROM level WHERE level.p IS NOT NULL
            )
            SELECT first.gid FROM level
            JOIN lq_groups AS first ON first.gid = (
                SELECT gid FROM lq_groups WHERE ready AND priority = level.p ORDER BY rr_key LIMIT 1)
            ORDER BY first.rr_key LIMIT 1)
    END)
RETURNING gid, group_id, head_seq, attempt, priority,
          (SELECT event FROM lq_messages WHERE seq = head_seq);

-- name: unclaim --
-- Undo a claim whose lease (?1 group, ?2 attempt, ?3 seq, ?4 worker) is current and nobody received.
UPDATE lq_groups SET
    lock = 0, expires_at = NULL, attempt = attempt - 1,
    rr_key = prev_rr_key, last_claimed_at = prev_claimed_at,
    holder = prev_holder, open = (prev_holder IS NOT NULL)
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4
RETURNING priority, ready;

-- name: ack --
-- Close the current delivery (?1 group, ?2 attempt, ?3 seq, ?4 worker) and move the head on.
UPDATE lq_groups SET
    messages = messages - 1, lock = 0, expires_at = NULL, holder = NULL, attempt = 0, open = 0,
    head_seq = (SELECT min(seq) FROM lq_messages AS m WHERE m.gid = lq_groups.gid AND m.seq > lq_groups.head_seq)
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4
RETURNING gid, messages, paused, priority, ready;

-- name: delete_message --
-- Remove one message.
DELETE FROM lq_messages WHERE seq = ?1;

-- name: forget_group --
-- Drop an emptied group: its priority and round-robin position go with it.
DELETE FROM lq_groups WHERE gid = ?1;

-- name: nack_now --
-- Close the current delivery (?1 group, ?2 attempt, ?3 seq, ?4 worker): its message is free now.
UPDATE lq_groups SET lock = 0, expires_at = NULL, holder = NULL, open = 0
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4
RETURNING priority, ready;

-- name: park --
-- Close the current delivery (?1 group, ?2 attempt, ?3 seq, ?4 worker) and park its message until ?5.
UPDATE lq_groups SET lock = 2, expires_at = ?5, holder = '__parked__', open = 0
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4
RETURNING gid;

-- name: extend --
-- Lease the current delivery's message (?1 group, ?2 attempt, ?3 seq, ?4 worker) again until ?5.
UPDATE lq_groups SET lock = 1, expires_at = ?5
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4
RETURNING gid;

-- name: counts --
-- stats(): messages, groups, leased, parked, paused.
SELECT messages, groups, leased, parked, paused FROM lq_state;

-- name: count_messages --
-- len() (read only).
SELECT messages FROM lq_state;

-- name: top_ready_priority --
-- The highest priority among ready groups (NULL: none): can a waiter's floor be met?
SELECT max(priority) FROM lq_groups WHERE ready;

-- name: next_expiry --
-- The earliest lock end (read only; the waiting layer sleeps until it).
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
-- Lift a pause and end a park (the parked message is claimable now, attempt unchanged).
UPDATE lq_groups SET
    paused = 0,
    expires_at = CASE WHEN lock = 2 THEN NULL ELSE expires_at END,
    holder = CASE WHEN lock = 2 THEN NULL ELSE holder END,
    lock = CASE WHEN lock = 2 THEN 0 ELSE lock END
WHERE gid = ?1
RETURNING messages, priority, ready;

-- name: purge_messages --
-- Remove every message of a group.
DELETE FROM lq_messages WHERE gid = ?1;

-- name: set_priority --
-- Change a live group's priority; its round-robin position is kept.
UPDATE lq_groups SET priority = ?2 WHERE group_id = ?1 RETURNING ready;

-- name: group_info --
-- What group() reports.
SELECT group_id, priority, messages, lock, paused, head_seq, holder, expires_at, attempt, last_claimed_at
FROM lq_groups WHERE group_id = ?1;

-- name: groups_info --
-- What groups() reports: every group, by group_id.
SELECT group_id, priority, messages, lock, paused, head_seq, holder, expires_at, attempt, last_claimed_at
FROM lq_groups ORDER BY group_id;
