"""Checked by mypy (tests/typing/test_typing.py), never run: every backend is a ``Transport``.

Each assignment type-checks only if the backend has every method of the
protocol with a compatible signature; nothing here inherits from it.
"""

from __future__ import annotations

from typing import Any, List, Optional

import leasequeue
from leasequeue import (BatchTransport, ControlPlane, CoreTransport, Lease, LeaseLike, Quarantine, Transport,
                        WaitingTransport)
from leasequeue._backends.inmemory import transport_c, transport_py


def every_backend(path: str, conninfo: str) -> List[Transport[Any]]:
    selected: Transport[Lease] = leasequeue.InMemoryTransport()
    pure: Transport[transport_py.Lease] = leasequeue.PyInMemoryTransport()
    pure_module: Transport = transport_py.InMemoryTransport()
    compiled: Transport = transport_c.InMemoryTransport()
    sqlite: Transport = leasequeue.SQLiteTransport(path)
    postgres: Transport = leasequeue.PostgresTransport(conninfo)
    return [selected, pure, pure_module, compiled, sqlite, postgres]


def the_parts(t: Transport[Lease]) -> None:
    core: CoreTransport[Lease] = t
    waiting: WaitingTransport[Lease] = t
    control: ControlPlane = t
    batches: BatchTransport[Lease] = t
    quarantine: Quarantine[Lease] = t
    del core, waiting, control, batches, quarantine


def a_worker_loop(t: Transport[Any]) -> int:
    """Code typed against the protocol: a lease's fields are LeaseLike's."""
    done = 0
    lease: Optional[LeaseLike] = t.claim("w", 30.0, timeout=0)
    while lease is not None:
        seq: int = lease.seq
        group: str = lease.group_id
        attempt: int = lease.attempt
        del seq, group, attempt
        t.ack(lease)
        done += 1
        lease = t.claim("w", 30.0)
    return done


def a_lease_is_leaselike(lease: Lease) -> LeaseLike:
    return lease
