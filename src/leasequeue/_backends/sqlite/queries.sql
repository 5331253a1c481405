-- The statements of leasequeue._backends.sqlite.transport, each under a "-- name: NAME --" header
-- followed by a one-line description.  Parameters are numbered (?1, ?2, ...)
-- and bound from tuples.  Every statement runs inside the BEGIN IMMEDIATE
-- transaction of one transport operation (see transport.py), except the reads
-- marked "read only" and the statements marked "one statement" (run alone
-- when no claim waits in the process: SQLite makes a lone write statement one
-- transaction, taking the write lock as it starts, which saves the BEGIN and
-- COMMIT calls).  Only publish uses RETURNING (its seq), which lets it be one
-- statement: with this SQLite, RETURNING (a special trigger whose rows go
-- through an ephemeral table) costs more than a second statement inside a transaction, less than
-- BEGIN + a second statement + COMMIT.  (A claim as one UPDATE ... RETURNING
-- was measured and not kept: +22k instructions per cycle, see docs/sqlite.md.)
--
-- Two triggers of schema.sql do part of the work: a publish is one INSERT
-- into the lq_publish view; an ack that moves a group's head on deletes the
-- old head, counts it (and its lease) out and forgets an emptied group.  Every
-- other counter of lq_state is kept by the statements below that change it:
-- the counts of leases and parks by a statement on lq_state that the
-- operation runs anyway where it has one (claimed, take_claims,
-- use_time_and_expire, park_time, extend_time, count_purged), else by one just
-- before the statement that changes the lock (unclaim_count), or by the trigger
-- lq_lock_changed, which fires for the statements that name paused (pause,
-- resume, nack_now).  stats() reads lq_state alone.
--
-- "The lease is current" is always the same six tests: the group's delivery
-- is open, of that attempt, of its head message, to that worker, the group is
-- the lease's group (it is looked up by group_id), and, for a lease the
-- transport issued (?5 not NULL), the delivery is the lease's: a claim's
-- number, which the group's round-robin key rr_key is from that claim on
-- (fencing by delivery, docs/decisions.md "Honest attempts": no released,
-- nacked or retried delivery is current again, whatever its attempt).  A lease
-- built by hand (?5 NULL) is matched by its fields alone.

-- name: publish --
-- One statement: publish one message (?1 group, ?2 priority if the group is new,
-- ?3 serialized event) and return its seq (the trigger lq_publish_message does the work).
INSERT INTO lq_publish (group_id, priority, event, seq)
VALUES (?1, ?2, ?3, (SELECT last_seq + 1 FROM lq_state WHERE id = 1))
RETURNING seq;

-- name: create_batch_table --
-- Per connection: where publish_many stages its items (numbered in item order).
CREATE TEMP TABLE IF NOT EXISTS lq_batch (
    n        INTEGER PRIMARY KEY,
    group_id TEXT    NOT NULL,
    priority INTEGER NOT NULL,
    event    BLOB,
    key      TEXT
);

-- name: batch_add --
-- Stage one item of publish_many (?4: its key, or NULL).
INSERT INTO temp.lq_batch (group_id, priority, event, key) VALUES (?1, ?2, ?3, ?4);

-- name: batch_take_seqs --
-- Take one seq per staged item, and count the items in (and the groups that held none).
UPDATE lq_state SET
    last_seq = last_seq + (SELECT count(*) FROM temp.lq_batch),
    messages = messages + (SELECT count(*) FROM temp.lq_batch),
    groups = groups + (
        SELECT count(DISTINCT b.group_id) FROM temp.lq_batch AS b
        WHERE NOT EXISTS (SELECT 1 FROM lq_groups AS g WHERE g.group_id = b.group_id AND g.head_seq IS NOT NULL))
WHERE id = 1;

-- name: batch_groups --
-- Create the batch's new groups (priority and round-robin key of their first item;
-- ?1 = the seq before the batch) and count the messages into existing ones (only
-- messages changes there: no index entry moves, lq_acked does not fire).
INSERT INTO lq_groups (group_id, priority, rr_key, messages, head_seq, lock, attempt, open, paused)
SELECT group_id, priority, ?1 + min(n) - 4611686018427387904, count(*), ?1 + min(n), 0, 0, 0, 0
FROM temp.lq_batch GROUP BY group_id ORDER BY min(n)
ON CONFLICT (group_id) DO UPDATE SET messages = messages + excluded.messages;

-- name: batch_heads --
-- After batch_groups: the batch's paused groups that held nothing get their head (and,
-- never claimed, their round-robin key) from their first item (?1 = the seq before the batch).
UPDATE lq_groups SET
    head_seq = ?1 + (SELECT min(n) FROM temp.lq_batch AS b WHERE b.group_id = lq_groups.group_id),
    rr_key = CASE WHEN last_claimed_at IS NULL
             THEN ?1 + (SELECT min(n) FROM temp.lq_batch AS b WHERE b.group_id = lq_groups.group_id) - 4611686018427387904
             ELSE rr_key END
WHERE head_seq IS NULL AND group_id IN (SELECT group_id FROM temp.lq_batch);

-- name: batch_messages --
-- Store the staged messages with their seqs (?1 = the seq before the batch), due time
-- ?2 (NULL: no delay) and keys.
INSERT INTO lq_messages (gid, seq, event, due_at, key)
SELECT g.gid, ?1 + b.n, b.event, ?2, b.key FROM temp.lq_batch AS b JOIN lq_groups AS g USING (group_id);

-- name: batch_clear --
-- Empty the staging table.
DELETE FROM temp.lq_batch;

-- name: last_seq --
-- The last seq taken (the one a publish just took, inside its transaction).
SELECT last_seq FROM lq_state WHERE id = 1;

-- name: group_state --
-- Is the group claimable now, and at which priority (for waking waiting claims)?
SELECT messages, ready, priority FROM lq_groups WHERE group_id = ?1;

-- name: use_time --
-- The operation's now: never before a time already used (a claim that found nothing).
UPDATE lq_state SET now = max(now, ?1) WHERE id = 1;

-- name: use_time_and_expire --
-- As use_time, and count out the leases and parks that ended before that time
-- (strictly): the statement expire, run next, frees them.  Range searches of the
-- expiry index (its entries only), O(log G + expired).
UPDATE lq_state SET
    now = max(now, ?1),
    leased = leased - (SELECT count(*) FROM lq_groups WHERE expires_at < max(lq_state.now, ?1) AND lock = 1),
    parked = parked - (SELECT count(*) FROM lq_groups WHERE expires_at < max(lq_state.now, ?1) AND lock = 2)
WHERE id = 1;

-- name: claimed --
-- A claim leased a group's head at time ?1: the time used, one claim number (the
-- round-robin key find_claimable handed out) taken, one lease counted in.
UPDATE lq_state SET now = max(now, ?1), claims = claims + 1, leased = leased + 1 WHERE id = 1;

-- name: expire --
-- Expiry at the transport's time: free every lease or park that ended before it
-- (strictly); an open delivery stays current.  Only after use_time_and_expire,
-- which counted them out.
UPDATE lq_groups SET lock = 0, expires_at = NULL, holder = CASE WHEN open THEN holder END
WHERE expires_at < (SELECT now FROM lq_state WHERE id = 1);

-- name: take_claims --
-- Take ?1 claim numbers (round-robin keys) for claim_many, and count its ?1 leases in.
UPDATE lq_state SET claims = claims + ?1, leased = leased + ?1 WHERE id = 1;

-- name: now --
-- The transport's time (after use_time).
SELECT now, claims FROM lq_state WHERE id = 1;

-- name: find_claimable --
-- Always one row: the transport's time if it moves to the clock's ?2, the claim's
-- round-robin key (the next claim number: the statement claimed takes it), the
-- earliest lock end (expiry is due if it is before the time), then the head of the ready group claimed
-- least recently among priorities >= ?1 (NULLs if none).  With the common floor (no
-- ready group below it) that is the first entry of lq_groups_ready; otherwise a walk
-- over the distinct ready priorities >= ?1 takes each level's first group.
SELECT max(s.now, ?2), s.claims + 1, (SELECT min(expires_at) FROM lq_groups WHERE expires_at IS NOT NULL),
       g.gid, g.group_id, g.head_seq, g.attempt + 1, g.priority, m.event
FROM lq_state AS s
LEFT JOIN lq_groups AS g ON g.gid = (
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
    END)
LEFT JOIN lq_messages AS m ON m.gid = g.gid AND m.seq = g.head_seq
WHERE s.id = 1;

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

-- name: unclaim_count --
-- Before unclaim (same parameters): count its lease out if it is current and held.
UPDATE lq_state SET leased = leased - (
    SELECT count(*) FROM lq_groups
    WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5) AND lock = 1)
WHERE id = 1;

-- name: unclaim --
-- Undo a claim whose lease (?1 group, ?2 attempt, ?3 seq, ?4 worker, ?5 delivery) is current and nobody received.
UPDATE lq_groups SET
    lock = 0, expires_at = NULL, attempt = attempt - 1,
    rr_key = prev_rr_key, last_claimed_at = prev_claimed_at,
    holder = prev_holder, open = (prev_holder IS NOT NULL)
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5);

-- name: ack --
-- One statement: close the current delivery (?1 group, ?2 attempt, ?3 seq, ?4 worker,
-- ?5 delivery) and move the head on (the trigger lq_acked deletes the old head, counts
-- it out, and forgets an emptied group).  The next head is free, or scheduled (lock 4
-- until its due time) if it was published with a delay and is not due at the
-- transport's time: one lookup of the next message reads both (the aggregate always
-- gives one row; its bare columns are the min(seq) row's; the transport's time is
-- read only for a message with a due time).
UPDATE lq_groups SET
    messages = messages - 1, holder = NULL, attempt = 0, open = 0,
    (head_seq, lock, expires_at) = (
        SELECT min(m.seq),
               CASE WHEN m.due_at IS NULL THEN 0 WHEN m.due_at >= (SELECT now FROM lq_state WHERE id = 1) THEN 4 ELSE 0 END,
               CASE WHEN m.due_at IS NOT NULL AND m.due_at >= (SELECT now FROM lq_state WHERE id = 1) THEN m.due_at END
        FROM lq_messages AS m WHERE m.gid = lq_groups.gid AND m.seq > lq_groups.head_seq)
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5);

-- name: nack_now --
-- One statement: close the current delivery (?1 group, ?2 attempt, ?3 seq, ?4 worker,
-- ?5 delivery): its message is free now.  "paused = paused" fires lq_lock_changed, which counts the
-- lease out (unless it had expired).
UPDATE lq_groups SET lock = 0, expires_at = NULL, holder = NULL, open = 0, paused = paused
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5);

-- name: park_time --
-- Before park (?1-?5 its lease): the time used is ?6 (never back); the lease, if
-- current and held, is counted out and the park in (the operation rolls back if
-- park finds the lease not current).
UPDATE lq_state SET
    now = max(now, ?6),
    leased = leased - (
        SELECT count(*) FROM lq_groups
        WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5) AND lock = 1),
    parked = parked + 1
WHERE id = 1;

-- name: park --
-- Close the current delivery (?1 group, ?2 attempt, ?3 seq, ?4 worker, ?5 delivery) and
-- park its message for ?6 seconds from the transport's time.
UPDATE lq_groups SET lock = 2, expires_at = (SELECT now FROM lq_state) + ?6, holder = '__parked__', open = 0
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5);

-- name: extend_time --
-- Before extend (?1-?5 its lease): the time used is ?6 (never back); a current
-- delivery whose lease expiry freed is counted in again (extend leases it).
UPDATE lq_state SET
    now = max(now, ?6),
    leased = leased + (
        SELECT count(*) FROM lq_groups
        WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5) AND lock = 0)
WHERE id = 1;

-- name: extend --
-- Lease the current delivery's message (?1 group, ?2 attempt, ?3 seq, ?4 worker, ?5 delivery)
-- again until ?6.
UPDATE lq_groups SET lock = 1, expires_at = ?6
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5);

-- name: counts --
-- stats(): messages, groups, leased, parked, paused, buried: the rows lq_state and
-- lq_quarantine, O(1); scheduled: the messages whose due time is not before the
-- transport's time, a range of lq_due_at, O(log n + scheduled).
SELECT messages, groups, leased, parked, paused, (SELECT buried FROM lq_quarantine WHERE id = 1),
       (SELECT count(*) FROM lq_due WHERE due_at >= lq_state.now)
FROM lq_state WHERE id = 1;

-- name: count_messages --
-- len() (read only).
SELECT messages FROM lq_state WHERE id = 1;

-- name: top_ready_priority --
-- The highest priority among ready groups (NULL: none): can a waiting claim's floor be met?
SELECT max(priority) FROM lq_groups WHERE ready;

-- name: next_expiry --
-- The earliest lock end: a lease's, a park's or a scheduled head's due time (read only;
-- the watcher applies expiry when it is due).
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

-- name: count_paused --
-- ?1 groups were paused (or, negative, resumed; the park resume ends is counted by lq_lock_changed).
UPDATE lq_state SET paused = paused + ?1 WHERE id = 1;

-- name: resume --
-- Lift a pause, end a park and lift a bury (the parked or buried message is claimable
-- now, attempt unchanged; lq_lock_changed counts the park out, count_paused the pause
-- and count_buried the bury).  A group that holds nothing is forgotten after it (forget_group).
UPDATE lq_groups SET
    paused = 0,
    expires_at = CASE WHEN lock = 2 THEN NULL ELSE expires_at END,
    holder = CASE WHEN lock IN (2, 3) THEN NULL ELSE holder END,
    reason = NULL,
    lock = CASE WHEN lock IN (2, 3) THEN 0 ELSE lock END
WHERE gid = ?1;


-- name: purge_messages --
-- Remove every message of a group.
DELETE FROM lq_messages WHERE gid = ?1;

-- name: forget_group --
-- Drop a group row.
DELETE FROM lq_groups WHERE gid = ?1;

-- name: count_purged --
-- A group holding ?1 messages (?2: 1 if it was paused, ?3 if its head was leased,
-- ?4 if parked) was purged: count it out (a bury: count_buried).
UPDATE lq_state SET
    messages = messages - ?1, groups = groups - (?1 > 0), paused = paused - ?2, leased = leased - ?3, parked = parked - ?4
WHERE id = 1;

-- name: set_priority --
-- Change a live group's priority; its round-robin position is kept.
UPDATE lq_groups SET priority = ?2 WHERE group_id = ?1;

-- name: group_info --
-- What group() reports.
SELECT group_id, priority, messages, lock, paused, head_seq, holder, expires_at, attempt, last_claimed_at, reason
FROM lq_groups WHERE group_id = ?1;

-- name: groups_info --
-- What groups() reports: every group, in creation order.  gid is the row id,
-- which SQLite makes larger than every row present, so a re-created group
-- goes to the end.
SELECT group_id, priority, messages, lock, paused, head_seq, holder, expires_at, attempt, last_claimed_at, reason
FROM lq_groups ORDER BY gid;

-- ---------------------------------------------------------------- quarantine (version 4)

-- name: bury_count --
-- Before bury (?1-?5 its lease): the lease, if current and held, is counted out (the
-- operation rolls back if bury finds the lease not current; count_buried counts it in).
UPDATE lq_state SET
    leased = leased - (
        SELECT count(*) FROM lq_groups
        WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5) AND lock = 1)
WHERE id = 1;

-- name: count_buried --
-- ?1 groups were buried (or, negative, unburied by resume, skip or purge).
UPDATE lq_quarantine SET buried = buried + ?1 WHERE id = 1;

-- name: bury --
-- Close the current delivery (?1 group, ?2 attempt, ?3 seq, ?4 worker, ?5 delivery) and
-- bury its message at its group's head with reason ?6: lock 3, no end, the worker and
-- attempt kept (group() reports them), so no claim serves the group until resume or skip.
UPDATE lq_groups SET lock = 3, expires_at = NULL, open = 0, reason = ?6
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5);

-- name: find_head --
-- skip(): a group's control state and head, by group_id.
SELECT gid, paused, lock, messages, head_seq FROM lq_groups WHERE group_id = ?1;

-- name: skip_count --
-- Before skip (?1 the gid): its head's park is counted out (lq_acked, fired by skip,
-- counts the message, and the group if it is emptied; a bury: count_buried).
UPDATE lq_state SET parked = parked - (SELECT lock = 2 FROM lq_groups WHERE gid = ?1) WHERE id = 1;

-- name: skip --
-- Remove the head of group ?1 (not under a live lease: the caller checked) and move the
-- head on, as ack does (lq_acked deletes the old head, counts it out and forgets an
-- emptied group that is not paused).  Any lock, delivery and bury end with it.  A group
-- never claimed is ordered by its oldest message: it takes its new head's key (an
-- emptied one gets its next message's key from publish).
UPDATE lq_groups SET
    messages = messages - 1, lock = 0, expires_at = NULL, holder = NULL, attempt = 0, open = 0, reason = NULL,
    rr_key = CASE WHEN last_claimed_at IS NULL
             THEN coalesce((SELECT min(seq) FROM lq_messages AS m
                            WHERE m.gid = lq_groups.gid AND m.seq > lq_groups.head_seq) - 4611686018427387904, rr_key)
             ELSE rr_key END,
    head_seq = (SELECT min(seq) FROM lq_messages AS m WHERE m.gid = lq_groups.gid AND m.seq > lq_groups.head_seq)
WHERE gid = ?1;

-- name: peek --
-- peek() (read only): the oldest ?2 messages of group ?1, head first, with their
-- deliveries so far (only the head has any), due times and keys.  A range of
-- lq_messages' primary key: O(log G + ?2).
SELECT m.seq, m.event, CASE WHEN m.seq = g.head_seq THEN g.attempt ELSE 0 END, m.due_at, m.key
FROM lq_groups AS g JOIN lq_messages AS m ON m.gid = g.gid
WHERE g.group_id = ?1
ORDER BY m.seq LIMIT ?2;

-- ---------------------------------------------------------------- later, once, release, retry (version 5)

-- name: publish_extras --
-- After publish (inside its transaction): message ?2 of group ?1 was published with due
-- time ?3 (NULL: no delay) and key ?4 (NULL: none).
UPDATE lq_messages SET due_at = ?3, key = ?4
WHERE gid = (SELECT gid FROM lq_groups WHERE group_id = ?1) AND seq = ?2;

-- name: count_due --
-- Count message ?1 (published with a delay) as scheduled until its due time ?2.
INSERT INTO lq_due (seq, due_at) VALUES (?1, ?2);

-- name: count_batch_due --
-- count_due for the staged batch (?1 = the seq before the batch, ?2 = the due time).
INSERT INTO lq_due (seq, due_at) SELECT ?1 + n, ?2 FROM temp.lq_batch;

-- name: drop_due --
-- Forget the due times that have passed (they count for nothing): a range of lq_due_at.
DELETE FROM lq_due WHERE due_at < (SELECT now FROM lq_state WHERE id = 1);

-- name: skip_due --
-- skip() removes message ?1: its due time, if any, goes with it.
DELETE FROM lq_due WHERE seq = ?1;

-- name: purge_due --
-- purge() removes the messages of group ?1: their due times go with them (before purge_messages).
DELETE FROM lq_due WHERE seq IN (SELECT seq FROM lq_messages WHERE gid = ?1);

-- name: schedule_head --
-- Group ?1's head, if free and published with a delay that is not due at the transport's
-- time, is scheduled: lock 4 until its due time (expiry frees it, as it ends a park).
UPDATE lq_groups SET
    lock = 4,
    expires_at = (SELECT due_at FROM lq_messages AS m WHERE m.gid = lq_groups.gid AND m.seq = lq_groups.head_seq)
WHERE group_id = ?1 AND lock = 0
  AND (SELECT due_at FROM lq_messages AS m WHERE m.gid = lq_groups.gid AND m.seq = lq_groups.head_seq)
      >= (SELECT now FROM lq_state WHERE id = 1);

-- name: schedule_batch_heads --
-- schedule_head for every group of the staged batch.
UPDATE lq_groups SET
    lock = 4,
    expires_at = (SELECT due_at FROM lq_messages AS m WHERE m.gid = lq_groups.gid AND m.seq = lq_groups.head_seq)
WHERE group_id IN (SELECT group_id FROM temp.lq_batch) AND lock = 0
  AND (SELECT due_at FROM lq_messages AS m WHERE m.gid = lq_groups.gid AND m.seq = lq_groups.head_seq)
      >= (SELECT now FROM lq_state WHERE id = 1);

-- name: key_holder --
-- The seq of the message holding key ?2 in group ?1, or NULL: the key's row, if its
-- message is still stored or its time has not passed.  O(log n).
SELECT k.seq FROM lq_keys AS k
WHERE k.group_id = ?1 AND k.key = ?2
  AND (k.held_until > (SELECT now FROM lq_state WHERE id = 1)
       OR EXISTS (SELECT 1 FROM lq_groups AS g JOIN lq_messages AS m ON m.gid = g.gid AND m.seq = k.seq
                  WHERE g.group_id = k.group_id));

-- name: keep_key --
-- Key ?2 of group ?1 is held by message ?3, and until ?4 also after that message left.
INSERT OR REPLACE INTO lq_keys (group_id, key, seq, held_until, check_at) VALUES (?1, ?2, ?3, ?4, ?4);

-- name: keep_batch_keys --
-- keep_key for the staged batch's keys (?1 = the seq before the batch, ?2 = held until).
INSERT OR REPLACE INTO lq_keys (group_id, key, seq, held_until, check_at)
SELECT group_id, key, ?1 + n, ?2, ?2 FROM temp.lq_batch WHERE key IS NOT NULL;

-- name: drop_keys --
-- Of the (up to) 16 rows first due for a look (check_at, at first held_until, not after
-- the transport's time), forget those that hold nothing: their time has passed and their
-- message has left.  O(16 log n): a range of lq_keys_check_at, then one look each.
DELETE FROM lq_keys
WHERE (group_id, key) IN (
        SELECT k.group_id, k.key FROM lq_keys AS k
        WHERE k.check_at <= (SELECT now FROM lq_state WHERE id = 1)
        ORDER BY k.check_at LIMIT 16)
  AND held_until <= (SELECT now FROM lq_state WHERE id = 1)
  AND NOT EXISTS (SELECT 1 FROM lq_groups AS g JOIN lq_messages AS m ON m.gid = g.gid AND m.seq = lq_keys.seq
                  WHERE g.group_id = lq_keys.group_id);

-- name: defer_keys --
-- After drop_keys: the (up to) 16 rows first due for a look now (those it kept: their
-- message is still stored) are looked at again after about as long again as their time
-- has passed (at least 1 s, at most a day), so each row is looked at O(log(its life)) times.
UPDATE lq_keys SET check_at = (SELECT now FROM lq_state WHERE id = 1)
    + min(max(1.0, coalesce((SELECT now FROM lq_state WHERE id = 1) - held_until, 1.0)), 86400.0)
WHERE (group_id, key) IN (
        SELECT k.group_id, k.key FROM lq_keys AS k
        WHERE k.check_at <= (SELECT now FROM lq_state WHERE id = 1)
        ORDER BY k.check_at LIMIT 16)
  AND EXISTS (SELECT 1 FROM lq_groups AS g JOIN lq_messages AS m ON m.gid = g.gid AND m.seq = lq_keys.seq
              WHERE g.group_id = lq_keys.group_id);

-- name: release_now --
-- release(lease, 0): as nack_now (?1-?5 the lease), and the delivery does not count.
UPDATE lq_groups SET lock = 0, expires_at = NULL, holder = NULL, open = 0, attempt = attempt - 1, paused = paused
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5);

-- name: release_park --
-- release(lease, delay > 0): as park (?1-?5 the lease, ?6 the delay), and the delivery
-- does not count (after park_time, as park).
UPDATE lq_groups SET
    lock = 2, expires_at = (SELECT now FROM lq_state) + ?6, holder = '__parked__', open = 0, attempt = attempt - 1
WHERE group_id = ?1 AND open = 1 AND attempt = ?2 AND head_seq = ?3 AND holder = ?4 AND (?5 IS NULL OR rr_key = ?5);

-- name: retry --
-- retry(): group ?1's head (not under a live lease: the caller checked, after expiry)
-- starts afresh: no delivery counted, a park ended, a bury lifted, an expired lease's
-- delivery closed; a schedule (lock 4) and a pause stay, and so do the round-robin key
-- and last_claimed_at.  skip_count counts the park out first, count_buried the bury.
UPDATE lq_groups SET
    attempt = 0, open = 0, holder = NULL, reason = NULL,
    expires_at = CASE WHEN lock = 4 THEN expires_at END,
    lock = CASE WHEN lock = 4 THEN 4 ELSE 0 END
WHERE gid = ?1;
