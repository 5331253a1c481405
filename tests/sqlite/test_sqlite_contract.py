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

import contextlib
import os
import sqlite3
from typing import Any, Callable, Iterator

import pytest

from leasequeue import SQLiteTransport
from leasequeue.testing import ManualClock, TransportContract, check_differential

from helpers import ManyInstances

SEEDS = int(os.environ.get("LEASEQUEUE_SQLITE_DIFF_SEEDS", "12"))
OPS = int(os.environ.get("LEASEQUEUE_SQLITE_DIFF_OPS", "1500"))


class TestSQLiteTransport(TransportContract):
    preserves_identity = False
    usable_after_close = False
    accepts_rebuilt_leases = True
    supports_quarantine = True  # Part 4: bury, skip, peek
    supports_later = True  # Part 5: publish(delay=), scheduled heads
    supports_once = True  # Part 5: publish(key=), dedup_window
    supports_release = True  # Part 5: release, retry, fencing by delivery
    supports_transactions = True  # Part 5: conn=, the application's sqlite3 connection
    transactions_block_writers = True  # one writer per file: an open write transaction holds it

    @contextlib.contextmanager
    def open_app_connection(self, transport: SQLiteTransport) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(transport.path, timeout=self.liveness_timeout)
        try:
            yield conn
        finally:
            conn.close()

    def app_begin(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")  # the application's write transaction, its lock taken at once

    @pytest.fixture(autouse=True)
    def _directory(self, tmp_path: Any) -> None:
        self.directory = tmp_path
        self.made = 0

    def make_transport(self, clock: Callable[[], float], *, dedup_window: float = 0.0) -> SQLiteTransport:
        self.made += 1
        return SQLiteTransport(self.directory / f"contract-{self.made}.db", clock=clock, dedup_window=dedup_window)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_differential_against_the_reference(tmp_path: Any, seed: int) -> None:
    """The same random operations (bad input, stale leases, clock jumps,
    control plane, batches, Part 5's delays, keys, release and retry) on a SQLite file and on the reference give the
    same answers and the same errors."""
    made = []

    def make(clock: ManualClock, dedup_window: float = 0.0) -> SQLiteTransport:
        transport = SQLiteTransport(tmp_path / f"diff-{len(made)}.db", clock=clock, dedup_window=dedup_window)
        made.append(transport)
        return transport

    try:
        check_differential(make, ops=OPS, seed=seed, preserves_identity=False,
                           accepts_rebuilt_leases=True, usable_after_close=False,
                           later=True, once=True, release=True)
    finally:
        for transport in made:
            transport.close()


@pytest.mark.parametrize("seed", range(max(2, SEEDS // 3)))
def test_instances_on_one_file_are_one_transport(tmp_path: Any, seed: int) -> None:
    """The differential through two instances on one file, reopened at random:
    a lease is current on any instance opened on the same file, and the
    whole state is in the file."""
    made = []

    def make(clock: ManualClock, dedup_window: float = 0.0) -> ManyInstances:
        path = tmp_path / f"shared-{len(made)}.db"
        transport = ManyInstances(lambda: SQLiteTransport(path, clock=clock, dedup_window=dedup_window),
                                  seed=len(made))
        made.append(transport)
        return transport

    try:
        check_differential(make, ops=OPS, seed=1000 + seed, preserves_identity=False,
                           accepts_rebuilt_leases=True, usable_after_close=False,
                           later=True, once=True, release=True)
    finally:
        for transport in made:
            transport.close()
