"""SPEC Part 5 on ``SQLiteTransport`` beyond the kit (``_backends/sqlite/later.py``):
what only a file shared by processes and threads can show.

* A scheduled head becoming due wakes a claim waiting in this process and one
  waiting in another process, without polling: the other process spends no
  CPU while it waits (measured as ``test_sqlite_idle.py`` measures it, never a
  speed threshold), and nothing is delivered before its due time.
* Keys and the dedup window hold across instances on one file; a key is
  held by the window of the transport that stored it.
* Fencing by delivery across instances: a lease issued by one instance is
  not current on another after a release, while a lease rebuilt from its
  fields names the open delivery.
* Bad input (every new argument) raises, reads no clock and leaves the file
  exactly as it was.
* Threads publishing with keys and delays, claiming, releasing, nacking and
  acking, with an operator retrying: nothing lost, nothing delivered to two
  workers at once, FIFO per group, one message per key.
"""

from __future__ import annotations

import math
import random
import sqlite3
import threading
import time
from typing import Any, Dict, List, Set, Tuple

import pytest

import leasequeue
from leasequeue import LeaseLost, SQLiteTransport
from leasequeue.testing import ManualClock

from test_sqlite_idle import IDLE_BOUND_MS, KERNEL, LIVENESS, SETTLE, Agent, agents, needs_kernel  # noqa: F401


def dump(path: Any) -> List[str]:
    """Every row of every table of the file (what 'nothing changed' compares)."""
    conn = sqlite3.connect(str(path))
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


# -- waking for a due head ---------------------------------------------------------------------


def test_a_due_head_wakes_a_claim_waiting_in_this_process(tmp_path: Any) -> None:
    """A claim waits; a delayed publish does not wake it; the head's due time
    does, and the message is not delivered before it."""
    with SQLiteTransport(tmp_path / "q.db") as t:
        got: List[Any] = []
        waiter = threading.Thread(target=lambda: got.append((t.claim("w", 30, timeout=LIVENESS), time.time())))
        waiter.start()
        time.sleep(0.2)
        published = time.time()
        t.publish("g", "later", delay=0.6)
        waiter.join(LIVENESS + 1)
        assert not waiter.is_alive()
        lease, when = got[0]
        assert lease is not None and lease.event == "later"
        assert when > published + 0.6


@needs_kernel
@pytest.mark.serial(reason="measures an idle process's CPU time against a bound")
def test_a_due_head_wakes_a_claim_waiting_in_another_process_with_no_cpu_meanwhile(
    tmp_path: Any, agents: List[Agent]  # noqa: F811
) -> None:
    """The agent's claim waits; this process publishes a message due in 4 s.
    Between the publish and the due time the agent's watcher sleeps in the
    kernel until the head's due time: under the idle bound of CPU, its claim
    still waiting.  Then the claim gets the message, not before it is due."""
    path = str(tmp_path / "q.db")
    SQLiteTransport(path).close()
    agent = Agent(path, claims=1)
    agents.append(agent)
    assert agent.ready().mechanism == KERNEL
    delay = SETTLE + 2.0 + 0.8  # the CPU is measured over [SETTLE, SETTLE + 2] s after the publish
    with SQLiteTransport(path) as t:
        published = time.time()
        t.publish("g", {"n": 1}, delay=delay)
        assert t.group("g").state == "scheduled"
    agent.send("cpu 2")
    ms, waiting = agent.expect("cpu", 30.0)
    assert int(waiting) == 1, "the claim was woken before the message was due"
    assert float(ms) < IDLE_BOUND_MS, f"a claim waiting for a due head used {float(ms):.2f} ms of CPU per second"
    words = agent.expect("got", LIVENESS + delay)
    assert words[0] == '{"n":' or words[0].startswith('{"n"')
    assert float(words[-1]) > published + delay


def test_a_head_made_scheduled_by_an_ack_is_served_when_due(tmp_path: Any) -> None:
    """A delayed message behind another: the ack exposes it scheduled; a claim
    waiting in another instance on the file gets it once it is due."""
    path = tmp_path / "q.db"
    with SQLiteTransport(path) as t, SQLiteTransport(path) as other:
        t.publish("g", "first")
        t.publish("g", "second", delay=0.5)
        lease = t.claim("w", 30)
        t.ack(lease)
        assert t.group("g").state == "scheduled"
        started = time.time()
        second = other.claim("v", 30, timeout=LIVENESS)
        assert second is not None and second.event == "second"
        assert time.time() >= started  # a result, not a timeout
        assert t.group("g").state == "leased"


# -- once across instances ---------------------------------------------------------------------


def test_keys_are_held_across_instances_by_the_storing_window(tmp_path: Any) -> None:
    path = tmp_path / "q.db"
    clock = ManualClock(1000.0)
    with SQLiteTransport(path, clock=clock, dedup_window=10.0) as a, SQLiteTransport(path, clock=clock) as b:
        seq = a.publish("g", "x", key="k")
        assert b.publish("g", "y", key="k") == seq  # held by its message
        assert b.publish("h", "y", key="k") != seq  # another group, another key
        a.ack(b.claim("w", 30, 0))  # g's message leaves (h's group is younger)
        assert b.publish("g", "z", key="k") == seq  # held by a's window, b's own window being 0
        clock.set(1010.0)
        assert b.publish("g", "z", key="k") == seq  # b reads no clock (window 0): the time has not moved
        b.stats()  # it moves now
        fresh = b.publish("g", "z", key="k")  # the window has passed: a new message
        assert fresh > seq
        assert a.publish("g", "again", key="k") == fresh
        assert len(a) == 2
        assert [m.key for m in b.peek("g", 5)] == ["k"]


def test_a_held_key_survives_its_group_being_forgotten_and_purged(tmp_path: Any) -> None:
    clock = ManualClock(1000.0)
    with SQLiteTransport(tmp_path / "q.db", clock=clock, dedup_window=math.inf) as t:
        seq = t.publish("g", 1, key="once")
        assert t.purge("g") == 1
        assert t.group("g") is None
        clock.advance(1e9)
        assert t.publish("g", 2, key="once") == seq
        assert len(t) == 0 and t.stats().groups == 0


# -- fencing by delivery across instances ------------------------------------------------------


def test_a_released_lease_is_not_current_on_any_instance(tmp_path: Any) -> None:
    """After release the next delivery carries the same attempt and worker: the
    issued old lease is stale on every instance; a lease rebuilt from the
    fields names the open (new) delivery, the stated price of rebuilt leases."""
    path = tmp_path / "q.db"
    with SQLiteTransport(path) as a, SQLiteTransport(path) as b:
        a.publish("g", "x")
        old = a.claim("w", 30)
        b.release(old)
        new = b.claim("w", 30)
        assert (new.seq, new.attempt, new.worker_id) == (old.seq, old.attempt, old.worker_id)
        for transport in (a, b):
            with pytest.raises(LeaseLost):
                transport.extend(old, 30)
            with pytest.raises(LeaseLost):
                transport.ack(old)
        rebuilt = leasequeue.Lease(old.seq, old.group_id, None, old.worker_id, 0.0, old.attempt)
        assert b.extend(rebuilt, 60).attempt == new.attempt
        extended = a.extend(new, 90)  # the issued new lease, extended: still fenced to its delivery
        a.ack(extended)
        assert len(b) == 0


def test_retry_closes_an_expired_delivery(tmp_path: Any) -> None:
    clock = ManualClock(1000.0)
    with SQLiteTransport(tmp_path / "q.db", clock=clock) as t:
        t.publish("g", "x")
        first = t.claim("w", 5)
        t.nack(first)
        second = t.claim("w", 5)
        assert second.attempt == 2
        assert t.retry("g") is False  # under a live lease
        clock.advance(6.0)
        assert t.retry("g") is True
        with pytest.raises(LeaseLost):
            t.ack(second)  # its delivery was closed by retry
        third = t.claim("w", 5)
        assert (third.seq, third.attempt) == (second.seq, 1)
        t.ack(third)


# -- bad input ---------------------------------------------------------------------------------


class CountingClock:
    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return 1000.0 + self.reads


def test_bad_part_5_input_raises_reads_no_clock_and_changes_nothing(tmp_path: Any) -> None:
    path = tmp_path / "q.db"
    clock = CountingClock()
    with SQLiteTransport(path, clock=clock, dedup_window=5.0) as t:
        t.publish("g", 1, key="k")
        t.publish("g", 2, delay=50.0)
        lease = t.claim("w", 30)
        before, reads = dump(path), clock.reads
        bad: List[Tuple[Any, type]] = [
            (lambda: t.publish("g", 3, delay=-1.0), ValueError),
            (lambda: t.publish("g", 3, delay=math.nan), ValueError),
            (lambda: t.publish("g", 3, delay="1"), TypeError),
            (lambda: t.publish("g", 3, delay=True), TypeError),
            (lambda: t.publish("g", 3, key=5), TypeError),
            (lambda: t.publish("g", 3, key=b"k"), TypeError),
            (lambda: t.publish(5, 3, delay=1.0, key="k"), TypeError),
            (lambda: t.publish("g", 3, priority=2**63, delay=1.0), OverflowError),
            (lambda: t.publish_many([("g", 1, 0, "a"), ("g", 2, 0, 7)]), TypeError),
            (lambda: t.publish_many([("g", 1, 0, "a"), ("g", 2, 0, "b", 9)]), ValueError),
            (lambda: t.publish_many([("g", 1, 0, "a")], delay=-1.0), ValueError),
            (lambda: t.publish_many([("g", 1, 0, "a")], delay=None), TypeError),
            (lambda: t.release("lease"), TypeError),
            (lambda: t.release(lease, -1.0), ValueError),
            (lambda: t.release(lease, math.nan), ValueError),
            (lambda: t.retry(5), TypeError),
            (lambda: t.retry(None), TypeError),
        ]
        for call, error in bad:
            with pytest.raises(error):
                call()
        assert clock.reads == reads, "a bad call read the clock"
        assert dump(path) == before
        # a stale lease: LeaseLost, and nothing changed but the time release(delay) read
        stale = leasequeue.Lease(lease.seq, lease.group_id, None, lease.worker_id, 0.0, lease.attempt + 1)
        with pytest.raises(LeaseLost):
            t.release(stale)
        with pytest.raises(LeaseLost):
            t.release(stale, 3.0)
        assert dump(path) == before
    for value, error in [(-1.0, ValueError), (math.nan, ValueError), (True, TypeError), ("1", TypeError)]:
        with pytest.raises(error):
            SQLiteTransport(tmp_path / "other.db", dedup_window=value)
    assert not (tmp_path / "other.db").exists()


# -- threads -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(2))
def test_threads_with_keys_delays_release_and_retry_lose_nothing(tmp_path: Any, seed: int) -> None:
    """Publishers (keyed, some delayed), workers (ack, release, nack) and an
    operator (retry) on two instances of one file, at once."""
    path = tmp_path / "q.db"
    groups = [f"g{i}" for i in range(6)]
    published: Dict[Tuple[str, str], Set[int]] = {}  # (group, key) -> the seqs its publishes returned
    seq_group: Dict[int, str] = {}
    acked: List[Tuple[str, int]] = []
    inflight: Set[int] = set()
    guard = threading.Lock()
    errors: List[BaseException] = []
    stop = threading.Event()
    with SQLiteTransport(path, dedup_window=math.inf) as a, SQLiteTransport(path, dedup_window=math.inf) as b:

        def publisher(n: int) -> None:
            rng = random.Random(seed * 100 + n)
            t = (a, b)[n % 2]
            try:
                for i in range(60):
                    group, key = rng.choice(groups), f"k{rng.randrange(40)}"
                    if rng.random() < 0.3:
                        seqs = t.publish_many([(group, (group, key), 0, key), (group, (group, key), 0, key)],
                                              delay=rng.choice([0.0, 0.01]))
                        assert seqs[0] == seqs[1]  # the repeat in one batch is the same message
                        seq = seqs[0]
                    else:
                        seq = t.publish(group, (group, key), key=key, delay=rng.choice([0.0, 0.0, 0.02]))
                    with guard:
                        published.setdefault((group, key), set()).add(seq)
                        seq_group[seq] = group
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        def worker(n: int) -> None:
            rng = random.Random(seed * 1000 + n)
            t = (a, b)[n % 2]
            try:
                while not stop.is_set():
                    lease = t.claim(f"w{n}", 60, timeout=0.05)
                    if lease is None:
                        continue
                    with guard:
                        assert lease.seq not in inflight, "delivered to two workers at once"
                        inflight.add(lease.seq)
                    roll = rng.random()
                    with guard:
                        inflight.discard(lease.seq)
                        try:
                            if roll < 0.6:
                                t.ack(lease)
                                acked.append((lease.group_id, lease.seq))
                            elif roll < 0.8:
                                t.release(lease, rng.choice([0.0, 0.005]))
                            else:
                                t.nack(lease)
                        except BaseException:
                            inflight.add(lease.seq)
                            raise
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        def operator() -> None:
            rng = random.Random(seed)
            try:
                while not stop.is_set():
                    (a, b)[rng.randrange(2)].retry(rng.choice(groups))
                    time.sleep(0.002)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        publishers = [threading.Thread(target=publisher, args=(n,)) for n in range(3)]
        others = [threading.Thread(target=worker, args=(n,)) for n in range(4)] + [threading.Thread(target=operator)]
        for thread in publishers + others:
            thread.start()
        for thread in publishers:
            thread.join(120)
        deadline = time.monotonic() + 60
        while len(a) and time.monotonic() < deadline and not errors:
            time.sleep(0.05)
        stop.set()
        for thread in others:
            thread.join(60)
        assert not errors, errors[:3]
        assert len(a) == 0 and a.stats().scheduled == 0
    # One message per (group, key): a window of +inf holds every key for good.
    assert all(len(seqs) == 1 for seqs in published.values())
    distinct = {seq for seqs in published.values() for seq in seqs}
    assert sorted(seq for _, seq in acked) == sorted(distinct)  # each acked once, none lost
    for group in groups:  # FIFO per group
        order = [seq for g, seq in acked if g == group]
        assert order == sorted(order), group


def test_keys_that_hold_nothing_are_forgotten(tmp_path: Any) -> None:
    """lq_keys keeps the keys of one window: after their messages left and
    their window passed, each keyed publish forgets up to 16 of them, while a
    key whose message is still stored stays held however long it waits."""
    path = tmp_path / "q.db"
    clock = ManualClock(1000.0)

    def rows() -> int:
        conn = sqlite3.connect(str(path))
        try:
            return int(conn.execute("SELECT count(*) FROM lq_keys").fetchone()[0])
        finally:
            conn.close()

    with SQLiteTransport(path, clock=clock, dedup_window=5.0) as t:
        waiting = t.publish("slow", "x", key="kept")
        t.pause("slow")  # never claimed: its key stays held by its message
        t.publish_many([(f"g{i}", i, 0, f"k{i}") for i in range(100)])  # seqs 2 .. 101
        for _ in range(100):
            t.ack(t.claim("w", 30))
        assert len(t) == 1 and rows() == 101
        assert t.publish("g7", "again", key="k7") == 9  # its message left, the window holds it
        clock.advance(3600.0)
        for i in range(7):
            t.publish("other", i, key=f"new{i}")
        assert rows() == 1 + 7  # 7 x 16 >= 100: every key that held nothing is forgotten
        assert t.publish("slow", "y", key="kept") == waiting  # still held by its stored message
        assert t.publish("g7", "again", key="k7") > 101  # no longer held: a new message


def test_the_watcher_moves_no_time_once_no_claim_waits(tmp_path: Any) -> None:
    """The watcher's last round can run after the last waiting claim left;
    its clock reading then must not move the transport's time, which an ack
    (it reads no clock) uses to tell whether the next head is scheduled:
    a manual clock jumped ahead and back must leave the time where the
    operations put it (found by check_differential, seed 31, as a race)."""
    path = tmp_path / "q.db"
    clock = ManualClock(1000.0)
    with SQLiteTransport(path, clock=clock) as t:
        t.publish("g", "first")
        t.publish("g", "second", delay=100.0)  # due at 1100
        lease = t.claim("w", 5.0)  # a lock end at 1005: the watcher would apply it
        clock.set(2000.0)
        t._expire_due(1005.0)  # the watcher's round, no claim waiting
        clock.set(1001.0)
        t.ack(lease)
        assert t.group("g").state == "scheduled"  # the time is 1001, not 2000
        assert t.stats().scheduled == 1
