"""The conformance kit on ``SQLiteTransport``: ``TransportContract`` (every
rule of the contract, one test each) with real database files in temporary
directories, and ``check_differential`` against ``ReferenceTransport`` on a
manual clock.

Only what a durable backend legitimately does differently is switched off
or adapted through the kit's flags: events are stored serialized
(``preserves_identity=False``), ``close()`` closes the connection
(``usable_after_close=False``), and a lease is named by its fields, so one
rebuilt from them is current (``accepts_rebuilt_leases=True``).  The
differential runs once more through several instances on one file, so that
a lease issued by one instance is used on another.
"""

from __future__ import annotations

import os
import random
from typing import Any, Callable

import pytest

from leasequeue import SQLiteTransport
from leasequeue.testing import ManualClock, TransportContract, check_differential

SEEDS = int(os.environ.get("LEASEQUEUE_SQLITE_DIFF_SEEDS", "12"))
OPS = int(os.environ.get("LEASEQUEUE_SQLITE_DIFF_OPS", "1500"))


class TestSQLiteTransport(TransportContract):
    preserves_identity = False
    usable_after_close = False
    accepts_rebuilt_leases = True

    @pytest.fixture(autouse=True)
    def _directory(self, tmp_path: Any) -> None:
        self.directory = tmp_path
        self.made = 0

    def make_transport(self, clock: Callable[[], float]) -> SQLiteTransport:
        self.made += 1
        return SQLiteTransport(self.directory / f"contract-{self.made}.db", clock=clock)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_differential_against_the_reference(tmp_path: Any, seed: int) -> None:
    """The same random operations (bad input, stale leases, clock jumps,
    control plane, batches) on a SQLite file and on the reference give the
    same answers and the same errors."""
    made = []

    def make(clock: ManualClock) -> SQLiteTransport:
        transport = SQLiteTransport(tmp_path / f"diff-{len(made)}.db", clock=clock)
        made.append(transport)
        return transport

    try:
        check_differential(make, ops=OPS, seed=seed, preserves_identity=False,
                           accepts_rebuilt_leases=True, usable_after_close=False)
    finally:
        for transport in made:
            transport.close()


class OneFileManyInstances:
    """Several ``SQLiteTransport`` instances on one file, used as one
    transport: each call goes to one of them (chosen by a seeded generator),
    and now and then one is closed and a new one opened in its place.  A
    lease issued by one instance is acked, nacked or extended through
    another; nothing may live only in the instance that wrote it."""

    def __init__(self, path: Any, clock: ManualClock, seed: int, instances: int = 2, reopen: float = 0.01) -> None:
        self._path = path
        self._clock = clock
        self._rng = random.Random(seed)
        self._reopen = reopen
        self._open = [SQLiteTransport(path, clock=clock) for _ in range(instances)]
        self._closed = False

    def _pick(self) -> SQLiteTransport:
        if not self._closed and self._rng.random() < self._reopen:
            i = self._rng.randrange(len(self._open))
            self._open[i].close()
            self._open[i] = SQLiteTransport(self._path, clock=self._clock)
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


@pytest.mark.parametrize("seed", range(max(2, SEEDS // 3)))
def test_instances_on_one_file_are_one_transport(tmp_path: Any, seed: int) -> None:
    """The differential through two instances on one file, reopened at random:
    a lease is current on any instance opened on the same file, and the
    whole state is in the file."""
    made = []

    def make(clock: ManualClock) -> OneFileManyInstances:
        transport = OneFileManyInstances(tmp_path / f"shared-{len(made)}.db", clock, seed=len(made))
        made.append(transport)
        return transport

    try:
        check_differential(make, ops=OPS, seed=1000 + seed, preserves_identity=False,
                           accepts_rebuilt_leases=True, usable_after_close=False)
    finally:
        for transport in made:
            transport.close()
