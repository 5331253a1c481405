"""The seed's algorithm, literally: the ``seed`` column of the benchmark.

This is the design note's in-memory transport as it was written (see
``docs/contract.md``, "Where the algorithm came from"): a list of message
dicts sorted on every claim.  It is here as the baseline for *how slow* the
obvious implementation is, not as a transport anyone should use.

The conformance kit's ``leasequeue.testing.ReferenceTransport`` is the same
algorithm with the contract's fencing and round-robin rule added; once it has
landed this module can become a thin wrapper of it.
"""

from __future__ import annotations

import threading
import time
from collections import namedtuple
from typing import Any, Callable, Dict, List, Optional

__all__ = ["SeedLease", "SeedTransport"]

SeedLease = namedtuple("SeedLease", ["seq", "group_id", "event"])


class SeedTransport:
    """The design note's in-memory transport, literally (for comparison only).

    A list of message dicts and a dict of group dicts under one
    ``threading.Lock``; ``claim`` sorts *every* message by
    ``(group.last_claimed_at, seq)`` and takes the first available one:
    O(N log N) per claim.  ``ack`` and ``nack`` find the message by a linear
    scan.  No validation, no fencing: this is the reference for *what* is
    chosen and the baseline for *how fast*, not a usable transport.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._messages: List[Dict[str, Any]] = []
        self._groups: Dict[str, Dict[str, Any]] = {}
        self._seq = 0
        self._lock = threading.Lock()

    def publish(self, group_id: str, event: Any, priority: int = 0) -> int:
        """Append a message; create the group on its first publish."""
        with self._lock:
            self._seq += 1
            self._messages.append(
                {"seq": self._seq, "group_id": group_id, "event": event, "locked_by": None, "lock_expiry": 0.0}
            )
            self._groups.setdefault(group_id, {"last_claimed_at": 0.0, "priority": priority})
            return self._seq

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Optional[SeedLease]:
        """Sort all messages, lease the first available one of a free group."""
        now = self._clock()
        with self._lock:
            messages = self._messages
            groups = self._groups
            in_flight = {
                m["group_id"] for m in messages if m["locked_by"] is not None and m["lock_expiry"] >= now
            }
            for m in sorted(messages, key=lambda m: (groups[m["group_id"]]["last_claimed_at"], m["seq"])):
                available = m["locked_by"] is None or m["lock_expiry"] < now
                if not available or m["group_id"] in in_flight:
                    continue
                if groups[m["group_id"]]["priority"] < min_priority:
                    continue
                m["locked_by"] = worker_id
                m["lock_expiry"] = now + visibility
                groups[m["group_id"]]["last_claimed_at"] = now
                return SeedLease(m["seq"], m["group_id"], m["event"])
            return None

    def ack(self, lease: SeedLease) -> None:
        """Remove the message by seq; forget its group when it is empty."""
        with self._lock:
            messages = self._messages
            for i, m in enumerate(messages):
                if m["seq"] == lease.seq:
                    del messages[i]
                    break
            gid = lease.group_id
            if not any(m["group_id"] == gid for m in messages):
                self._groups.pop(gid, None)

    def nack(self, lease: SeedLease, delay: float = 0.0) -> None:
        """Free the message for retry (delay 0) or park it for ``delay`` s."""
        now = self._clock() if delay > 0 else 0.0
        with self._lock:
            for m in self._messages:
                if m["seq"] == lease.seq:
                    if delay > 0:
                        m["locked_by"] = "__parked__"
                        m["lock_expiry"] = now + delay
                    else:
                        m["locked_by"] = None
                        m["lock_expiry"] = 0.0
                    break

    def __len__(self) -> int:
        return len(self._messages)

    def close(self) -> None:
        """No-op."""
