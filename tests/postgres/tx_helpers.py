"""Helpers of the transaction tests (``test_pg_transactions*.py``): what
another process sees, asked of a real child interpreter on its own
connection (never this process's transport or connections)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional

import psycopg

LIVENESS = 30.0

# A child that opens the queue and does one thing: "claim" (a claim that
# never waits), "stats", or "count" (rows of an application table).
_OTHER = r"""
import json, sys
from leasequeue import PostgresTransport
conninfo, queue, what, arg = sys.argv[1:5]
with PostgresTransport(conninfo, queue=queue) as t:
    if what == "claim":
        lease = t.claim("other", float(arg))
        out = None if lease is None else {"seq": lease.seq, "group_id": lease.group_id, "event": lease.event,
                                          "attempt": lease.attempt}
    elif what == "stats":
        out = list(t.stats())
    else:
        out = None
print(json.dumps(out), flush=True)
"""


def child_env() -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def other(conninfo: str, queue: str, what: str, arg: str = "30") -> Any:
    """What another process gets: ``claim`` (a lease as a dict, or None) or ``stats`` (a list)."""
    proc = subprocess.run([sys.executable, "-c", _OTHER, conninfo, queue, what, arg], env=child_env(),
                          capture_output=True, text=True, timeout=LIVENESS)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def other_claim(conninfo: str, queue: str, visibility: float = 30.0) -> Optional[Dict[str, Any]]:
    return other(conninfo, queue, "claim", repr(visibility))  # type: ignore[no-any-return]


def app_table(conninfo: str) -> str:
    """A new application table ``(id int primary key, state text)``; its name."""
    import uuid

    name = f"app_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, state text NOT NULL)")
    return name


def app_rows(conninfo: str, table: str) -> List[Any]:
    """The table's rows as another connection sees them (committed ones)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(f"SELECT id, state FROM {table} ORDER BY id").fetchall()]
