-- Named queries of PostgresTransport (loaded by leasequeue._backends.sqlfiles.load_queries).
-- Each query sits under a "-- name: NAME --" header followed by a one-line
-- description; parameters are psycopg placeholders (%s), in order.
-- Every write is one call of a server-side function (schema.sql), so each
-- operation is one round trip and one transaction (autocommit).

-- name: schema_version --
-- The installed schema's version (fails with UndefinedTable when there is none).
SELECT value FROM leasequeue.meta WHERE key = 'schema_version';

-- name: register_queue --
-- The id and message sequence of a named queue, made if missing (only install and create_queue call it).
SELECT queue_id, queue_seq FROM leasequeue.register_queue(%s);

-- name: publish --
-- Append one message: queue, seq oid, group, payload, priority -> seq.
SELECT leasequeue.publish(%s, %s, %s, %s, %s);

-- name: publish_many --
-- Append messages in item order: queue, seq oid, groups[], payloads[], priorities[] -> seqs.
SELECT leasequeue.publish_many(%s, %s, %s, %s, %s);

-- name: publish_ext --
-- Publish with a delay or a key: queue, seq oid, group, payload, priority, delay, key, window, now, server clock? -> seq.
SELECT leasequeue.publish_ext(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s);

-- name: publish_many_ext --
-- publish_many with keys or a delay: queue, seq oid, groups[], payloads[], priorities[], keys[], delay, window, now, server clock? -> seqs.
SELECT leasequeue.publish_many_ext(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s);

-- name: claim --
-- Up to count claims at one time: queue, worker, visibility, min_priority, now, count, report, token.
SELECT seq, group_id, payload, expires_at, attempt, prev_rr, prev_last, prev_open, prev_worker, delivery
FROM leasequeue.claim(%s, %s, %s, %s, %s, %s, %s, %s);

-- name: claimable --
-- Is anything claimable under this floor now: queue, min_priority.
SELECT leasequeue.claimable(%s, %s);

-- name: unclaim --
-- Undo a claim whose caller was cancelled: queue, group, seq, attempt, worker, delivery, prev rr/last/open/worker.
SELECT leasequeue.unclaim(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s);

-- name: ack --
-- Remove a leased message: queue, group, seq, attempt, worker, delivery -> current?
SELECT leasequeue.ack(%s, %s, %s, %s, %s, %s);

-- name: ack_and_claim --
-- Ack, then claim at the same time: queue, group, seq, attempt, worker, delivery, claimer, visibility, min_priority, now.
SELECT seq, group_id, payload, expires_at, attempt, prev_rr, prev_last, prev_open, prev_worker, delivery
FROM leasequeue.ack_and_claim(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s);

-- name: ack_many --
-- Ack in order: queue, groups[], seqs[], attempts[], workers[], deliveries[] -> positions not current.
SELECT leasequeue.ack_many(%s, %s, %s, %s, %s, %s);

-- name: nack --
-- Retry now or park: queue, group, seq, attempt, worker, delivery, delay, now -> current?
SELECT leasequeue.nack(%s, %s, %s, %s, %s, %s, %s, %s, false);

-- name: release --
-- nack whose delivery does not count: queue, group, seq, attempt, worker, delivery, delay, now -> current?
SELECT leasequeue.nack(%s, %s, %s, %s, %s, %s, %s, %s, true);

-- name: extend --
-- Heartbeat: queue, group, seq, attempt, worker, delivery, visibility, now -> new expires_at or NULL.
SELECT leasequeue.extend(%s, %s, %s, %s, %s, %s, %s, %s);

-- name: stats --
-- Counts as of now: queue, now.
SELECT messages, groups, leased, parked, paused, buried, scheduled FROM leasequeue.stats(%s, %s);

-- name: count --
-- Messages held by a queue.
SELECT count(*) FROM leasequeue.messages WHERE queue = %s;

-- name: next_expiry --
-- The earliest lock end of a queue and the server's time.
SELECT expires_at, server_now FROM leasequeue.next_expiry(%s);

-- name: pause --
-- Pause a group (recorded even when empty): queue, group -> was not paused?
SELECT leasequeue.pause(%s, %s);

-- name: resume --
-- Lift a pause or a park: queue, group -> lifted?
SELECT leasequeue.resume(%s, %s);

-- name: purge --
-- Remove a group and all its messages: queue, group -> messages removed.
SELECT leasequeue.purge(%s, %s);

-- name: set_priority --
-- Change a live group's priority: queue, group, priority -> found?
SELECT leasequeue.set_priority(%s, %s, %s);

-- name: group_info --
-- One group (or all with NULL) as of now: queue, group, now.
SELECT group_id, priority, messages, paused, lock_state, head_seq, lock_worker, expires_at, attempt,
       last_claimed_at, reason, due_at
FROM leasequeue.group_info(%s, %s, %s);

-- name: listen_register --
-- Sign a process up for a queue: queue, the pid of its listening connection; waits for announcements under way.
SELECT leasequeue.listen_register(%s, %s);

-- name: listen_unregister --
-- Forget this connection as a listener of a queue.
SELECT leasequeue.listen_unregister(%s);

-- name: release_token --
-- Free the lease an interrupted waiting claim may have made: queue, token -> leases freed.
SELECT leasequeue.release_token(%s, %s);

-- name: bury --
-- Quarantine the group of a current delivery: queue, group, seq, attempt, worker, delivery, reason -> current?
SELECT leasequeue.bury(%s, %s, %s, %s, %s, %s, %s);

-- name: retry --
-- Run a group's head again from scratch: queue, group, now -> done?
SELECT leasequeue.retry(%s, %s, %s);

-- name: skip --
-- Remove a group's head unless a live lease holds it: queue, group, now -> removed?
SELECT leasequeue.skip(%s, %s, %s);

-- name: peek --
-- The oldest messages of a group, head first, with deliveries so far (only the head
-- has any): count, queue, group -> seq, payload, attempt, due_at, key.  A range of the
-- messages' primary key: O(log G + count).
SELECT m.seq, m.payload, CASE WHEN m.seq = h.head THEN g.attempt ELSE 0 END, m.due_at, m.key
FROM leasequeue.groups g
CROSS JOIN LATERAL (SELECT x.seq, x.payload, x.due_at, x.key FROM leasequeue.messages x
                    WHERE x.queue = g.queue AND x.group_id = g.group_id ORDER BY x.seq LIMIT %s) m
CROSS JOIN LATERAL (SELECT min(y.seq) AS head FROM leasequeue.messages y
                    WHERE y.queue = g.queue AND y.group_id = g.group_id) h
WHERE g.queue = %s AND g.group_id = %s
ORDER BY m.seq;
