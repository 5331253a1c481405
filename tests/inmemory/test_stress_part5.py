"""SPEC Part 5 under real threads, both implementations.

Two publishers publish the same list of keyed steps (a crashed-and-retried
producer, twice over, racing itself), some with a short delay, on a real
clock and a long ``dedup_window``; four workers claim (waiting, so the
expiry timer's wake-ups for due messages are what hands them some of the
work) and ack, or hand the message back with ``release`` (now or later) or
``nack``, and now and then try the lease they handed back, which must be
lost; an operator meanwhile calls ``retry`` on random groups, and pauses and
resumes some.  An independent log, under its own lock, proves:

* both publishers got the same seq for each step, and the seqs are exactly
  1..N (a held key uses no seq): each step was published once;
* never two live leases in one group (the leases never expire: visibility
  is an hour), and a lease handed back is never current again (fencing by
  delivery, whatever its attempt);
* a delivery's attempt is at least 1 and at most one more than the nacks of
  its message (release and retry never count);
* nothing lost, nothing doubled: every step is acked exactly once, in
  publish order within its group, and the transport ends empty.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from leasequeue import LeaseLost

GROUPS = 40
STEPS = 4000
WORKERS = 4
DEADLINE = 120.0


@pytest.fixture
def many_switches() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def test_keyed_publishers_releasing_workers_and_a_retrying_operator(
    make_transport: Callable[..., Any], many_switches: None
) -> None:
    transport = make_transport(clock=time.time, dedup_window=3600.0)
    visibility = 3600.0
    rng = random.Random(5)
    steps: List[Tuple[str, str, float]] = []  # (group, key, delay)
    for i in range(STEPS):
        steps.append((f"g{rng.randrange(GROUPS)}", f"step-{i}", rng.choice([0.0, 0.0, 0.0, 0.01, 0.03])))

    log = threading.Lock()
    seqs_of: List[List[Optional[int]]] = [[None] * STEPS, [None] * STEPS]
    holders: Dict[str, int] = {}  # group -> seq while a live lease holds it
    violations: List[str] = []
    acked: Counter[int] = Counter()
    ack_order: Dict[str, List[int]] = defaultdict(list)
    nacks: Counter[int] = Counter()
    counts = {"released": 0, "parked": 0, "stale": 0, "retried": 0, "paused": 0}
    errors: List[BaseException] = []
    stop = threading.Event()

    def publisher(p: int) -> None:
        for i, (group, key, delay) in enumerate(steps):
            seq = transport.publish(group, (group, key), delay=delay, key=key)
            seqs_of[p][i] = seq

    def worker(c: int) -> None:
        wrng = random.Random(100 + c)
        name = f"w{c}"
        while not stop.is_set():
            lease = transport.claim(name, visibility, 0, timeout=0.02)
            if lease is None:
                continue
            with log:
                if lease.group_id in holders:
                    violations.append(f"{lease.group_id}: {lease.seq} claimed while {holders[lease.group_id]} held")
                if not 1 <= lease.attempt <= nacks[lease.seq] + 1:
                    violations.append(f"{lease.seq}: attempt {lease.attempt} after {nacks[lease.seq]} nacks")
                holders[lease.group_id] = lease.seq
            roll = wrng.random()
            if roll < 0.75:
                with log:
                    del holders[lease.group_id]
                    ack_order[lease.group_id].append(lease.seq)
                    acked[lease.seq] += 1
                transport.ack(lease)
                continue
            with log:
                del holders[lease.group_id]
                if roll >= 0.95:
                    nacks[lease.seq] += 1
            if roll < 0.85:
                transport.release(lease)
                kind = "released"
            elif roll < 0.95:
                transport.release(lease, 0.005)
                kind = "parked"
            else:
                transport.nack(lease)
                kind = "nacked"
            with log:
                counts.setdefault(kind, 0)
                counts[kind] += 1
            if wrng.random() < 0.3:  # the handed-back delivery is closed for good
                try:
                    transport.ack(lease)
                except LeaseLost:
                    with log:
                        counts["stale"] += 1
                else:
                    with log:
                        violations.append(f"{lease.seq}: a released or nacked lease was acked")

    def operator() -> None:
        orng = random.Random(9)
        paused: List[str] = []
        while not stop.is_set():
            group = f"g{orng.randrange(GROUPS)}"
            if transport.retry(group):
                with log:
                    counts["retried"] += 1
            if orng.random() < 0.1 and transport.pause(group):
                paused.append(group)
                with log:
                    counts["paused"] += 1
            if paused and orng.random() < 0.3:
                transport.resume(paused.pop(0))
            time.sleep(0.0005)
        for group in paused:
            transport.resume(group)

    def guarded(target: Callable[..., None], *args: Any) -> Callable[[], None]:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                stop.set()

        return run

    pubs = [threading.Thread(target=guarded(publisher, p), daemon=True) for p in range(2)]
    works = [threading.Thread(target=guarded(worker, c), daemon=True) for c in range(WORKERS)]
    op = threading.Thread(target=guarded(operator), daemon=True)
    for thread in pubs + works + [op]:
        thread.start()
    for thread in pubs:
        thread.join(DEADLINE)
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline and not errors and len(acked) < STEPS:
        time.sleep(0.01)
    stop.set()
    for thread in works + [op]:
        thread.join(DEADLINE)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in pubs + works + [op]), "threads did not finish"
    assert violations == []
    assert seqs_of[0] == seqs_of[1], "the two publishers got different seqs for a step"
    assert sorted(seqs_of[0]) == list(range(1, STEPS + 1))  # type: ignore[type-var]
    assert sorted(acked) == list(range(1, STEPS + 1)), "a step was lost"
    assert set(acked.values()) == {1}, "a step was acked twice"
    for group, acks in ack_order.items():
        assert acks == sorted(acks), f"{group}: acked out of publish order"
    assert len(transport) == 0
    assert tuple(transport.stats()) == (0, 0, 0, 0, 0, 0, 0)
    # a step published again after its window still has its seq (the window is an hour)
    group, key, _ = steps[0]
    assert transport.publish(group, "again", key=key) == seqs_of[0][0]
    # the run did what it is about (counts of events, not timings)
    assert counts["released"] >= 20 and counts["parked"] >= 20 and counts["stale"] >= 10, counts
    assert counts["retried"] >= 20 and counts["paused"] >= 5, counts
    transport.close()
