"""Real threads on one transport, both implementations.

Four publishers fill thousands of groups while four claimers claim, extend,
nack(0) and ack.  An independent log, under its own lock, proves:

* never two live leases in one group: a claimer enters the group in the log
  after its claim returned and leaves it *before* it hands the message back
  (ack/nack), so the next claim of that group can only enter after the
  previous holder left; a group found occupied is a violation;
* nothing lost, nothing doubled: every published seq is acked exactly once;
* FIFO: each group's messages are acked in publish order;
* the transport ends empty: ``len == 0``, ``stats() == (0, 0, 0, 0, 0, 0, 0)``.

No lease expires (frozen fake clock, or the real clock with a visibility far
longer than the test), so a second live lease could only come from a race.
The switch interval is lowered to force many thread switches.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any, Callable, Iterator

import pytest

from leasequeue.testing import ManualClock

PUBLISHERS = 4
CLAIMERS = 4
GROUPS_PER_PUBLISHER = 1000
MESSAGES_PER_PUBLISHER = 4000
DEADLINE = 60.0  # seconds for all threads together; only a hang comes near it


def join_all(threads: list[threading.Thread], stop: threading.Event) -> None:
    """Join within one overall deadline; then tell stragglers to stop."""
    end = time.monotonic() + DEADLINE
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    stop.set()


@pytest.fixture
def many_switches() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


@pytest.mark.parametrize(
    "clock_kind, groups_per_publisher",
    [("fake", GROUPS_PER_PUBLISHER), ("default", GROUPS_PER_PUBLISHER), ("fake", 4)],
    ids=["fake-clock-4000-groups", "real-clock-4000-groups", "fake-clock-16-hot-groups"],
)
def test_publishers_and_claimers_at_once(
    make_transport: Callable[..., Any], clock_kind: str, groups_per_publisher: int, many_switches: None
) -> None:
    transport = make_transport(clock=ManualClock()) if clock_kind == "fake" else make_transport()
    visibility = 3600.0

    log_lock = threading.Lock()
    holders: dict[str, tuple[int, str]] = {}  # group -> (seq, worker) while leased
    violations: list[str] = []
    published: dict[str, list[int]] = defaultdict(list)  # group -> seqs in publish order
    acked: Counter[int] = Counter()
    done = [0]  # acks so far
    ack_order: dict[str, list[int]] = defaultdict(list)
    publishers_done = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []
    total = PUBLISHERS * MESSAGES_PER_PUBLISHER

    def publisher(p: int) -> None:
        rng = random.Random(p)
        groups = [f"p{p}-g{k}" for k in range(groups_per_publisher)]
        for i in range(MESSAGES_PER_PUBLISHER):
            group = rng.choice(groups)
            # one publisher per group: the seqs of a group are in publish order
            seq = transport.publish(group, (p, i), priority=rng.randrange(3))
            published[group].append(seq)

    def claimer(c: int) -> None:
        rng = random.Random(100 + c)
        worker = f"w{c}"
        while not stop.is_set():
            lease = transport.claim(worker, visibility, min_priority=rng.choice([0, 0, 0, 1]))
            if lease is None:
                with log_lock:
                    finished = publishers_done.is_set() and done[0] >= total
                if finished:
                    return
                continue
            with log_lock:
                if lease.group_id in holders:
                    violations.append(f"{lease.group_id}: {lease.seq} claimed while {holders[lease.group_id]} held")
                holders[lease.group_id] = (lease.seq, worker)
            roll = rng.random()
            if roll < 0.1:
                lease = transport.extend(lease, visibility)
            if roll > 0.9:
                with log_lock:
                    del holders[lease.group_id]
                transport.nack(lease)  # retried, by whoever claims next
                continue
            with log_lock:
                del holders[lease.group_id]
                ack_order[lease.group_id].append(lease.seq)
            transport.ack(lease)
            with log_lock:
                acked[lease.seq] += 1
                done[0] += 1

    def guarded(target: Callable[[int], None], n: int) -> Callable[[], None]:
        def run() -> None:
            try:
                target(n)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                publishers_done.set()

        return run

    pubs = [threading.Thread(target=guarded(publisher, p), daemon=True) for p in range(PUBLISHERS)]
    claims = [threading.Thread(target=guarded(claimer, c), daemon=True) for c in range(CLAIMERS)]
    for thread in pubs + claims:
        thread.start()
    join_all(pubs, stop)
    publishers_done.set()
    stop.clear()
    join_all(claims, stop)
    if errors:
        raise errors[0]
    assert violations == []
    assert not any(t.is_alive() for t in pubs + claims), (
        f"threads did not finish (deadlock or lost message): {done[0]} of {total} acked, "
        f"len={len(transport)}"
    )
    all_seqs = sorted(seq for seqs in published.values() for seq in seqs)
    assert all_seqs == list(range(1, total + 1))  # every publish got a distinct seq
    assert set(acked) == set(all_seqs) and set(acked.values()) == {1}  # each acked exactly once
    for group, seqs in published.items():
        assert ack_order[group] == seqs, f"{group} not FIFO"
    assert len(transport) == 0
    assert tuple(transport.stats()) == (0, 0, 0, 0, 0, 0, 0)


def test_many_threads_one_group_serialised(make_transport: Callable[..., Any], many_switches: None) -> None:
    """Eight claimers fight over one group: never two holders, FIFO kept."""
    transport = make_transport(clock=ManualClock())
    count = 3000
    for i in range(count):
        transport.publish("hot", i)
    log_lock = threading.Lock()
    holder: list[int] = []
    violations: list[str] = []
    order: list[int] = []
    stop = threading.Event()

    def claimer() -> None:
        while not stop.is_set():
            lease = transport.claim("w", 60.0)
            if lease is None:
                with log_lock:
                    if len(order) >= count:
                        return
                continue
            with log_lock:
                if holder:
                    violations.append(f"{lease.seq} claimed while {holder[0]} held")
                holder.append(lease.seq)
                order.append(lease.event)
            with log_lock:
                holder.remove(lease.seq)  # leave the log before handing it back
            transport.ack(lease)

    threads = [threading.Thread(target=claimer, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    join_all(threads, stop)
    assert not any(t.is_alive() for t in threads), "threads did not finish (deadlock or lost message)"
    assert violations == []
    assert order == list(range(count))
    assert len(transport) == 0
