"""Quarantine on PostgreSQL beyond the kit's rules (``test_pg_contract.py``
runs them): ``skip`` and ``resume`` wake a waiting claim through
LISTEN/NOTIFY, from the same transport, another transport of the queue and
another process; a bury is in the database (another transport sees it);
bad input and an undecodable event in ``peek`` change nothing; ``peek`` and
``skip`` go through indexes.  Real threads, processes and server.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
from typing import Any, List, Optional

import psycopg
import pytest

from leasequeue import LeaseLost, LeaseQueueError, Undecodable
from leasequeue.testing import ManualClock

LIVENESS = 30.0


def buried_group(t: Any, group_id: str = "g", messages: int = 2) -> Any:
    for i in range(messages):
        t.publish(group_id, f"{group_id}{i + 1}")
    lease = t.claim("w", 30)
    assert lease.group_id == group_id
    t.bury(lease, "poison")
    return lease


class Claimer(threading.Thread):
    def __init__(self, t: Any) -> None:
        super().__init__(daemon=True)
        self.t = t
        self.result: Any = "pending"
        self.error: Optional[BaseException] = None
        self.start()
        deadline = LIVENESS
        room = t._room
        while deadline > 0:  # asleep: made its first claim and was not woken
            with room._lock:
                if any(not w.claiming and not w.woken for w in room._waiters):
                    break
            self.join(0.005)
            deadline -= 0.005
        else:
            raise AssertionError("the claim did not go to sleep")

    def run(self) -> None:
        try:
            self.result = self.t.claim("waiter", 30, timeout=LIVENESS)
        except BaseException as exc:  # noqa: B036 - reported to the test
            self.error = exc

    def lease(self) -> Any:
        self.join(LIVENESS + 5)
        assert not self.is_alive(), "the waiting claim did not return"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.mark.parametrize("who", ["same", "other"])
@pytest.mark.parametrize("how", ["skip", "resume"])
def test_skip_and_resume_wake_a_waiting_claim(make_pg: Any, queue_name: str, how: str, who: str) -> None:
    a = make_pg(queue_name)
    operator = a if who == "same" else make_pg(queue_name)
    buried_group(a)
    claimer = Claimer(a)
    assert getattr(operator, how)("g") is True
    lease = claimer.lease()
    assert lease is not None
    assert (lease.event, lease.attempt) == (("g2", 1) if how == "skip" else ("g1", 2))


OPERATOR = r"""
import sys
from leasequeue import PostgresTransport
with PostgresTransport(sys.argv[1], queue=sys.argv[2]) as t:
    print(getattr(t, sys.argv[3])(sys.argv[4]), flush=True)
"""


@pytest.mark.parametrize("how", ["skip", "resume"])
def test_skip_and_resume_from_another_process(conninfo: str, make_pg: Any, queue_name: str, how: str) -> None:
    t = make_pg(queue_name)
    buried_group(t)
    claimer = Claimer(t)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", OPERATOR, conninfo, queue_name, how, "g"], env=env,
                          capture_output=True, text=True, timeout=LIVENESS)
    assert proc.stdout.strip() == "True", proc.stderr
    lease = claimer.lease()
    assert (lease.event, lease.attempt) == (("g2", 1) if how == "skip" else ("g1", 2))


def test_a_bury_is_in_the_database(make_pg: Any, queue_name: str) -> None:
    clock = ManualClock()
    a, b = make_pg(queue_name, clock=clock), make_pg(queue_name, clock=clock)
    lease = buried_group(a)
    b.publish("other", "o1")
    info = b.group("g")
    assert (info.state, info.reason, info.worker_id, info.attempt, info.messages, info.expires_at) == (
        "buried", "poison", "w", 1, 2, None)
    assert b.stats().buried == 1
    clock.advance(1e6)  # time does not end a bury
    assert b.claim("w2", 30, -(2**63)).group_id == "other"
    assert b.claim("w2", 30, -(2**63)) is None
    with pytest.raises(LeaseLost):
        b.ack(lease)
    assert b.resume("g") is True
    assert a.stats().buried == 0 and a.group("g").reason is None


def test_bad_input_changes_nothing(make_pg: Any) -> None:
    t = make_pg(clock=ManualClock())
    t.publish("g", "g1")
    lease = t.claim("w", 30)
    before = (t.stats(), t.groups(), t.peek("g", 5))
    for call, error in [
        (lambda: t.bury(lease, 5), TypeError),
        (lambda: t.bury(lease, None), TypeError),
        (lambda: t.bury(("g", 1), "x"), TypeError),
        (lambda: t.skip(5), TypeError),
        (lambda: t.peek(5), TypeError),
        (lambda: t.peek("g", True), TypeError),
        (lambda: t.peek("g", -1), ValueError),
    ]:
        with pytest.raises(error):
            call()
        assert (t.stats(), t.groups(), t.peek("g", 5)) == before
    t.ack(lease)


def test_peek_of_an_undecodable_event_shows_it(make_pg: Any) -> None:
    def loads(data: Any) -> Any:
        if data == b'"bad"':
            raise ValueError("cannot decode")
        return json.loads(data)

    t = make_pg(serializer=(json.dumps, loads))
    t.publish("g", "good")
    t.publish("g", "bad")
    assert [m.event for m in t.peek("g")] == ["good"]
    bad = t.peek("g", 2)[1]
    assert bad.seq == 2 and bad.event == Undecodable(b'"bad"', "ValueError: cannot decode")
    assert t.stats()[:2] == (2, 1)  # nothing changed
    assert t.claim("w", 30).event == "good"


def test_peek_beyond_the_64_bit_range_and_closed(make_pg: Any) -> None:
    t = make_pg()
    t.publish_many([("g", i) for i in range(3)])
    assert [m.event for m in t.peek("g", 2**70)] == [0, 1, 2]
    assert t.peek("g", 0) == [] and t.peek("nobody", 2) == []
    lease = t.claim("w", 30)
    t.close()
    for call in (lambda: t.bury(lease), lambda: t.skip("g"), lambda: t.peek("g")):
        with pytest.raises(LeaseQueueError, match="closed"):
            call()


def test_bury_skip_peek_use_indexes_at_100k_groups(conninfo: str, make_pg: Any) -> None:
    """The statements of bury, skip and peek, and of version 4's retry and
    keyed publish (inside the server-side functions, seen through
    auto_explain) are index scans, never sequential
    scans of the groups or messages, with 100k groups queued: O(log G)."""
    t = make_pg()
    q = t._queue
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO leasequeue.groups (queue, group_id, priority, rr_key) "
            "SELECT %s, 'g' || i, i %% 3, i - 4611686018427387904 FROM generate_series(1, 100000) i", (q,))
        conn.execute(
            "INSERT INTO leasequeue.messages (queue, group_id, seq, payload) "
            "SELECT %s, 'g' || (i %% 100000 + 1), i, '\\x80054b012e'::bytea FROM generate_series(1, 200000) i",
            (q,))
        conn.execute(f"SELECT setval({t._seq_oid}::regclass, 200000)")
        conn.execute("ANALYZE leasequeue.groups")
        conn.execute("ANALYZE leasequeue.messages")
    lease = t.claim("w", 30)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        plans: List[str] = []
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice"):
            conn.execute(f"SET auto_explain.{setting}")
        from leasequeue._backends.postgres.transport import _Q

        calls = [
            ("bury", _Q["bury"], (q, lease.group_id, lease.seq, lease.attempt, lease.worker_id, lease._delivery,
                                  "why"), True),
            ("peek", _Q["peek"], (5, q, lease.group_id), None),
            ("retry", _Q["retry"], (q, lease.group_id, None), True),  # version 4: lifts the bury
            ("publish-keyed", _Q["publish_ext"],  # queue, seq, group, payload (1), priority, delay, key, window, now
             (q, t._seq_oid, lease.group_id, pickle.dumps(1), 0, 0.0, "k", 0.0, None, True), None),
            ("skip", _Q["skip"], (q, lease.group_id, None), True),
            ("skip-unknown", _Q["skip"], (q, "nobody", None), False),
        ]
        for name, sql, params, expected in calls:
            plans.clear()
            rows = conn.execute(sql, params).fetchall()
            if expected is not None:
                assert rows == [(expected,)], (name, rows)
            text = "\n".join(plans)
            assert "Index" in text, f"{name}: no index scan in\n{text}"
            for line in text.splitlines():
                if "Seq Scan" in line:
                    assert "groups" not in line and "messages" not in line, f"{name}: sequential scan\n{text}"
    assert [(m.seq, m.key) for m in t.peek(lease.group_id, 3)] == [(lease.seq + 100000, None), (200001, "k")]


def test_skip_on_the_server_clock(pg: Any) -> None:
    """With the server's clock (no injected one): a live lease holds the head,
    one that ran out does not (and stops being current)."""
    import time

    pg.publish("g", "g1")
    pg.publish("g", "g2")
    lease = pg.claim("w", 2.0)
    assert pg.skip("g") is False
    time.sleep(2.5)  # the lease runs out by the server's clock
    assert pg.skip("g") is True
    with pytest.raises(LeaseLost):
        pg.ack(lease)
    assert [m.event for m in pg.peek("g", 5)] == ["g2"]
