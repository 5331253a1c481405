"""In memory there is no database (SPEC Part 5, "With the application's
data"): both twins accept no ``conn``.  Every call that takes ``conn`` on
the durable backends raises ``TypeError`` (an unexpected keyword) and
changes nothing."""

from __future__ import annotations

import sqlite3
from typing import Any, Callable

import pytest

CALLS = {
    "publish": lambda t, lease, conn: t.publish("g", "x", conn=conn),
    "publish_many": lambda t, lease, conn: t.publish_many([("g", "x")], conn=conn),
    "ack": lambda t, lease, conn: t.ack(lease, conn=conn),
    "ack_many": lambda t, lease, conn: t.ack_many([lease], conn=conn),
    "nack": lambda t, lease, conn: t.nack(lease, conn=conn),
    "bury": lambda t, lease, conn: t.bury(lease, conn=conn),
    "release": lambda t, lease, conn: t.release(lease, conn=conn),
}


@pytest.mark.parametrize("call", list(CALLS.values()), ids=list(CALLS))
def test_the_in_memory_transports_accept_no_conn(transport: Any, call: Callable[[Any, Any, Any], Any]) -> None:
    transport.publish("g", "e")
    lease = transport.claim("w", 30.0)
    before = tuple(transport.stats())
    conn = sqlite3.connect(":memory:")
    try:
        with pytest.raises(TypeError, match="conn"):
            call(transport, lease, conn)
    finally:
        conn.close()
    assert tuple(transport.stats()) == before
    transport.ack(lease)  # still current
