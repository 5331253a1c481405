"""The conformance kit on ``PostgresTransport``: ``TransportContract`` (every
rule of the contract, one test each) on a fresh queue per transport, and
``check_differential`` against ``ReferenceTransport`` on an injected manual
clock.

Only what a durable backend legitimately does differently is switched off
or adapted through the kit's flags, as for SQLite: events are stored
serialized (``preserves_identity=False``), ``close()`` closes the
connections (``usable_after_close=False``), and a lease is named by its
fields, so one rebuilt from them is current (``accepts_rebuilt_leases=True``).
Part 5 is on (``supports_later``, ``supports_once``, ``supports_release``),
and both checks build transports with the run's ``dedup_window``.
The differential runs once more through several instances on one queue, so
that a lease issued by one instance is used on another.

``LEASEQUEUE_PG_DIFF_SEEDS`` seeds (6) of ``LEASEQUEUE_PG_DIFF_OPS``
operations (1200) each (half as many seeds through two instances).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, List

import pytest

from leasequeue import PostgresTransport
from leasequeue.testing import ManualClock, TransportContract, check_differential

from helpers import ManyInstances

SEEDS = int(os.environ.get("LEASEQUEUE_PG_DIFF_SEEDS", "6"))
OPS = int(os.environ.get("LEASEQUEUE_PG_DIFF_OPS", "1200"))


def fresh_queue(conninfo: str) -> str:
    """A new queue (created: opening a missing one fails)."""
    name = f"k_{uuid.uuid4().hex[:16]}"
    PostgresTransport.create_queue(conninfo, name)
    return name


class TestPostgresTransport(TransportContract):
    preserves_identity = False
    usable_after_close = False
    accepts_rebuilt_leases = True
    supports_quarantine = True  # Part 4: bury, skip, peek
    supports_later = True  # Part 5: publish(delay=), scheduled heads
    supports_once = True  # Part 5: keys, dedup_window
    supports_release = True  # Part 5: release, retry, fencing by delivery
    supports_transactions = True  # Part 5, continued: conn= (the application's psycopg connection)

    def open_app_connection(self, transport: Any) -> Any:
        """A psycopg connection of the application's to the suite's database
        (closed by its context manager; the kit commits or rolls back)."""
        import psycopg

        return psycopg.connect(self.conninfo)

    @pytest.fixture(autouse=True)
    def _server(self, conninfo: str) -> None:
        self.conninfo = conninfo

    def make_transport(self, clock: Callable[[], float], *, dedup_window: float = 0.0) -> PostgresTransport:
        return PostgresTransport(self.conninfo, queue=fresh_queue(self.conninfo), clock=clock, dedup_window=dedup_window)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_differential_against_the_reference(conninfo: str, seed: int) -> None:
    """The same random operations (bad input, stale, forged and foreign
    leases, clock jumps, control plane, batches, close) on a fresh queue and
    on the reference give the same answers and the same errors."""
    made: List[PostgresTransport] = []

    def make(clock: ManualClock, dedup_window: float = 0.0) -> PostgresTransport:
        transport = PostgresTransport(conninfo, queue=fresh_queue(conninfo), clock=clock, dedup_window=dedup_window)
        made.append(transport)
        return transport

    try:
        check_differential(make, ops=OPS, seed=seed, preserves_identity=False,
                           accepts_rebuilt_leases=True, usable_after_close=False)
    finally:
        for transport in made:
            transport.close()


@pytest.mark.parametrize("seed", range(max(2, SEEDS // 2)))
def test_instances_on_one_queue_are_one_transport(conninfo: str, seed: int) -> None:
    """The differential through two instances on one queue, reopened at
    random: a lease is current on any instance of the queue, and the whole
    state is in the database."""
    made: List[ManyInstances] = []

    def make(clock: ManualClock, dedup_window: float = 0.0) -> ManyInstances:
        queue = fresh_queue(conninfo)
        transport = ManyInstances(
            lambda: PostgresTransport(conninfo, queue=queue, clock=clock, dedup_window=dedup_window), seed=len(made))
        made.append(transport)
        return transport

    try:
        check_differential(make, ops=OPS, seed=1000 + seed, preserves_identity=False,
                           accepts_rebuilt_leases=True, usable_after_close=False)
    finally:
        for transport in made:
            transport.close()
