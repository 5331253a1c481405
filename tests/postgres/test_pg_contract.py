"""The conformance kit on ``PostgresTransport``: ``TransportContract`` (every
rule of the contract, one test each) on a fresh queue per transport, and
``check_differential`` against ``ReferenceTransport`` on an injected manual
clock.

Only what a durable backend legitimately does differently is switched off
or adapted through the kit's flags, as for SQLite: events are stored
serialized (``preserves_identity=False``), ``close()`` closes the
connections (``usable_after_close=False``), and a lease is named by its
fields, so one rebuilt from them is current (``accepts_rebuilt_leases=True``).
The differential runs once more through several instances on one queue, so
that a lease issued by one instance is used on another.

``LEASEQUEUE_PG_DIFF_SEEDS`` seeds (6) of ``LEASEQUEUE_PG_DIFF_OPS``
operations (1200) each (half as many seeds through two instances).
"""

from __future__ import annotations

import os
import random
import uuid
from typing import Any, Callable, List

import pytest

from leasequeue import PostgresTransport
from leasequeue.testing import ManualClock, TransportContract, check_differential

SEEDS = int(os.environ.get("LEASEQUEUE_PG_DIFF_SEEDS", "6"))
OPS = int(os.environ.get("LEASEQUEUE_PG_DIFF_OPS", "1200"))


def fresh_queue() -> str:
    return f"k_{uuid.uuid4().hex[:16]}"


class TestPostgresTransport(TransportContract):
    preserves_identity = False
    usable_after_close = False
    accepts_rebuilt_leases = True

    @pytest.fixture(autouse=True)
    def _server(self, conninfo: str) -> None:
        self.conninfo = conninfo

    def make_transport(self, clock: Callable[[], float]) -> PostgresTransport:
        return PostgresTransport(self.conninfo, queue=fresh_queue(), clock=clock)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_differential_against_the_reference(conninfo: str, seed: int) -> None:
    """The same random operations (bad input, stale, forged and foreign
    leases, clock jumps, control plane, batches, close) on a fresh queue and
    on the reference give the same answers and the same errors."""
    made: List[PostgresTransport] = []

    def make(clock: ManualClock) -> PostgresTransport:
        transport = PostgresTransport(conninfo, queue=fresh_queue(), clock=clock)
        made.append(transport)
        return transport

    try:
        check_differential(make, ops=OPS, seed=seed, preserves_identity=False,
                           accepts_rebuilt_leases=True, usable_after_close=False)
    finally:
        for transport in made:
            transport.close()


class OneQueueManyInstances:
    """Several ``PostgresTransport`` instances on one queue, used as one
    transport: each call goes to one of them (chosen by a seeded generator),
    and now and then one is closed and a new one opened in its place.  A
    lease issued by one instance is acked, nacked or extended through
    another; nothing may live only in the instance that wrote it."""

    def __init__(self, conninfo: str, clock: ManualClock, seed: int, instances: int = 2,
                 reopen: float = 0.01) -> None:
        self._conninfo = conninfo
        self._queue = fresh_queue()
        self._clock = clock
        self._rng = random.Random(seed)
        self._reopen = reopen
        self._open = [self._new() for _ in range(instances)]
        self._closed = False

    def _new(self) -> PostgresTransport:
        return PostgresTransport(self._conninfo, queue=self._queue, clock=self._clock)

    def _pick(self) -> PostgresTransport:
        if not self._closed and self._rng.random() < self._reopen:
            i = self._rng.randrange(len(self._open))
            self._open[i].close()
            self._open[i] = self._new()
        return self._rng.choice(self._open)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._pick(), name)

    def __len__(self) -> int:
        return len(self._pick())

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        for transport in self._open:
            transport.close()


@pytest.mark.parametrize("seed", range(max(2, SEEDS // 2)))
def test_instances_on_one_queue_are_one_transport(conninfo: str, seed: int) -> None:
    """The differential through two instances on one queue, reopened at
    random: a lease is current on any instance of the queue, and the whole
    state is in the database."""
    made: List[OneQueueManyInstances] = []

    def make(clock: ManualClock) -> OneQueueManyInstances:
        transport = OneQueueManyInstances(conninfo, clock, seed=len(made))
        made.append(transport)
        return transport

    try:
        check_differential(make, ops=OPS, seed=1000 + seed, preserves_identity=False,
                           accepts_rebuilt_leases=True, usable_after_close=False)
    finally:
        for transport in made:
            transport.close()
