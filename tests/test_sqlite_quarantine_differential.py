"""The quarantine differential (``quarantine_differential.py``) on SQLite:
bury, skip and peek mixed into random streams, against the referee."""

from __future__ import annotations

import os
from typing import Any

import pytest

from leasequeue import SQLiteTransport

from quarantine_differential import run, stress

SEEDS = int(os.environ.get("LEASEQUEUE_SQLITE_DIFF_SEEDS", "12"))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_quarantine_against_the_reference(tmp_path: Any, seed: int) -> None:
    run(lambda clock: SQLiteTransport(tmp_path / "q.db", clock=clock), seed)


@pytest.mark.parametrize("seed", range(2))
def test_threads_with_an_operator_lose_nothing(tmp_path: Any, seed: int) -> None:
    with SQLiteTransport(tmp_path / "q.db") as t:
        stress(t, seed=seed)
