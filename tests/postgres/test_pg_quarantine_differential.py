"""The quarantine differential (``tests/quarantine_differential.py``) on
PostgreSQL: bury, skip and peek mixed into random streams, against the
referee, on a fresh queue with an injected manual clock."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from leasequeue import PostgresTransport

from quarantine_differential import run, stress

SEEDS = int(os.environ.get("LEASEQUEUE_PG_DIFF_SEEDS", "6"))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_quarantine_against_the_reference(conninfo: str, seed: int) -> None:
    def make(clock: Any) -> PostgresTransport:
        name = f"qd_{uuid.uuid4().hex[:16]}"
        PostgresTransport.create_queue(conninfo, name)
        return PostgresTransport(conninfo, queue=name, clock=clock)

    run(make, seed)


@pytest.mark.parametrize("seed", range(2))
def test_threads_with_an_operator_lose_nothing(make_pg: Any, seed: int) -> None:
    stress(make_pg(), seed=seed)
