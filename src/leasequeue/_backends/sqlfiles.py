"""SQL kept in ``.sql`` files shipped with the package, loaded by name.

The durable backends keep their SQL out of Python strings (procrastinate's
layout): ``_backends/<backend>/schema.sql`` holds the schema as plain statements,
``_backends/<backend>/queries.sql`` the statements the code runs, each under a
``-- name: NAME --`` header followed by a one-line description.  SQLite runs
its schema statement by statement (``load_statements``); PostgreSQL runs its
schema, with its ``$$``-quoted function bodies, as one script
(``load_script``).
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Dict, List

__all__ = ["load_queries", "load_script", "load_statements"]

_HEADER = re.compile(r"^--\s*name:\s*([A-Za-z_][A-Za-z0-9_]*)\s*--\s*$", re.MULTILINE)


def _read(backend: str, filename: str) -> str:
    return (resources.files("leasequeue._backends") / backend / filename).read_text(encoding="utf-8")


def _strip_comments(sql: str) -> str:
    """Drop whole-line ``--`` comments and blank lines (not comments inside statements)."""
    return "\n".join(
        line for line in sql.splitlines() if line.strip() and not line.lstrip().startswith("--")
    ).strip()


def load_queries(backend: str, filename: str = "queries.sql") -> Dict[str, str]:
    """``{name: statement}`` from a file of named statements (trailing ``;`` removed)."""
    text = _read(backend, filename)
    parts = _HEADER.split(text)
    queries: Dict[str, str] = {}
    # parts: [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise ValueError(f"{backend}/{filename}: query {name!r} is defined twice")
        statement = _strip_comments(body).rstrip(";").strip()
        if not statement:
            raise ValueError(f"{backend}/{filename}: query {name!r} is empty")
        queries[name] = statement
    return queries


def load_statements(backend: str, filename: str = "schema.sql") -> List[str]:
    """The statements of a script file, in order, each complete (triggers included)."""
    import sqlite3  # its statement splitter; only the SQLite backend needs this

    statements: List[str] = []
    pending = ""
    for line in _strip_comments(_read(backend, filename)).splitlines():
        pending += line + "\n"
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError(f"{backend}/{filename}: incomplete statement at the end: {pending.strip()[:60]!r}")
    return statements


def load_script(backend: str, filename: str = "schema.sql") -> str:
    """A whole script file, as one string, for a server that runs it in one go."""
    return _read(backend, filename)
