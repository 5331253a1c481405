"""Operations on the application's own connection (``conn=``).

``PostgresTransport``'s writes (``publish``, ``publish_many``, ``ack``,
``ack_many``, ``nack``, ``bury``, ``release``; ``apublish`` / ``aack`` on an
``AsyncConnection``) take a keyword ``conn``: the statement then runs on that
connection, inside the transaction the application holds (or the one
psycopg opens implicitly), so its effects exist for everyone else exactly
when the application commits.  This module checks such a connection and
runs one statement on it.  The rules (docs/decisions.md, "Transactions
(conn=), pinned"):

* the transport never commits, rolls back or changes a setting of the
  connection (autocommit, isolation, ``prepare_threshold``, row factory):
  it runs one statement on a cursor of its own, with the tuple row factory;
* a connection of the wrong kind, or a closed one, is a ``TypeError`` /
  ``ValueError`` before anything is sent;
* the first use of a connection checks, inside the application's
  transaction, that it reaches the transport's database (the cluster's
  system identifier and the database's oid) and that the queue is still
  there; a connection to another database raises ``ValueError``, one whose
  database has no leasequeue schema or no such queue ``QueueNotFound``.
  The check is remembered for the connection's life;
* every other error of the database reaches the caller as psycopg's own
  exception (``InFailedSqlTransaction`` for a transaction that had already
  failed, ``SerializationFailure``, ...), so the application's own retry
  logic sees what it expects; the statement changed nothing.
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any, Dict, List, Sequence, Tuple

import psycopg
from psycopg.rows import tuple_row

from ..._errors import QueueNotFound

__all__ = ["AppConnections", "check_async_conn", "check_conn", "in_app_tx", "IDENTITY_SQL"]

#: The database a connection reaches: (cluster system identifier, database oid).
IDENTITY_SQL = (
    "SELECT (SELECT system_identifier FROM pg_control_system()), "
    "(SELECT oid FROM pg_database WHERE datname = current_database())"
)

# The same, and whether the queue (id and name) is there; run in the
# application's transaction on a connection's first use.
_VERIFY_SQL = (
    "SELECT (SELECT system_identifier FROM pg_control_system()), "
    "(SELECT oid FROM pg_database WHERE datname = current_database()), "
    "EXISTS (SELECT 1 FROM leasequeue.queues WHERE id = %s AND name = %s)"
)

_CALL = re.compile(r"(leasequeue\.\w+)\(%s")
_MARKED: Dict[str, str] = {}


def in_app_tx(sql: str) -> str:
    """The named query ``sql`` (a call ``leasequeue.f(%s, ...)`` whose first
    argument is the queue) with its queue passed through
    ``leasequeue.app_tx``, which marks the transaction as the application's
    before ``f`` runs (schema.sql, ``announce``: no shared listen lock
    held until the application's commit)."""
    marked = _MARKED.get(sql)
    if marked is None:
        marked, n = _CALL.subn(r"\1(leasequeue.app_tx(%s)", sql, count=1)
        if n != 1:  # a packaging error: every write is such a call
            raise AssertionError(f"not a leasequeue call: {sql!r}")
        _MARKED[sql] = marked
    return marked


_NO_SCHEMA = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName)


def check_conn(conn: Any, what: str) -> Any:
    """``conn=`` of a synchronous method: None, or an open psycopg ``Connection``."""
    if conn is None:
        return None
    if isinstance(conn, psycopg.AsyncConnection):
        raise TypeError(f"{what}: conn is a psycopg AsyncConnection: pass it to a{what}() (or give {what}() a "
                        "psycopg.Connection)")
    if not isinstance(conn, psycopg.Connection):
        hint = ""
        if type(conn).__module__.startswith("sqlalchemy"):
            hint = " (with SQLAlchemy's psycopg dialect: session.connection().connection.driver_connection)"
        raise TypeError(f"{what}: conn must be a psycopg.Connection (psycopg 3), not {type(conn).__name__}{hint}")
    if conn.closed:
        raise ValueError(f"{what}: conn is closed")
    return conn


def check_async_conn(conn: Any, what: str) -> Any:
    """``conn=`` of ``apublish`` / ``aack``: None, or an open psycopg ``AsyncConnection``."""
    if conn is None:
        return None
    if isinstance(conn, psycopg.Connection):
        raise TypeError(f"{what}: conn is a synchronous psycopg Connection: pass it to {what[1:]}(), "
                        f"or give {what}() a psycopg.AsyncConnection")
    if not isinstance(conn, psycopg.AsyncConnection):
        raise TypeError(f"{what}: conn must be a psycopg.AsyncConnection (psycopg 3), not {type(conn).__name__}")
    if conn.closed:
        raise ValueError(f"{what}: conn is closed")
    return conn


class AppConnections:
    """Runs statements on application connections for one transport.

    ``identity``: the transport's database, as ``IDENTITY_SQL`` reads it;
    ``queue_id`` / ``queue_name``: its queue.  Connections that passed the
    check are remembered (weakly: a closed and collected connection is
    forgotten).
    """

    def __init__(self, identity: Tuple[Any, Any], queue_id: int, queue_name: str) -> None:
        self._identity = (int(identity[0]), int(identity[1]))
        self._queue_id = queue_id
        self._name = queue_name
        self._known: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _judge(self, what: str, row: Any) -> None:
        if row is None or (int(row[0]), int(row[1])) != self._identity:
            raise ValueError(f"{what}: conn reaches another database than the transport's (conninfo)")
        if not row[2]:
            raise QueueNotFound(f"queue {self._name!r} does not exist in the database of conn (it was dropped)")

    def _remember(self, conn: Any) -> None:
        with self._lock:
            self._known[conn] = True

    def _is_known(self, conn: Any) -> bool:
        with self._lock:
            return conn in self._known

    def run(self, conn: Any, what: str, sql: str, params: Sequence[Any]) -> List[Tuple[Any, ...]]:
        """One statement on ``conn``'s transaction; its rows."""
        try:
            with conn.cursor(row_factory=tuple_row) as cur:
                if not self._is_known(conn):
                    cur.execute(_VERIFY_SQL, (self._queue_id, self._name))
                    self._judge(what, cur.fetchone())
                    self._remember(conn)
                cur.execute(sql, params)
                return cur.fetchall()
        except _NO_SCHEMA as exc:
            raise QueueNotFound(
                f"{what}: the database of conn has no leasequeue schema (run "
                f"leasequeue.PostgresTransport.install there): {str(exc).strip()}"
            ) from exc

    async def arun(self, conn: Any, what: str, sql: str, params: Sequence[Any]) -> List[Tuple[Any, ...]]:
        """``run`` on an ``AsyncConnection``."""
        try:
            async with conn.cursor(row_factory=tuple_row) as cur:
                if not self._is_known(conn):
                    await cur.execute(_VERIFY_SQL, (self._queue_id, self._name))
                    self._judge(what, await cur.fetchone())
                    self._remember(conn)
                await cur.execute(sql, params)
                return await cur.fetchall()
        except _NO_SCHEMA as exc:
            raise QueueNotFound(
                f"{what}: the database of conn has no leasequeue schema (run "
                f"leasequeue.PostgresTransport.install there): {str(exc).strip()}"
            ) from exc
