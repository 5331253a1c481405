"""Quarantine under real threads, both implementations (SPEC Part 4).

Two publishers fill groups (one publisher per group, so a group's seqs are
in publish order) while four workers claim -- waiting, so that the wake-ups
of ``resume`` and ``skip`` are what hands them work -- and ack, now and then
``nack(0)``, and bury one message in twenty as poison.  An operator thread
meanwhile peeks, and looks at every group (``groups()``): a buried group it
resumes, skips or purges; any other group it sometimes tries to skip.  An
independent log, under its own lock, proves:

* never two live leases in one group (a worker enters the group in the log
  after its claim returned and leaves before it hands the message back; the
  operator purges only buried groups, which no lease holds);
* each delivery of a message is its previous attempt + 1 (no lease expires:
  the clock is frozen), so a bury or a resume never loses or repeats one;
* nothing lost: every published message is acked exactly once, or removed
  by a ``skip`` that returned True or a ``purge`` (counted), and at the end
  the transport is empty;
* FIFO: within a group, the acked seqs come in publish order (skipping a
  head or burying it never lets a later message overtake it);
* a skip never takes a leased head from its worker (whose ack would then
  raise ``LeaseLost``, failing the test);
* what the operator sees is consistent: a peek is the group's oldest
  messages in seq order, and a group reports a reason exactly when buried.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

from leasequeue import LeaseLost
from leasequeue.testing import ManualClock

PUBLISHERS = 2
WORKERS = 4
GROUPS_PER_PUBLISHER = 60
MESSAGES_PER_PUBLISHER = 2500
POISON = 0.05
DEADLINE = 120.0  # seconds for a phase; only a hang comes near it


@pytest.fixture
def many_switches() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def test_operator_buries_skips_and_peeks_while_workers_run(
    make_transport: Callable[..., Any], many_switches: None
) -> None:
    transport = make_transport(clock=ManualClock())
    visibility = 3600.0  # never expires: the clock is frozen

    log = threading.Lock()
    holders: Dict[str, Tuple[int, str]] = {}  # group -> (seq, worker) while leased
    violations: List[str] = []
    published: Dict[str, List[int]] = defaultdict(list)  # group -> seqs in publish order
    acked: Counter[int] = Counter()
    ack_order: Dict[str, List[int]] = defaultdict(list)
    attempts: Dict[int, int] = {}  # seq -> attempt of its latest delivery
    removed = {"skip": 0, "purge": 0, "buried": 0, "resumed": 0, "peeks": 0}
    poison = threading.Event()
    poison.set()
    stop_operator = threading.Event()
    stop_workers = threading.Event()
    errors: List[BaseException] = []

    def publisher(p: int) -> None:
        rng = random.Random(p)
        groups = [f"p{p}-g{k}" for k in range(GROUPS_PER_PUBLISHER)]
        for i in range(MESSAGES_PER_PUBLISHER):
            group = rng.choice(groups)
            seq = transport.publish(group, (p, i), priority=rng.randrange(2))
            with log:
                published[group].append(seq)

    def worker(c: int) -> None:
        rng = random.Random(100 + c)
        name = f"w{c}"
        while not stop_workers.is_set():
            lease = transport.claim(name, visibility, 0, timeout=0.02)
            if lease is None:
                continue
            with log:
                if lease.group_id in holders:
                    violations.append(f"{lease.group_id}: {lease.seq} claimed while {holders[lease.group_id]} held")
                if lease.attempt != attempts.get(lease.seq, 0) + 1:
                    violations.append(f"{lease.seq}: attempt {lease.attempt} after {attempts.get(lease.seq, 0)}")
                attempts[lease.seq] = lease.attempt
                holders[lease.group_id] = (lease.seq, name)
            roll = rng.random()
            with log:
                del holders[lease.group_id]
            if roll < POISON and poison.is_set():
                transport.bury(lease, f"poison: attempt {lease.attempt}")
                with log:
                    removed["buried"] += 1
            elif roll < POISON + 0.05:
                transport.nack(lease)
            else:
                with log:
                    ack_order[lease.group_id].append(lease.seq)
                    acked[lease.seq] += 1
                transport.ack(lease)

    def operator() -> None:
        rng = random.Random(7)
        while not stop_operator.is_set():
            snapshot = transport.groups()
            for info in snapshot:
                if (info.state == "buried") != (info.reason is not None):
                    violations.append(f"{info.group_id}: state {info.state!r} with reason {info.reason!r}")
            buried = [info.group_id for info in snapshot if info.state == "buried"]
            for group in buried:  # only the operator lifts a bury: it stays buried until then
                peeked = transport.peek(group, 5)
                seqs = [m.seq for m in peeked]
                if not seqs or seqs != sorted(seqs) or peeked[0].attempt < 1:
                    violations.append(f"{group}: peek of a buried group gave {peeked!r}")
                with log:
                    removed["peeks"] += 1
                what = rng.random()
                if what < 0.5:
                    assert transport.resume(group) is True
                    with log:
                        removed["resumed"] += 1
                elif what < 0.95:
                    assert transport.skip(group) is True
                    with log:
                        removed["skip"] += 1
                else:
                    count = transport.purge(group)
                    assert count >= 1
                    with log:
                        removed["purge"] += count
            leased = [info.group_id for info in snapshot if info.state == "leased"]
            for group in rng.sample(leased, min(3, len(leased))):
                # a live lease holds the head: refused, unless the worker has handed it back
                # since the snapshot and another head is there to skip (then counted)
                if transport.skip(group):
                    with log:
                        removed["skip"] += 1
            if snapshot:
                group = rng.choice(snapshot).group_id
                peeked = transport.peek(group, rng.choice([1, 3, 100]))
                seqs = [m.seq for m in peeked]
                if seqs != sorted(seqs) or any(m.attempt and i for i, m in enumerate(peeked)):
                    violations.append(f"{group}: peek gave {peeked!r}")
                with log:
                    removed["peeks"] += 1
                if rng.random() < 0.05 and transport.skip(group):  # a ready head (a leased one stays)
                    with log:
                        removed["skip"] += 1
            time.sleep(0.001)

    def guarded(target: Callable[..., None], *args: Any) -> Callable[[], None]:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                stop_operator.set()
                stop_workers.set()

        return run

    pubs = [threading.Thread(target=guarded(publisher, p), daemon=True) for p in range(PUBLISHERS)]
    works = [threading.Thread(target=guarded(worker, c), daemon=True) for c in range(WORKERS)]
    op = threading.Thread(target=guarded(operator), daemon=True)
    for thread in pubs + works + [op]:
        thread.start()
    for thread in pubs:
        thread.join(DEADLINE)
    time.sleep(0.2)  # the operator and the poison go on a little past the publishing
    stop_operator.set()
    op.join(DEADLINE)
    poison.clear()
    # The end: lift every bury left, and let the workers drain everything.
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline and not errors:
        for info in transport.groups():
            if info.state == "buried":
                transport.resume(info.group_id)
        if len(transport) == 0:
            break
        time.sleep(0.01)
    stop_workers.set()
    for thread in works:
        thread.join(DEADLINE)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in pubs + works + [op]), "threads did not finish"
    assert violations == []
    total = PUBLISHERS * MESSAGES_PER_PUBLISHER
    all_seqs = sorted(seq for seqs in published.values() for seq in seqs)
    assert all_seqs == list(range(1, total + 1))
    assert set(acked.values()) <= {1}, "a message was acked twice"
    # nothing lost: acked, or removed by a skip or a purge (counted)
    assert len(acked) + removed["skip"] + removed["purge"] == total, (len(acked), removed)
    for group, seqs in ack_order.items():
        assert seqs == sorted(seqs), f"{group}: acked out of publish order"
        assert set(seqs) <= set(published[group])
    assert len(transport) == 0
    assert tuple(transport.stats()) == (0, 0, 0, 0, 0, 0, 0)
    assert transport.groups() == []
    # the run did what it is about (not a timing requirement: counts of events)
    assert removed["buried"] >= 20 and removed["resumed"] >= 5 and removed["skip"] >= 5, removed
    assert removed["peeks"] >= 20, removed
    with pytest.raises(LeaseLost):  # and a stale lease still cannot bury anything
        lease = None
        transport.publish("after", 1)
        lease = transport.claim("w", visibility)
        transport.ack(lease)
        transport.bury(lease, "stale")
