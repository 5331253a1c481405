"""SQL kept in ``.sql`` files shipped with the package, loaded by name.

The durable backends keep their SQL out of Python strings (procrastinate's
layout): ``_backends/<backend>/schema.sql`` holds the schema as plain statements,
``_backends/<backend>/queries.sql`` the statements the code runs, each under a
``-- name: NAME --`` header followed by a one-line description.  SQLite runs
its schema statement by statement (``load_statements``); PostgreSQL runs its
schema, with its ``$$``-quoted function bodies, as one script
(``load_script``).  ``_backends/<backend>/migrations/NNNN_name.sql`` are the
numbered migrations: file ``NNNN`` upgrades schema version ``NNNN - 1`` to
``NNNN`` (``load_migrations``).
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, Dict, List, Tuple

__all__ = ["load_migrations", "load_queries", "load_script", "load_statements"]

_MIGRATION = re.compile(r"^([0-9]{4})_[A-Za-z0-9_]+\.sql$")
_HEADER = re.compile(r"^--\s*name:\s*([A-Za-z_][A-Za-z0-9_]*)\s*--\s*$", re.MULTILINE)


def _folder(backend: str) -> Any:
    """Where a backend's SQL files are (a ``Traversable``)."""
    return resources.files("leasequeue._backends") / backend


def _read(backend: str, filename: str) -> str:
    path = _folder(backend)
    for part in filename.split("/"):
        path = path / part
    return path.read_text(encoding="utf-8")


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


def load_migrations(backend: str) -> List[Tuple[int, str]]:
    """``[(version, filename), ...]`` of ``_backends/<backend>/migrations/``, by
    version: ``filename`` (``migrations/NNNN_name.sql``, for ``load_script``
    or ``load_statements``) upgrades version ``version - 1`` to ``version``.
    Two files of one version, or a file whose name does not follow the
    pattern, are a packaging error (``ValueError``)."""
    folder = _folder(backend) / "migrations"
    found: Dict[int, str] = {}
    if folder.is_dir():
        for entry in folder.iterdir():
            name = entry.name
            if not name.endswith(".sql"):
                continue
            match = _MIGRATION.match(name)
            if match is None:
                raise ValueError(f"{backend}/migrations/{name}: not a migration name (NNNN_name.sql)")
            version = int(match.group(1))
            if version in found:
                raise ValueError(f"{backend}/migrations: two migrations to version {version}")
            found[version] = "migrations/" + name
    return sorted(found.items())


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
