"""One PostgresTransport shared by many threads (its connection pool), and
another transport of the same queue: every message is delivered and acked
once, in FIFO order per group, and no group has two leases at once."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any, Dict, List, Tuple


def test_threads_share_one_transport(make_pg: Any, queue_name: str) -> None:
    shared = make_pg(queue_name)
    other = make_pg(queue_name)  # a second transport (another "process") on the same queue
    groups, per_group = 40, 10
    shared.publish_many([(f"g{g}", (g, i)) for i in range(per_group) for g in range(groups)])
    guard = threading.Lock()
    # group -> (claim returned, ack called, event index) of each delivery, by
    # time.monotonic(): a group's next claim commits after its previous ack
    # committed, so these intervals of one group never overlap.
    held: Dict[str, List[Tuple[float, float, int]]] = defaultdict(list)
    errors: List[BaseException] = []

    def work(t: Any, name: str) -> None:
        try:
            while (lease := t.claim(name, 30, timeout=0.5)) is not None:
                claimed = time.monotonic()
                time.sleep(0.001)  # some work: overlapping leases would show
                acking = time.monotonic()
                t.ack(lease)
                with guard:
                    held[lease.group_id].append((claimed, acking, lease.event[1]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(shared if k % 3 else other, f"w{k}")) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors[:3]
    assert len(shared) == 0
    assert sorted(held) == sorted(f"g{g}" for g in range(groups))
    for group, deliveries in held.items():
        deliveries.sort()
        assert [index for _, _, index in deliveries] == list(range(per_group)), f"{group}: FIFO broken"
        for (_, acking, _), (claimed, _, _) in zip(deliveries, deliveries[1:]):
            assert claimed > acking, f"{group}: leased again before the previous ack was sent"
