"""A message whose stored event does not decode is a poison message like any
other (docs/contract.md, Part 5, "Operating it"): the worker buries its group
with the decode error as the reason, counts and hooks it as ``buried``, never
loops on it nor pauses its claims, and every healthy group goes on.

Two kinds of poison, on a real SQLite file and the suite's PostgreSQL:
``format`` (pickle bytes read by a worker whose transport decodes JSON) and
``class`` (the pickle of a class defined in another process's ``__main__``,
which the worker's process cannot import).  One poison group is the first
group (the runner's waiting claim meets it), another sits among the healthy
ones (a ``claim_many`` batch or a slot's own claim meets it, with decodable
leases around it that must still run).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import pytest
from worker_helpers import wait_until

from leasequeue import Worker

GROUPS = 8
PER_GROUP = 5  # 40 healthy jobs

_PUBLISH_MAIN_CLASS = """
import sys
sys.path.insert(0, {src!r})
from leasequeue import {kind}

class Local:  # defined in this process's __main__: no other process can unpickle it
    pass

t = {make}
t.publish({group!r}, Local())
t.close()
"""


def _transport(backend: Any, serializer: Optional[str]) -> Any:
    if backend.name == "sqlite":
        from leasequeue import SQLiteTransport

        t = SQLiteTransport(backend.path, serializer=serializer)
    else:
        backend.make()  # the queue (and backend.conninfo)
        from leasequeue import PostgresTransport

        t = PostgresTransport(backend.conninfo, queue=backend.queue, serializer=serializer)
    backend.made.append(t)
    return t


def _publish_poison(backend: Any, kind: str, group: str) -> None:
    if kind == "format":
        _transport(backend, "pickle").publish(group, {"not": "json"})  # pickle bytes
        return
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    if backend.name == "sqlite":
        make = f"SQLiteTransport({backend.path!r})"
        cls = "SQLiteTransport"
    else:
        make = f"PostgresTransport({backend.conninfo!r}, queue={backend.queue!r})"
        cls = "PostgresTransport"
    code = _PUBLISH_MAIN_CLASS.format(src=os.path.abspath(src), kind=cls, make=make, group=group)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("kind", ["format", "class"])
def test_an_undecodable_event_buries_its_group_and_the_rest_go_on(
        durable: Any, start: Any, kind: str, concurrency: int, runner: str) -> None:
    serializer = "json" if kind == "format" else "pickle"
    t = _transport(durable, serializer)
    _publish_poison(durable, kind, "poison-0")  # the first group
    items: List[Any] = []
    for n in range(PER_GROUP):
        for g in range(GROUPS):
            items.append((f"g{g}", [g, n]))
            if g == 2 and n == 0:
                items.append(("poison-1", None))  # a placeholder: published below, in this place
    for group, event in items:
        if group == "poison-1":
            _publish_poison(durable, kind, group)
        else:
            t.publish(group, event)

    done: Dict[str, List[int]] = {}
    lock = threading.Lock()
    buried_hook: List[Any] = []

    def record(job: Any) -> None:
        with lock:
            done.setdefault(job.group_id, []).append(job.event[1])

    if runner == "threads":
        def handler(job: Any) -> None:
            record(job)
    else:
        async def handler(job: Any) -> None:  # type: ignore[misc]
            record(job)
            await asyncio.sleep(0)

    worker = Worker(t, handler, concurrency=concurrency, visibility=30.0,
                    hooks={"buried": lambda job, error: buried_hook.append((job.group_id, error))})
    began = time.perf_counter()
    running = start(worker, runner)

    def healthy_done() -> bool:
        with lock:
            return sum(len(v) for v in done.values()) == GROUPS * PER_GROUP

    wait_until(healthy_done, timeout=30.0)
    elapsed = time.perf_counter() - began
    wait_until(lambda: worker.counts["buried"] == 2, timeout=10.0)
    running.stop()
    print(f"\n{durable.name} {kind} {runner} concurrency={concurrency}: the 40 healthy jobs took {elapsed:.3f} s")

    assert {g: v for g, v in done.items()} == {f"g{g}": list(range(PER_GROUP)) for g in range(GROUPS)}
    counts = worker.counts
    assert counts["buried"] == 2 and counts["succeeded"] == GROUPS * PER_GROUP, counts
    assert counts["retried"] == 0 and counts["lost"] == 0, counts
    assert sorted(g for g, _ in buried_hook) == ["poison-0", "poison-1"]
    for group in ("poison-0", "poison-1"):
        info = t.group(group)
        assert info is not None and info.state == "buried", info
        assert info.reason is not None and info.reason.startswith("undecodable event: "), info.reason
        assert "(attempt 1)" in info.reason, info.reason
        assert "\n" not in info.reason
        assert "could not be deserialized" not in info.reason  # the cause, not the long claim message
    assert t.stats().buried == 2


def test_a_claim_many_batch_with_a_poison_buries_it_and_hands_the_rest_back(durable: Any) -> None:
    """``claim_many`` raised ``EventDecodeError`` carrying the whole batch:
    the undecodable message's group is buried, every other lease of the
    batch is handed back uncounted (``release``: claimable at once, its next
    delivery still attempt 1), nothing stays leased."""
    t = _transport(durable, "json")
    t.publish("g1", [1])
    _publish_poison(durable, "format", "g2")
    t.publish("g3", [3])
    outcomes: List[Any] = []
    w = Worker(t, lambda job: None, visibility=30.0,
               hooks={o: (lambda o: lambda job, error: outcomes.append((o, job.group_id)))(o)
                      for o in ("buried", "handed_back")})
    from leasequeue import EventDecodeError

    with pytest.raises(EventDecodeError) as info:
        t.claim_many("w", 30.0, 10)
    assert [lease.group_id for lease in info.value.leases] == ["g1", "g2", "g3"]
    w._recorder.undecodable(info.value)
    assert sorted(outcomes) == [("buried", "g2"), ("handed_back", "g1"), ("handed_back", "g3")]
    assert w.counts["buried"] == 1 and w.counts["handed_back"] == 2
    assert t.group("g2").state == "buried" and t.group("g2").reason.startswith("undecodable event: ")
    assert t.stats().leased == 0
    again = sorted((lease.group_id, lease.attempt) for lease in t.claim_many("w", 30.0, 10))
    assert again == [("g1", 1), ("g3", 1)]
