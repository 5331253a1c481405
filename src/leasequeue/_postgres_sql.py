"""The PostgreSQL backend's SQL, loaded by name from ``sql/postgres/*.sql``.

procrastinate's layout: the schema (tables, indexes and the server-side
functions that make each operation one round trip) is ``schema.sql``; the
statements the client sends are ``queries.sql``, each under a
``-- name: NAME --`` header and a one-line description.  Python code never
spells SQL itself; it asks ``query(NAME)``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Dict

__all__ = ["SCHEMA_VERSION", "query", "queries", "schema"]

#: The schema version this code writes and understands (``leasequeue.meta``).
SCHEMA_VERSION = 1

_HEADER = re.compile(r"^-- name: (\w+) --\s*$", re.MULTILINE)


def _read(filename: str) -> str:
    return resources.files(__package__).joinpath("sql", "postgres", filename).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def schema() -> str:
    """The whole idempotent schema script (``schema.sql``)."""
    return _read("schema.sql")


@lru_cache(maxsize=None)
def queries() -> Dict[str, str]:
    """Every named query of ``queries.sql``: name -> SQL (comments removed)."""
    text = _read("queries.sql")
    parts = _HEADER.split(text)
    named: Dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        lines = [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("--")]
        sql = "\n".join(lines).strip().rstrip(";")
        if name in named or not sql:
            raise RuntimeError(f"queries.sql: query {name!r} is duplicated or empty")
        named[name] = sql
    return named


def query(name: str) -> str:
    """The SQL of the named query."""
    return queries()[name]
