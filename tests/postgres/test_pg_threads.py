"""One PostgresTransport shared by many threads (its connection pool), and
several transports of one queue: every message is delivered, acked once,
in FIFO order per group, and no group has two leases at once."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any, Dict, List, Tuple


def test_threads_share_one_transport(make_pg: Any, queue_name: str) -> None:
    shared = make_pg(queue_name)
    other = make_pg(queue_name)  # a second transport (another "process") on the same queue
    groups, per_group = 40, 10
    shared.publish_many([(f"g{g}", (g, i)) for i in range(per_group) for g in range(groups)])
    held: Dict[str, str] = {}
    guard = threading.Lock()
    seen: Dict[str, List[int]] = defaultdict(list)
    errors: List[str] = []

    def work(t: Any, name: str) -> None:
        while True:
            lease = t.claim(name, 30, timeout=0.5)
            if lease is None:
                return
            with guard:
                if lease.group_id in held:
                    errors.append(f"{lease.group_id} leased to {held[lease.group_id]} and {name}")
                held[lease.group_id] = name
                seen[lease.group_id].append(lease.event[1])
            with guard:
                del held[lease.group_id]
            t.ack(lease)

    threads = [threading.Thread(target=work, args=(shared if k % 3 else other, f"w{k}")) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors[:5]
    assert len(shared) == 0
    order: List[Tuple[str, List[int]]] = sorted(seen.items())
    assert len(order) == groups
    for group, events in order:
        assert events == list(range(per_group)), f"{group}: {events}"
