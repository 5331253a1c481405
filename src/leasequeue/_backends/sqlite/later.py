"""SPEC Part 5 on ``SQLiteTransport``: later (delayed publish), once
(idempotency keys), and honest attempts (``release``, ``retry``), as
docs/decisions.md "Part 5: later, once, honest attempts, pinned" says.

A mixin of ``transport.SQLiteTransport`` (the operations that a call made
with the arguments of an earlier part never reaches: a publish without a
delay or a key keeps its one-statement path in ``transport.py``).

* **Later.**  A message published with ``delay > 0`` stores its due time
  (``lq_messages.due_at``: the transport's time + ``delay``).  While it is its
  group's head and not due, the group's lock is 4 ("scheduled") with the due
  time as the lock's end: not ready, so no claim takes it; in the expiry
  index, so the claim's expiry statement frees it once the time is past it
  (the strict test of a park's end) and the watcher of waiting claims
  (``waiting.py``), which sleeps until the earliest lock end, wakes them for
  it, in this process and in others.  A message that becomes the head later
  (ack, skip) is scheduled by the statement that moves the head on.
  ``stats().scheduled`` counts the rows of ``lq_due`` (one per delayed
  message whose due time may not have passed) with ``due_at >= now``.
* **Once.**  A key is stored with its message (``lq_messages.key``, for
  ``peek``) and in ``lq_keys`` (group id, key, seq, the publish's time + the
  publishing transport's window): it is held while that message is stored or
  that time has not passed.  Each keyed publish forgets a few rows that hold
  nothing any more (schema.sql).  No index of ``lq_messages`` is added: a
  plain publish and ack cost what they did.
* **Release and retry.**  ``release`` is ``nack`` whose delivery does not
  count; ``retry`` gives a head a fresh start.  Fencing by delivery (the
  claim number a lease carries) is in every statement that tests a lease.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..._validation import check_duration, check_id, check_key
from ..durable import check_lease, lease_fence, lost
from ..sqlfiles import load_queries
from .waiting import call_all

__all__ = ["LaterOnce", "fence"]

_Q = load_queries("sqlite")


#: ``(group_id, attempt, seq, worker_id, delivery)``: the parameters ?1-?5 of
#: every statement that tests a lease's currency (queries.sql), or None when
#: the lease's fields name no delivery (``durable.lease_fence``).
fence = lease_fence


class LaterOnce:
    """``publish``/``publish_many`` with a delay or keys, ``release``, ``retry``."""

    # Provided by SQLiteTransport.
    _lock: Any
    _queue: Any
    _dedup_window: float
    _cursor: Callable[[], Any]
    _now: Callable[[], float]
    _abort: Callable[[BaseException], None]
    _serialize: Callable[[Any], Any]
    _use_time: Callable[[Any, float], None]
    _topup_in: Callable[[Any], List[Callable[[], None]]]
    _signal_if_ready: Callable[[Any, str], List[Callable[[], None]]]
    _signal: Callable[[Any], List[Callable[[], None]]]
    _unusable: Callable[[], Exception]
    _cur: Any
    _publish_in_app: Callable[..., List[int]]
    _settle_in_app: Callable[..., None]

    # ------------------------------------------------------------ later, once

    def _publish_time(self, cur: Any, now: float) -> None:
        """The time of a publish that read the clock (a delay, or a key with a
        window): moved, with no expiry applied (docs/decisions.md, "Clock
        readings that apply no expiry"), unless claims of this process wait:
        then expiry is applied and they are topped up from it, as the
        in-memory transports serve their waiting claims at that reading."""
        if self._queue.waiters:
            self._use_time(cur, now)
        else:
            cur.execute(_Q["use_time"], (now,))

    def _publish_later_once(
        self, group_id: str, event: Any, priority: int, delay: Any, key: Any, conn: Any = None
    ) -> int:
        """``publish`` with ``delay``/``key`` not both defaults, or with ``conn``
        (``group_id`` and ``priority`` checked by the caller): checked, then
        one transaction (the application's, with ``conn``: ``appconn.py``)."""
        delay = check_duration(delay, "delay")
        key = check_key(key)
        if conn is not None:
            rows = [(group_id, priority, self._serialize(event), key)]
            now_needed = delay > 0.0 or (key is not None and self._dedup_window > 0.0)
            return self._publish_in_app(conn, rows, delay, now_needed)[0]
        if delay == 0.0 and key is None:
            return self.publish(group_id, event, priority)  # type: ignore[attr-defined]
        data = self._serialize(event)
        window = self._dedup_window
        # One clock reading, only if the delay or the window needs it; _now
        # raises LeaseQueueError first on a closed transport.
        now = self._now() if delay > 0.0 or (key is not None and window > 0.0) else None
        if now is None and self._cur is None:
            raise self._unusable()
        wakes: List[Callable[[], None]] = []
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                if now is not None:
                    self._publish_time(cur, now)
                seq: Any = None
                if key is not None:
                    cur.execute(_Q["drop_keys"])
                    cur.execute(_Q["defer_keys"])
                    found = cur.execute(_Q["key_holder"], (group_id, key)).fetchone()
                    seq = None if found is None else found[0]
                if seq is None:  # not held: publish
                    seq = cur.execute(_Q["publish"], (group_id, priority, data)).fetchone()[0]
                    time_now = cur.execute(_Q["now"]).fetchone()[0]
                    due = time_now + delay if delay > 0.0 else None
                    cur.execute(_Q["publish_extras"], (group_id, seq, due, key))
                    if due is not None:
                        cur.execute(_Q["drop_due"])
                        cur.execute(_Q["count_due"], (seq, due))
                        cur.execute(_Q["schedule_head"], (group_id,))
                    if key is not None:
                        cur.execute(_Q["keep_key"], (group_id, key, seq, time_now + window))
                    if self._queue.waiters and due is None:
                        messages, ready, group_priority = cur.execute(_Q["group_state"], (group_id,)).fetchone()
                        if ready and messages == 1:  # the group was idle: claimable now
                            wakes += self._signal((group_priority,))
                if now is not None and self._queue.waiters:
                    wakes += self._topup_in(cur)  # what the expiry at the new time freed
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return int(seq)

    def _publish_many_later_once(self, rows: List[Tuple[str, int, Any, Optional[str]]], delay: float) -> List[int]:
        """``publish_many`` of checked, serialized rows ``(group_id, priority,
        data, key)`` with a delay or some key, in one transaction: an item
        whose key is held (or repeats an earlier item's in its group) gets the
        holder's seq; the others are published as the plain batch is, with
        consecutive seqs in item order."""
        window = self._dedup_window
        keyed = any(row[3] is not None for row in rows)
        now = self._now() if delay > 0.0 or (keyed and window > 0.0) else None
        if now is None and self._cur is None:
            raise self._unusable()
        wakes: List[Callable[[], None]] = []
        # Each item's seq: ("new", n) for the n-th staged item, ("seq", s) for a held key's.
        results: List[Tuple[str, int]] = []
        base = 0
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                if now is not None:
                    self._publish_time(cur, now)
                if keyed:
                    cur.execute(_Q["drop_keys"])
                    cur.execute(_Q["defer_keys"])
                staged: List[Tuple[str, int, Any, Optional[str]]] = []
                seen: Dict[Tuple[str, str], Tuple[str, int]] = {}
                for row in rows:
                    group_id, _priority, _data, key = row
                    if key is not None:
                        held = seen.get((group_id, key))
                        if held is None:
                            found = cur.execute(_Q["key_holder"], (group_id, key)).fetchone()
                            if found is not None:
                                held = seen[(group_id, key)] = ("seq", found[0])
                        if held is not None:
                            results.append(held)
                            continue
                    staged.append(row)
                    results.append(("new", len(staged)))
                    if key is not None:
                        seen[(group_id, key)] = results[-1]
                if staged:
                    cur.executemany(_Q["batch_add"], staged)
                    cur.execute(_Q["batch_take_seqs"])
                    last = cur.execute(_Q["last_seq"]).fetchone()[0]
                    base = last - len(staged)
                    time_now = cur.execute(_Q["now"]).fetchone()[0]
                    due = time_now + delay if delay > 0.0 else None
                    cur.execute(_Q["batch_groups"], (base,))
                    cur.execute(_Q["batch_heads"], (base,))
                    cur.execute(_Q["batch_messages"], (base, due))
                    if due is not None:
                        cur.execute(_Q["drop_due"])
                        cur.execute(_Q["count_batch_due"], (base, due))
                        cur.execute(_Q["schedule_batch_heads"])
                    if keyed:
                        cur.execute(_Q["keep_batch_keys"], (base, time_now + window))
                    if self._queue.waiters:
                        counts: Dict[str, int] = {}
                        for row in staged:
                            counts[row[0]] = counts.get(row[0], 0) + 1
                        claimable = []
                        for group_id, count in counts.items():
                            messages, ready, group_priority = cur.execute(_Q["group_state"], (group_id,)).fetchone()
                            if ready and messages == count:  # the group was idle before the batch
                                claimable.append(group_priority)
                        wakes += self._signal(claimable)
                    cur.execute(_Q["batch_clear"])
                if now is not None and self._queue.waiters:
                    wakes += self._topup_in(cur)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return [base + value if kind == "new" else value for kind, value in results]

    # ------------------------------------------------------------ honest attempts

    def release(self, lease: Any, delay: float = 0.0, *, conn: Optional[sqlite3.Connection] = None) -> None:
        """Hand a delivery back without counting it: exactly ``nack(lease,
        delay)`` (free now, or parked ``delay`` seconds; the round-robin key and
        the wake-ups as ``nack``), then the message's attempt count is
        ``lease.attempt - 1``, so its next delivery carries this one's attempt.

        ``LeaseLost`` if the lease is not current; nothing changes then.
        ``conn``: the application's ``sqlite3.Connection`` to this file: the
        release is part of its transaction (``appconn.py``).
        """
        check_lease(lease)
        delay = check_duration(delay, "delay")
        now = self._now() if delay > 0.0 else None
        if conn is not None:
            if now is None:
                return self._settle_in_app(conn, lease, [("release_now", ())], "release_now")
            return self._settle_in_app(conn, lease, [("park_time", (now,)), ("release_park", (delay,))], "release_park")
        if now is None and self._cur is None:
            raise self._unusable()
        key = fence(lease)
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            done = False
            if key is not None:
                try:
                    cur.execute("BEGIN IMMEDIATE")
                    if now is None:
                        # "paused = paused" in release_now fires lq_lock_changed: the lease is counted out.
                        done = cur.execute(_Q["release_now"], key).rowcount == 1
                    else:
                        # The time and the counts are kept only if the lease is current (else rolled back).
                        cur.execute(_Q["park_time"], key + (now,))
                        done = cur.execute(_Q["release_park"], key + (delay,)).rowcount == 1
                    if done and self._queue.waiters:
                        wakes = self._signal_if_ready(cur, key[0]) if now is None else self._topup_in(cur)
                    cur.execute("COMMIT" if done else "ROLLBACK")
                except BaseException as exc:
                    self._abort(exc)
            if not done:
                raise lost(lease)
        if wakes:
            call_all(wakes)

    def retry(self, group_id: str) -> bool:
        """The operator's "run it again from scratch": the head's attempt count
        goes back to 0 (its next delivery is attempt 1), a bury is lifted, a
        park is ended, an expired lease's delivery is closed; a pause and a
        schedule stay, and so do the round-robin position and
        ``last_claimed_at``.  The head is claimable at once unless paused or
        scheduled, and wakes a waiting claim.

        ``False``, nothing changed (but the time, and the expiry applied at
        it), for an unknown group, one holding no message, or a head under a
        lease that has not expired.
        """
        group_id = check_id(group_id, "group_id")
        now = self._now()  # always: expiry first, as skip does
        wakes: List[Callable[[], None]] = []
        done = False
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                self._use_time(cur, now)
                row = cur.execute(_Q["find_head"], (group_id,)).fetchone()
                if row is not None and row[4] is not None and row[2] != 1:
                    gid, lock = row[0], row[2]
                    cur.execute(_Q["skip_count"], (gid,))  # a park is counted out
                    if lock == 3:
                        cur.execute(_Q["count_buried"], (-1,))
                    cur.execute(_Q["retry"], (gid,))
                    done = True
                if self._queue.waiters:
                    wakes += self._signal_if_ready(cur, group_id) if done else []
                    wakes += self._topup_in(cur)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return done
